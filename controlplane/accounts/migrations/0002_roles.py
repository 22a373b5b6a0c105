"""Create the three role groups and a default shadow-mode policy."""

from django.db import migrations

ROLES = ("viewer", "operator", "admin")


def create(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)
    Policy = apps.get_model("replication", "Policy")
    if not Policy.objects.exists():
        Policy.objects.create(name="default", active=True, mode="shadow")


def remove(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("replication", "0001_initial"),
    ]
    operations = [migrations.RunPython(create, remove)]
