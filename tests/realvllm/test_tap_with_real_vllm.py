"""The agent's request tap in front of a real vLLM engine, a real agent process and a real
control plane: answers pass unchanged, and every served request becomes a record the control
plane counts, with the cached tokens the engine reported, even across a control-plane outage.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harness.processes import free_port, wait_for
from harness.realvllm.engine import MODEL_NAME
from nodeagent.spool import unframe
from tests.realvllm.helpers import api, engine_blocks, prompts, start_agent

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
TENANT = "X-Tenant"


def tap_agent(plane, engine, state: Path, tap_port: int):
    return start_agent(
        plane,
        engine,
        state,
        args=("--tap-tenant", f"header:{TENANT}"),
        tap_listen=f"127.0.0.1:{tap_port}",
        openai_url=engine.url,
    )


def served(plane, tenant: str) -> tuple[int, int]:
    """(requests, cached tokens) the control plane counted for ``tenant`` from records."""
    resp = api(plane, "GET", f"/api/miss-buckets/?tenant={tenant}&page_size=500")
    resp.raise_for_status()
    rows = resp.json()["results"]
    reasons = ("hit", "partial", "warming", "evicted", "routed_away", "variant", "cold")
    return sum(sum(r[k] for k in reasons) for r in rows), sum(r["cached_tokens"] for r in rows)


def events(text: str) -> list[dict]:
    return [
        json.loads(line[5:])
        for line in text.split("\n\n")
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]


def text(stream: list[dict]) -> str:
    return "".join(c["text"] for e in stream for c in e["choices"])


def shape(body: dict) -> dict:
    """What must not differ between a direct and a tapped answer: everything but the request
    id, the creation time, the sampled text (the tiny model samples at random) and the cached
    tokens (the first of the two asks leaves the prompt cached for the second)."""
    out = {k: v for k, v in body.items() if k not in ("id", "created", "choices")}
    if isinstance(out.get("usage"), dict):
        out["usage"] = {**out["usage"], "prompt_tokens_details": None}
    out["choices"] = [
        {k: v for k, v in c.items() if k not in ("text", "token_ids")} for c in body["choices"]
    ]
    return out


def test_tap_forwards_unchanged_and_records_every_request(vllm_engines, plane, tmp_path):
    engine = vllm_engines["connect"]
    port = free_port()
    tap = f"http://127.0.0.1:{port}"
    agent = tap_agent(plane, engine, tmp_path / "agent", port)
    try:
        wait_for(lambda: engine.name in engine_blocks(plane), 60, what="the engine reported")
        batch = prompts(seed=7, n=6)
        cached = 0
        with httpx.Client(timeout=60) as c:
            wait_for(lambda: _up(c, tap), 30, what="the tap answering")
            for i, p in enumerate(batch):
                body = {"model": MODEL_NAME, "prompt": p, "max_tokens": 3}
                if i % 2:  # streaming, without asking for usage: the tap asks and hides it
                    body["stream"] = True
                    got = c.post(f"{tap}/v1/completions", json=body, headers={TENANT: "t-s"})
                    want = c.post(f"{engine.url}/v1/completions", json=body)
                    assert got.status_code == want.status_code == 200
                    assert got.headers["content-type"] == want.headers["content-type"]
                    mine, theirs = events(got.text), events(want.text)
                    # A loaded engine may put several tokens in one event: compare the events'
                    # shapes (the last one: finish reason and fingerprint) and the tokens.
                    last = shape(theirs[-1])
                    middle = {k: v for k, v in last.items() if k != "system_fingerprint"}
                    middle["choices"] = [{**c, "finish_reason": None} for c in last["choices"]]
                    assert shape(mine[-1]) == last
                    assert all(shape(e) == middle for e in mine[:-1])
                    assert len(text(mine).split()) == len(text(theirs).split()) == 3
                    assert got.text.rstrip().endswith("data: [DONE]")
                    assert all("usage" not in e for e in mine), "usage the client did not ask for"
                else:
                    got = c.post(f"{tap}/v1/completions", json=body, headers={TENANT: "t-a"})
                    want = c.post(f"{engine.url}/v1/completions", json=body)
                    assert got.status_code == want.status_code == 200
                    assert shape(got.json()) == shape(want.json())
                    cached += got.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            # Streaming that asked for usage gets it, cached tokens included.
            body = {
                "model": MODEL_NAME,
                "prompt": batch[0],
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            got = c.post(f"{tap}/v1/completions", json=body, headers={TENANT: "t-b"})
            usage = events(got.text)[-1]["usage"]
            assert usage["prompt_tokens"] == len(batch[0])
            # An engine error passes through with its status and body, and makes no record.
            bad = {"model": "no-such-model", "prompt": batch[0], "max_tokens": 2}
            err = c.post(f"{tap}/v1/completions", json=bad, headers={TENANT: "t-err"})
            direct = c.post(f"{engine.url}/v1/completions", json=bad)
            assert err.status_code == direct.status_code == 404
            assert err.json() == direct.json()
            too_long = {"model": MODEL_NAME, "prompt": [5] * 4000, "max_tokens": 2, "stream": True}
            err = c.post(f"{tap}/v1/completions", json=too_long, headers={TENANT: "t-err"})
            assert err.status_code == 400 and "error" in err.json()
            # Other paths pass through.
            assert c.get(f"{tap}/v1/models").json()["data"][0]["id"] == MODEL_NAME
        wait_for(lambda: served(plane, "t-b")[0] == 1, 30, what="the t-b record")
        assert served(plane, "t-b")[1] == usage["prompt_tokens_details"]["cached_tokens"]
        wait_for(lambda: served(plane, "t-a")[0] == len(batch) // 2, 30, what="the t-a records")
        assert served(plane, "t-a")[1] == cached, "the cached tokens the engine answered"
        wait_for(lambda: served(plane, "t-s")[0] == len(batch) // 2, 30, what="the t-s records")
        assert served(plane, "t-s")[1] > 0, "streamed records carry the engine's cached tokens"
        assert served(plane, "t-err") == (0, 0)
        assert agent.alive()
    finally:
        agent.stop()
        print(agent.tail())


def spooled_records(state: Path) -> int:
    total = 0
    for f in (state / "records").glob("*.rep"):
        body = unframe(f.read_bytes())
        if body is not None:
            total += len(json.loads(body)["records"])
    return total


def test_control_plane_down_loses_no_record(vllm_engines, plane, tmp_path):
    """A minute of requests (60, at most one a second in production) while the control plane
    is down, and the agent restarted in the middle of it: every request is served at once, every
    record is spooled on disk and reaches the control plane once it is back."""
    engine = vllm_engines["connect"]
    port = free_port()
    tap = f"http://127.0.0.1:{port}"
    state = tmp_path / "agent"
    agent = tap_agent(plane, engine, state, port)
    n = 60
    try:
        wait_for(lambda: engine.name in engine_blocks(plane), 60, what="the engine reported")
        plane.stop()
        batch = prompts(seed=11, n=n)
        with httpx.Client(timeout=60) as c:
            wait_for(lambda: _up(c, tap), 30, what="the tap answering")
            for i, p in enumerate(batch):
                if i == n // 2:  # half way: the agent restarts, its spool on disk
                    wait_for(lambda: spooled_records(state) == n // 2, 30, what="records spooled")
                    agent.stop()
                    agent = tap_agent(plane, engine, state, port)
                    wait_for(lambda: _up(c, tap), 30, what="the restarted tap")
                body = {"model": MODEL_NAME, "prompt": p, "max_tokens": 1, "stream": bool(i % 2)}
                resp = c.post(f"{tap}/v1/completions", json=body, headers={TENANT: "t-down"})
                assert resp.status_code == 200, resp.text
        wait_for(lambda: spooled_records(state) == n, 30, what=f"{n} records spooled")
        plane.start()
        wait_for(lambda: served(plane, "t-down")[0] == n, 60, what=f"{n} records counted")
        wait_for(lambda: spooled_records(state) == 0, 30, what="the spool emptied")
        assert agent.alive()
    finally:
        agent.stop()
        print(agent.tail())


def _up(c: httpx.Client, tap: str) -> bool:
    try:
        return c.get(f"{tap}/health").status_code == 200
    except httpx.HTTPError:
        return False
