"""Agents enrol, report residency atomically, and are held to their own node."""

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken, EnrolmentToken
from controlplane.fleet.models import Engine, Gpu, Node

from .helpers import report

K = [f"{i:016x}" for i in range(1, 6)]


def lookup(client, keys):
    resp = client.post("/api/residency/lookup/", {"keys": keys}, format="json")
    assert resp.status_code == 200, resp.content
    return [(h["engine_name"], h["depth"], h["tier"]) for h in resp.json()["holders"]]


def test_enrolment_token_is_single_use_and_token_stored_hashed(db):
    _, raw = EnrolmentToken.issue()
    first = APIClient().post(
        "/api/agents/enrol/", {"enrolment_token": raw, "hostname": "n1"}, format="json"
    )
    assert first.status_code == 201
    agent_token = first.json()["agent_token"]
    assert not ApiToken.objects.filter(digest=agent_token).exists()  # only the hash is stored
    again = APIClient().post(
        "/api/agents/enrol/", {"enrolment_token": raw, "hostname": "n2"}, format="json"
    )
    assert again.status_code == 403 and again.json()["field"] == "enrolment_token"
    assert Node.objects.count() == 1


def test_expired_enrolment_token_is_refused(db):
    token, raw = EnrolmentToken.issue(ttl_s=60)
    EnrolmentToken.objects.filter(pk=token.pk).update(expires_at="2000-01-01T00:00:00Z")
    resp = APIClient().post(
        "/api/agents/enrol/", {"enrolment_token": raw, "hostname": "n1"}, format="json"
    )
    assert resp.status_code == 403


def test_report_applies_residency_and_lookup_finds_longest_prefix(enrol, client_for):
    _, agent = enrol("node-a")
    stored = [(K[0], None, "GPU"), (K[1], K[0], "GPU"), (K[2], K[1], "GPU")]
    resp = agent.post("/api/agents/report/", report(1, stored, mode="snapshot"), format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["applied_seq"] == 1 and resp.json()["snapshot_requested"] == []
    viewer = client_for("viewer")
    assert lookup(viewer, K[:4]) == [("vllm-0", 3, "GPU")]
    agent.post("/api/agents/report/", report(2, removed=[(K[2], "GPU")]), format="json")
    assert lookup(viewer, K[:4]) == [("vllm-0", 2, "GPU")]
    gpu = Gpu.objects.get(uuid="GPU-aaa")
    assert gpu.memory_used == 70 * 2**30
    assert list(Engine.objects.get().gpus.all()) == [gpu]


def test_delta_before_any_snapshot_asks_for_one(enrol):
    _, agent = enrol()
    resp = agent.post("/api/agents/report/", report(1, [(K[0], None, "GPU")]), format="json")
    assert resp.json()["snapshot_requested"] == ["vllm-0"]


def test_replayed_or_out_of_order_seq_is_409_and_changes_nothing(enrol, client_for):
    _, agent = enrol()
    agent.post(
        "/api/agents/report/", report(5, [(K[0], None, "GPU")], mode="snapshot"), format="json"
    )
    for seq in (5, 3):
        resp = agent.post("/api/agents/report/", report(seq, [(K[1], K[0], "GPU")]), format="json")
        assert resp.status_code == 409
        assert resp.json()["error"] == "stale_seq" and resp.json()["last_seq"] == 5
    assert lookup(client_for("viewer"), K[:2]) == [("vllm-0", 1, "GPU")]


def test_restarted_agent_may_restart_seq_with_a_snapshot(enrol):
    _, agent = enrol()
    agent.post(
        "/api/agents/report/", report(9, [(K[0], None, "GPU")], mode="snapshot"), format="json"
    )
    resp = agent.post(
        "/api/agents/report/",
        report(1, [(K[1], None, "GPU")], mode="snapshot", boot="boot-2"),
        format="json",
    )
    assert resp.status_code == 200
    resp = agent.post(
        "/api/agents/report/", report(1, [(K[2], None, "GPU")], boot="boot-2"), format="json"
    )
    assert resp.status_code == 409  # a delta cannot reset the sequence


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.pop("seq"), "seq"),
        (lambda r: r.update(seq="7"), "seq"),
        (
            lambda r: r["residency"][0]["stored"].append(["zz", None, "GPU"]),
            "residency[0].stored[1][0]",
        ),
        (
            lambda r: r["residency"][0]["stored"].append([K[3], None, "HBM"]),
            "residency[0].stored[1][2]",
        ),
        (lambda r: r["residency"][0].update(engine_id="nope"), "residency[0].engine_id"),
        (lambda r: r["gpus"][0].update(memory_used=-1), "gpus[0].memory_used"),
        (lambda r: r["engines"][0].update(block_size=0), "engines[0].block_size"),
    ],
)
def test_malformed_report_names_the_field_and_changes_nothing(enrol, client_for, mutate, field):
    _, agent = enrol()
    body = report(1, [(K[0], None, "GPU")], mode="snapshot")
    mutate(body)
    resp = agent.post("/api/agents/report/", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["field"] == field
    assert Node.objects.get().last_seq == 0
    assert not Engine.objects.exists() and not Gpu.objects.exists()
    assert lookup(client_for("viewer"), K[:1]) == []


def test_malformed_json_and_oversized_body(enrol, settings):
    _, agent = enrol()
    resp = agent.post("/api/agents/report/", b"{not json", content_type="application/json")
    assert resp.status_code == 400 and resp.json()["error"] == "parse_error"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    big = report(1, [(f"{i:016x}", None, "GPU") for i in range(1, 200)], mode="snapshot")
    resp = agent.post("/api/agents/report/", big, format="json")
    assert resp.status_code == 413


def test_msgpack_report_with_integer_keys(enrol, client_for):
    import msgpack

    _, agent = enrol()
    body = report(1, [(1, None, "GPU"), (2, 1, "GPU")], mode="snapshot")
    resp = agent.post(
        "/api/agents/report/", msgpack.packb(body), content_type="application/msgpack"
    )
    assert resp.status_code == 200, resp.content
    assert lookup(client_for("viewer"), K[:2]) == [("vllm-0", 2, "GPU")]


def test_agent_cannot_touch_another_nodes_engine_or_operator_api(enrol):
    _, agent_a = enrol("node-a")
    _, agent_b = enrol("node-b")
    agent_a.post(
        "/api/agents/report/", report(1, [(K[0], None, "GPU")], mode="snapshot"), format="json"
    )
    engine = Engine.objects.get(node__name="node-a")
    resp = agent_b.post(
        f"/api/engines/{engine.pk}/lifecycle/", {"lifecycle": "draining"}, format="json"
    )
    assert resp.status_code == 403
    engine.refresh_from_db()
    assert engine.lifecycle != "draining"
    assert agent_a.get("/api/plans/").status_code == 403
    # Request records (its request taps): for its own engines only, all or nothing.
    rec = {"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"], "cached_tokens": 0}
    own, other = {**rec, "engine": "node-a/vllm-0"}, {**rec, "engine": "node-b/vllm-0"}
    resp = agent_a.post("/api/request-records/", {"records": [own, other]}, format="json")
    assert resp.status_code == 403 and resp.json()["field"] == "records[1].engine"
    resp = agent_a.post("/api/request-records/", {"records": [own]}, format="json")
    assert resp.status_code == 200 and resp.json()["accepted"] == 1


