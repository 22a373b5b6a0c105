from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('replication', '0010_policy_strategy'),
    ]

    operations = [
        migrations.AddField(
            model_name='planitem',
            name='value_terms',
            field=models.JSONField(blank=True, default=dict, help_text="the value model's terms, uncorrected (core.policy.value): what its outcome is measured against"),
        ),
    ]
