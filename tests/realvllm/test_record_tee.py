"""The record tee the real A/B bench puts between the agents and the control plane: it forwards
every request and answer as they came and keeps the request records the control plane took."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from harness.openai_stub import OpenAIStub, StubThread
from harness.realvllm.record_tee import RecordTee


@pytest.fixture
def upstream():
    stub = OpenAIStub()
    served = StubThread(stub)
    served.start()
    yield stub
    served.stop()


@pytest.fixture
def tee(upstream):
    t = RecordTee(upstream.url)
    t.start()
    yield t
    t.stop()


def test_it_keeps_the_records_the_control_plane_took_and_passes_answers_back(upstream, tee):
    batch = {"records": [{"time": 1.0, "engine": "n/a"}, {"time": 2.0, "engine": "n/b"}]}
    resp = httpx.post(f"{tee.url}/api/request-records/", json=batch, timeout=10)
    assert resp.status_code == 200 and resp.json() == {"accepted": 2}
    assert upstream.records_received == 2  # forwarded, not only kept
    assert tee.records() == batch["records"]
    # Anything else is forwarded as it came, answered as the upstream answered.
    models = httpx.get(f"{tee.url}/v1/models", timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
    missing = httpx.get(f"{tee.url}/api/nothing-here/", timeout=10)
    assert missing.status_code == 404


class Refusing(OpenAIStub):
    async def records(self, request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "invalid"}}, status=400)


def test_a_batch_the_control_plane_refused_is_not_kept():
    served = StubThread(Refusing())
    t = RecordTee(served.start())
    t.start()
    try:
        resp = httpx.post(f"{t.url}/api/request-records/", json={"records": [{}]}, timeout=10)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid"
        assert t.records() == []
    finally:
        t.stop()
        served.stop()


def test_an_unreachable_control_plane_is_a_502_and_nothing_is_kept():
    from harness.processes import free_port

    t = RecordTee(f"http://127.0.0.1:{free_port()}")
    t.start()
    try:
        resp = httpx.post(f"{t.url}/api/request-records/", json={"records": [{}]}, timeout=30)
        assert resp.status_code == 502 and "unreachable" in resp.text
        assert t.records() == []
    finally:
        t.stop()
