"""Migrations: from an empty database to head, and from each app's first migration to head and
back again with data present (there is no earlier release yet; this is the path one will take)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
APPS = ["accounts", "audit", "fleet", "demand", "forecasting", "replication"]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def test_every_model_change_has_a_migration():
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_initial_state_to_head_and_back_with_data():
    executor = MigrationExecutor(connection)
    head = executor.loader.graph.leaf_nodes()
    initial = [(app, "0001_initial") for app in APPS]
    # Back to each app's first migration (the oldest schema there is), with rows in it.
    executor = _migrate(initial)
    apps = executor.loader.project_state(initial).apps
    Node = apps.get_model("fleet", "Node")
    node = Node.objects.create(name="kept-across-migrations")
    apps.get_model("audit", "AuditEvent").objects.create(
        actor_label="system", action="x", object_type="t"
    )
    # Forward to head: the rows survive and the new columns have their defaults.
    executor = _migrate(head)
    apps = executor.loader.project_state(head).apps
    assert apps.get_model("fleet", "Node").objects.get(pk=node.pk).name == "kept-across-migrations"
    assert apps.get_model("audit", "AuditEvent").objects.count() == 1
    # And back again: every migration is reversible with data present.
    _migrate(initial)
    assert Node.objects.filter(pk=node.pk).exists()
    _migrate(head)


def test_durations_renamed_to_s_keep_their_columns_and_values():
    """replication 0013 renames the policy's duration fields (``horizon_seconds`` ->
    ``horizon_s``) in the state only: the columns, their values and the range constraints stay."""
    before = [("replication", "0012_policy_knobs")]
    apps = _migrate(before).loader.project_state(before).apps
    old = apps.get_model("replication", "Policy").objects.create(
        name="kept", horizon_seconds=123, max_queue_seconds=None, plan_every_seconds=7
    )
    head = MigrationExecutor(connection).loader.graph.leaf_nodes()
    apps = _migrate(head).loader.project_state(head).apps
    new = apps.get_model("replication", "Policy").objects.get(pk=old.pk)
    assert (new.horizon_s, new.max_queue_s, new.plan_every_s) == (123, None, 7)
    with connection.cursor() as cursor:
        columns = {
            c.name
            for c in connection.introspection.get_table_description(cursor, "replication_policy")
        }
        constraints = connection.introspection.get_constraints(cursor, "replication_policy")
    assert {"horizon_seconds", "max_queue_seconds", "plan_every_seconds"} <= columns
    assert "horizon_s" not in columns and "horizon_seconds_range" in constraints
    _migrate(before)
    assert apps.get_model("replication", "Policy").objects.filter(pk=old.pk).exists()
    _migrate(head)
