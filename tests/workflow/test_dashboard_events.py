"""Every event the services send to the dashboard groups has exactly its type's keys
(``controlplane/realtime/events.py``), spelled as the wire spells them (``job_id``, not ``job``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from controlplane.realtime import events, groups
from controlplane.realtime import publish as publish_module
from controlplane.replication.models import ReplicationJob
from harness import burst
from tests.workflow.test_workflow import finish, run_cycle
from wire import protocol

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_GROUP_NAMES = {"CLUSTER", "JOBS", "PLANS"}


def test_each_constructor_gives_exactly_its_fields():
    built = [
        events.residency_delta(1, {"2": {"stored": 1, "removed": 0, "mode": "delta"}}, [], 1.0),
        events.node_stale(1),
        events.engine_readiness({"2": 0.5}),
        events.plan_created(3, "auto", "proposed", 4),
        events.plan_decided(3, "approved"),
        events.job_update("j", "running", 1, 10, "", "why"),
    ]
    assert {e.name for e in built} == set(events.FIELDS)  # one constructor per event type
    for e in built:
        assert tuple(e.payload) == events.FIELDS[e.name], e.name
        assert e.group in groups.DASHBOARD_GROUPS


@pytest.mark.parametrize(
    "payload",
    [
        {
            "job_id": "j",
            "state": "running",
            "attempt": 1,
            "bytes_done": 0,
            "error": "",
        },  # no detail
        {"job": "j", "state": "running", "attempt": 1, "bytes_done": 0, "error": "", "detail": ""},
        {
            "job_id": "j",
            "state": "running",
            "attempt": 1,
            "bytes_done": 0,
            "error": "",
            "detail": "",
            "job": "j",  # the old spelling beside the new: one key per concept
        },
    ],
)
def test_a_missing_or_extra_key_is_refused(payload):
    with pytest.raises(events.EventShapeError):
        events.check(protocol.EVENT_JOB_UPDATE, payload)


def test_an_unknown_dashboard_event_is_refused():
    with pytest.raises(events.EventShapeError):
        events.check("job.progress", {"job_id": "j"})


def _dashboard_sends_outside_events(path: Path) -> list[str]:
    """``publish(groups.CLUSTER | JOBS | PLANS, ...)`` or ``send_now(...)`` written by hand."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        first = node.args[0]
        if (
            name in ("publish", "send_now")
            and isinstance(first, ast.Attribute)
            and first.attr in DASHBOARD_GROUP_NAMES
        ):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_dashboard_events_are_built_only_by_their_constructors():
    found = [
        hit
        for package in ("controlplane", "frontend")
        for path in sorted((ROOT / package).rglob("*.py"))
        for hit in _dashboard_sends_outside_events(path)
    ]
    assert found == [], "send dashboard events with publish_event(events.<type>(...))"


def test_the_workflow_sends_only_well_shaped_dashboard_events(fleet, monkeypatch):
    sent: list[tuple[str, str, dict]] = []
    real = publish_module.send_now

    def record(group, message_type, payload):
        sent.append((group, message_type, payload))
        real(group, message_type, payload)

    monkeypatch.setattr(publish_module, "send_now", record)
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.get(item__plan=plan)
    finish(fleet, job)
    fleet.report("node-b", burst.PREFIX, seq=2)
    dashboard = [(name, payload) for g, name, payload in sent if g in groups.DASHBOARD_GROUPS]
    seen = {name for name, _ in dashboard}
    assert {"plan.created", "job.update", "residency.delta"} <= seen, seen
    for name, payload in dashboard:
        assert tuple(payload) == events.FIELDS[name], (name, payload)
    updates = [p for name, p in dashboard if name == "job.update"]
    assert {p["job_id"] for p in updates} == {str(job.pk)}
    assert [p["state"] for p in updates][-1] == "landed"
