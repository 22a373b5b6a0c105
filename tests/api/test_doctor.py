"""The fleet doctor through the control plane: what agents report reaches the API, the
Prometheus series and ``manage.py doctor`` (exit status 0 healthy, 1 with findings)."""

import pytest
from django.core.management import call_command

from controlplane.core import doctor as d
from controlplane.replication.models import Policy
from harness import fleet_seed as cluster


def facts(topic="", block_size=32):
    return {
        "cache_config": {"block_size": str(block_size), "prefix_caching_hash_algo": "sha256"},
        "topic": topic,
        "replay_answered": True,
        "roots": {"00000000000000aa": "1111111111111111"},
    }


def send(agent, seq, node, docs, transports=("warmup",)):
    body = cluster.report(seq, node, engines=len(docs))
    for engine, doc in zip(body["engines"], docs, strict=True):
        engine["block_size"] = 32
        engine["doctor"] = doc
    body["transports"] = list(transports)
    resp = agent.post("/api/agents/report/", body, format="json")
    assert resp.status_code == 200, resp.content


def run_command():
    with pytest.raises(SystemExit) as exited:
        call_command("doctor")
    return exited.value.code


def test_findings_in_the_api_metrics_and_command(enrol, client_for, capsys):
    _, agent = enrol("node-a")
    send(agent, 1, "node-a", [facts(), facts()])
    viewer = client_for("viewer")
    assert viewer.get("/api/doctor/").json() == {"healthy": True, "findings": []}
    call_command("doctor")  # healthy: returns, exit status 0
    assert "healthy" in capsys.readouterr().out

    send(agent, 2, "node-a", [facts(topic="kv"), facts(block_size=16)])
    body = viewer.get("/api/doctor/").json()
    assert body["healthy"] is False
    got = {(f["check"], f["subject"]) for f in body["findings"]}
    assert got == {
        (d.BLOCK_SIZE_MISMATCH, "llama-3.1-70b"),
        (d.TOPIC_DROPPED, "node-a/vllm-0"),
        (d.BLOCK_SIZE_WRONG, "node-a/vllm-1"),
    }
    assert all(f["setting"] for f in body["findings"])
    metrics = viewer.get("/api/metrics/").content.decode()
    assert f'prewarm_doctor_findings{{check="{d.TOPIC_DROPPED}"}} 1.0' in metrics
    assert f'prewarm_doctor_findings{{check="{d.EVENTS_NONE}"}} 0.0' in metrics
    assert run_command() == 1
    out = capsys.readouterr().out
    assert "topic_dropped [node-a/vllm-0]" in out and "change: set block_size = 16" in out


def test_a_policy_transport_the_node_does_not_run(enrol, client_for):
    _, agent = enrol("node-a")
    send(agent, 1, "node-a", [facts()], transports=("tcp",))
    Policy.objects.filter(active=True).update(mode="auto", default_transport="warmup")
    viewer = client_for("viewer")
    got = viewer.get("/api/doctor/").json()["findings"]
    assert [(f["check"], f["subject"]) for f in got] == [(d.TRANSPORT_MISSING, "node-a")]
    Policy.objects.filter(active=True).update(mode="shadow")  # moves nothing: cannot fail
    assert viewer.get("/api/doctor/").json()["healthy"]