def test_gpu_of_another_node_is_refused(enrol):
    _, agent_a = enrol("node-a")
    _, agent_b = enrol("node-b")
    agent_a.post("/api/agents/report/", report(1), format="json")
    resp = agent_b.post("/api/agents/report/", report(1), format="json")
    # Refused for that GPU only (tests/security/test_agent_identity.py has the rest).
    assert resp.status_code == 200 and resp.json()["gpus_refused"] == ["GPU-aaa"]


def test_gpu_without_uuid_marks_the_known_gpu_at_that_index_lost(enrol):
    _, agent = enrol()
    agent.post("/api/agents/report/", report(1, mode="snapshot"), format="json")
    lost = [{"index": 0, "uuid": None, "errors": {"device": "GPU is lost"}}]
    resp = agent.post("/api/agents/report/", report(2, gpus=lost), format="json")
    assert resp.status_code == 200, resp.content
    gpu = Gpu.objects.get()
    assert gpu.lost and gpu.errors == {"device": "GPU is lost"}


def test_published_residency_delta_survives_the_redis_layer_serializer(enrol, settings):
    # channels_redis packs messages with msgpack and unpacks with strict_map_key: an integer map
    # key closed every dashboard socket with 1011 under PostgreSQL + Redis (found by bench/load.py).
    import msgpack
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from controlplane.realtime import groups

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(groups.CLUSTER, channel)
    _, agent = enrol("node-a")
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        assert (
            agent.post(
                "/api/agents/report/",
                report(1, stored=[(1, None, "GPU", 0)], mode="snapshot"),
                format="json",
            ).status_code
            == 200
        )
    message = async_to_sync(layer.receive)(channel)
    assert message["event"] == "residency.delta"
    assert msgpack.unpackb(msgpack.packb(message), strict_map_key=True) == message


def test_unchanged_gpu_and_engine_rows_are_not_rewritten_but_changes_land_at_once(enrol):
    _, agent = enrol()
    assert (
        agent.post("/api/agents/report/", report(1, mode="snapshot"), format="json").status_code
        == 200
    )
    gpu, engine = Gpu.objects.get(), Engine.objects.get()
    assert agent.post("/api/agents/report/", report(2), format="json").status_code == 200
    assert Gpu.objects.get().updated_at == gpu.updated_at  # same values: no write
    assert Engine.objects.get().last_seen == engine.last_seen  # within ENGINE_SEEN_S
    changed = report(3)
    changed["gpus"][0]["memory_used"] = 71 * 2**30
    changed["engines"][0]["kv_capacity_blocks"] = 12_000
    assert agent.post("/api/agents/report/", changed, format="json").status_code == 200
    gpu_after, engine_after = Gpu.objects.get(), Engine.objects.get()
    assert gpu_after.memory_used == 71 * 2**30 and gpu_after.updated_at > gpu.updated_at
    assert engine_after.kv_capacity_blocks == 12_000 and engine_after.last_seen > engine.last_seen
    assert list(engine_after.gpus.values_list("uuid", flat=True)) == ["GPU-aaa"]
