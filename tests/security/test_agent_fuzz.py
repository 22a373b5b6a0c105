"""Every agent endpoint and the agent socket, fed arbitrary documents (JSON and msgpack): never a
5xx, nothing written on a 4xx, and the socket answers ``{"type": "error"}`` and stays open.

Deterministic (``derandomize``) and small, so the suite stays fast and CI never flakes."""

from __future__ import annotations

import json
import math

import msgpack
import pytest
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controlplane.asgi import application
from controlplane.audit.models import AuditEvent
from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.fleet.models import Engine, Gpu, Node
from tests.api.helpers import report

FUZZ = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JOB = "00000000-0000-4000-8000-000000000000"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=8),
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4)
    ),
    max_leaves=20,
)
deep = st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n)


def _report_with(doc) -> dict:
    """A valid report whose free-form and typed fields are replaced by ``doc`` in turn."""
    body = report(2)
    body["gpus"][0]["pcie"] = doc
    body["engines"][0]["metrics"] = {"x": doc}
    return body


def _event_with(doc) -> dict:
    return {"type": "job.progress", "job_id": JOB, "bytes_done": doc, "checksum": doc}


BODIES = {
    "/api/agents/enrol/": lambda doc: {"enrolment_token": doc, "hostname": "h", "labels": doc},
    "/api/agents/report/": _report_with,
    "/api/agents/heartbeat/": lambda doc: {"boot_id": doc, "sent_at": doc},
    "/api/agents/rotate-token/": lambda doc: doc,
    f"/api/agents/jobs/{JOB}/events/": _event_with,
    "/api/request-records/": lambda doc: {
        "records": [{"time": doc, "model": "m", "tenant": "t", "keys": ["01"], "ttft_s": doc}]
    },
}


def _encode(body, kind: str) -> tuple[bytes, str] | None:
    if kind == "json":
        try:
            return json.dumps(body, allow_nan=True).encode(), "application/json"
        except (TypeError, ValueError):  # bytes or int keys: send them as msgpack instead
            return None
    try:
        return msgpack.packb(body, use_bin_type=True), "application/msgpack"
    except (TypeError, ValueError, OverflowError):
        return None


def fingerprint() -> tuple:
    return (
        Node.objects.count(),
        list(Node.objects.values_list("last_seq", "labels", "state")),
        Gpu.objects.count(),
        list(Engine.objects.values_list("metrics", flat=True)),
        WorkloadKey.objects.count(),
        DemandBucket.objects.count(),
        AuditEvent.objects.exclude(action="node.enrol_refused").count(),
    )


@pytest.fixture
def agent(enrol):
    _, client = enrol("node-f")
    assert client.post("/api/agents/report/", report(1), format="json").status_code == 200
    return client


# Tried first on every endpoint in both encodings, whatever Hypothesis draws after them: each of
# these was a 500 somewhere (a report's metrics or pcie, a job event's bytes_done).
KNOWN = [math.nan, math.inf, b"x", 10**30, "abc", {"a": [1, {"b": -math.inf}]}, 2**63]


def _known(test):
    for doc in reversed(KNOWN):
        test = example(doc=doc)(test)
    return test


@pytest.mark.parametrize("path", sorted(BODIES))
@pytest.mark.parametrize("kind", ["json", "msgpack"])
@FUZZ
@_known
@given(doc=documents)
def test_agent_endpoints_answer_4xx_and_change_nothing(agent, path, kind, doc):
    encoded = _encode(BODIES[path](doc), kind)
    if encoded is None:
        return
    data, ctype = encoded
    before = fingerprint()
    resp = agent.generic("POST", path, data, content_type=ctype)
    assert resp.status_code < 500, (path, resp.content[:300])
    if 400 <= resp.status_code < 500:
        assert fingerprint() == before, (path, resp.status_code)


@pytest.mark.parametrize("path", sorted(set(BODIES) - {"/api/agents/rotate-token/"}))  # no body
@FUZZ
@given(text=deep)
def test_deeply_nested_json_is_a_400(agent, path, text):
    before = fingerprint()
    resp = agent.generic("POST", path, text.encode(), content_type="application/json")
    assert 400 <= resp.status_code < 500, (path, resp.content[:200])
    assert fingerprint() == before


def _frame(doc, kind: str) -> dict | None:
    msg = {"type": "job.result", "job_id": JOB, "state": doc, "bytes": doc, "confirmation": doc}
    encoded = _encode(msg, kind)
    if encoded is None:
        return None
    return {"text_data": encoded[0].decode()} if kind == "json" else {"bytes_data": encoded[0]}


@pytest.mark.django_db(transaction=True)
async def test_the_socket_answers_an_error_and_stays_open(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from channels.db import database_sync_to_async

    from harness.fleet_seed import enrol

    _node, token = await database_sync_to_async(enrol)("node-s")
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    frames = [
        {"text_data": "[" * 5000 + "]" * 5000},
        {"text_data": '{"type": "job.ack", "job_id": NaN}'},
        {"bytes_data": b"\xc1\xff"},
        {"bytes_data": msgpack.packb({1: b"x", "type": "job.ack"})},
    ]
    # The socket's cases: each kind of value the HTTP properties found refused.
    for doc in [math.inf, 10**30, "abc", {"a": [1, {"b": b"x"}]}, -1, 2**63]:
        for kind in ("json", "msgpack"):
            if (frame := _frame(doc, kind)) is not None:
                frames.append(frame)
    try:
        assert (await comm.connect())[0]
        for frame in frames:
            await comm.send_to(**frame)
            answer = await comm.receive_json_from(timeout=5)
            assert answer["type"] == "error", (frame, answer)
        # Still open and serving: a well-formed event is answered on its merits.
        await comm.send_json_to({"type": "job.ack", "job_id": JOB})
        assert "unknown job" in (await comm.receive_json_from(timeout=5))["detail"]
    finally:
        await comm.disconnect()
