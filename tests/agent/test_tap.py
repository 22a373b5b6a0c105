"""The request tap against a stand-in engine that answers as vLLM 0.32 does
(``harness.openai_stub``; the same paths against a real engine are in
tests/realvllm/test_tap_with_real_vllm.py): bytes through the tap are the bytes the engine sent,
and each served request becomes one record."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from harness.openai_stub import OpenAIStub
from nodeagent.records import RecordSpool
from nodeagent.tap import RequestTap, tenant_rule_error
from wire import blockhash

PROMPT = list(range(5, 105))  # 100 tokens: 3 full 32-token blocks


@pytest.fixture
async def world():
    stub = OpenAIStub()
    await stub.start()
    records: list[dict] = []
    tap = RequestTap("node-a/vllm-0", "127.0.0.1:0", stub.url, records.append, 32)
    await tap.start()
    async with httpx.AsyncClient(base_url=f"http://{tap.address}", timeout=10) as client:
        yield stub, tap, client, records
    await tap.close()
    await stub.close()


async def both(stub, client, path, body, **kw):
    """The tap's answer and the engine's own to the same request (asked once before, so that
    both find the prompt cached)."""
    await client.post(path, json=body, **kw)
    tapped = await client.post(path, json=body, **kw)
    async with httpx.AsyncClient(base_url=stub.url) as direct:
        return tapped, await direct.post(path, json=body, **kw)


async def test_stream_is_the_engines_bytes_and_the_record_has_its_usage(world):
    stub, tap, client, records = world
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "stream": True}
    tapped, direct = await both(stub, client, "/v1/completions", body)
    assert tapped.status_code == 200
    # The usage event the tap asked for is gone, the fingerprint back where vLLM puts it.
    assert tapped.content == direct.content
    assert b"usage" not in tapped.content and b"system_fingerprint" in tapped.content
    assert stub.requests[-2]["stream_options"] == {"include_usage": True}
    assert "stream_options" not in stub.requests[-1]
    rec = records[-1]
    assert rec["engine"] == "node-a/vllm-0" and rec["tenant"] == "tiny"
    assert rec["prompt_tokens"] == 100 and rec["cached_tokens"] == 96
    assert rec["keys"] == [blockhash.to_hex(k) for k in blockhash.chain_keys(PROMPT, 32)]
    assert records[0]["token_ids"] == PROMPT  # once per prefix every 10 s: token ids
    assert 0 < rec["ttft_s"] < 5


async def test_stream_that_asked_for_usage_keeps_it(world):
    stub, tap, client, records = world
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tapped, direct = await both(stub, client, "/v1/completions", body)
    assert tapped.content == direct.content and b'"usage":{' in tapped.content
    assert len(records) == 2


async def test_plain_answer_errors_and_other_paths_pass_through(world):
    stub, tap, client, records = world
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
    tapped, direct = await both(stub, client, "/v1/completions", body)
    assert tapped.content == direct.content
    assert tapped.headers["content-type"] == direct.headers["content-type"]
    for bad in ({**body, "model": "nope"}, {**body, "prompt": [5] * 4000, "stream": True}):
        tapped, direct = await both(stub, client, "/v1/completions", bad)
        assert tapped.status_code == direct.status_code and tapped.status_code in (400, 404)
        assert tapped.content == direct.content
    assert (await client.get("/v1/models?x=1")).json()["data"][0]["id"] == "tiny"
    assert len(records) == 2, "errors make no record"


async def test_chat_is_keyed_by_the_engines_tokenizer(world):
    stub, tap, client, records = world
    words = " ".join(f"w{i}" for i in range(70))
    body = {"model": "tiny", "messages": [{"role": "user", "content": words}], "stream": True}
    resp = await client.post("/v1/chat/completions", json=body, headers={"X-Tenant": "acme"})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    deadline = time.monotonic() + 30
    while not records:  # the record follows the answer (tokenized after it)
        assert time.monotonic() < deadline, "no record for the answered request"
        await asyncio.sleep(0.01)
    ids = stub._prompt_ids(body)
    assert records[0]["prompt_tokens"] == 70
    assert records[0].get("token_ids") == ids


async def test_engine_down_is_a_502_and_the_tap_lives_on(world):
    stub, tap, client, records = world
    await stub.close()
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT})
    assert resp.status_code == 502 and "engine unreachable" in resp.json()["error"]["message"]
    assert records == [] and tap.upstream_errors == 1


@pytest.mark.parametrize(
    "rule, headers, want",
    [
        ("model", {"X-Tenant": "acme"}, "tiny"),
        ("header:X-Tenant", {"X-Tenant": "acme"}, "acme"),
        ("header:X-Tenant", {}, "tiny"),
        ("api-key", {"Authorization": "Bearer sk-secret"}, "key-"),
    ],
)
async def test_tenant_rules(world, rule, headers, want):
    stub, tap, client, records = world
    tap.tenant_rule = rule
    body = {"model": "tiny", "prompt": PROMPT}
    await client.post("/v1/completions", json=body, headers=headers)
    assert records[0]["tenant"].startswith(want)
    assert "secret" not in json.dumps(records[0])
    assert tenant_rule_error(rule) == ""
    assert tenant_rule_error("header:") and tenant_rule_error("apikey")


async def test_cache_salt_keys_the_first_block_apart(world):
    stub, tap, client, records = world
    for salt in ("s1", "s1", None):
        body = {"model": "tiny", "prompt": PROMPT, **({"cache_salt": salt} if salt else {})}
        await client.post("/v1/completions", json=body)
    salted, again, plain = records
    assert salted["keys"] == again["keys"]  # salted records always carry keys
    assert plain["token_ids"] == PROMPT
    plain_keys = [blockhash.to_hex(k) for k in blockhash.chain_keys(PROMPT, 32)]
    assert all(a != b for a, b in zip(salted["keys"], plain_keys, strict=True))


class Plane:
    """The control plane's records endpoint as a transport: answers with ``codes`` in turn."""

    def __init__(self, *codes: int):
        self.codes = list(codes)
        self.got: list[list[dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        code = self.codes.pop(0) if self.codes else 200
        if code == 200:
            self.got.append(json.loads(request.content)["records"])
        return httpx.Response(code, json={"error": "x"} if code != 200 else {"accepted": 1})


async def test_record_spool_keeps_what_the_control_plane_did_not_take(tmp_path):
    plane = Plane(503, 400, 200)
    ready = [False]
    spool = RecordSpool(
        "http://cp",
        tmp_path / "records",
        lambda: "tok",
        lambda: ready[0],
        transport=httpx.MockTransport(plane),
    )
    spool.backoff.initial_s = spool.backoff.max_s = 0.0
    for i in range(3):
        spool.add({"time": 1764540000 + i})
    await spool.cut()
    assert await spool.flush() is False and plane.codes == [503, 400, 200], "not ready: no send"
    ready[0] = True
    assert await spool.flush() is False  # 503: kept
    assert len(spool.spool) == 1
    assert await spool.flush() is True  # 400: refused as written, dropped
    assert spool.dropped == 3 and len(spool.spool) == 0
    spool.add({"time": 1764540009})
    await spool.aclose()  # a stop spools what was queued ...
    again = RecordSpool("http://cp", tmp_path / "records", lambda: "tok", lambda: True)
    again.client = httpx.AsyncClient(transport=httpx.MockTransport(plane))
    assert await again.flush() is True  # ... and a restarted agent sends it
    assert plane.got == [[{"time": 1764540009}]] and again.posted == 1
    await again.aclose()


def test_tap_options_from_env_toml_and_flags(tmp_path):
    from nodeagent.config import ConfigError, load_config

    base = {
        "PREWARM_AGENT_CONTROL_PLANE_URL": "http://cp",
        "PREWARM_AGENT_STATE_DIR": str(tmp_path),
    }
    engine = {
        "engine_id": "vllm-0",
        "kv_events": "tcp://127.0.0.1:5557",
        "openai_url": "http://127.0.0.1:8000",
        "tap_listen": "0.0.0.0:8100",
    }
    env = {
        **base,
        "PREWARM_AGENT_TAP_TENANT": "header:X-Tenant",
        "PREWARM_AGENT_ENGINES": json.dumps([engine]),
    }
    cfg = load_config([], env)
    assert cfg.tap_tenant == "header:X-Tenant" and cfg.engines[0].tap_listen == "0.0.0.0:8100"
    toml = tmp_path / "agent.toml"
    toml.write_text('tap_tenant = "api-key"\n')
    assert load_config(["--config", str(toml)], base).tap_tenant == "api-key"
    assert load_config(["--tap-tenant", "model"], env).tap_tenant == "model"
    with pytest.raises(ConfigError, match="tap_tenant"):
        load_config(["--tap-tenant", "cookie"], env)
    no_upstream = {**engine, "openai_url": ""}
    with pytest.raises(ConfigError, match="tap_listen needs openai_url"):
        load_config([], {**env, "PREWARM_AGENT_ENGINES": json.dumps([no_upstream])})


def test_a_prefix_gets_its_token_ids_again_once_its_interval_has_passed():
    tap = RequestTap(
        "node-a/vllm-0", "127.0.0.1:0", "http://x", lambda r: None, 32, token_ids_every_s=10
    )
    assert tap._send_token_ids("t", "m", 1, now=100.0)  # first sight
    assert not tap._send_token_ids("t", "m", 1, now=109.0)  # within the interval: keys
    assert tap._send_token_ids("t", "m", 2, now=109.0)  # another prefix: its own clock
    assert tap._send_token_ids("t", "m", 1, now=110.5)  # interval passed: token ids again
