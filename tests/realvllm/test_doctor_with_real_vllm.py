"""The fleet doctor on the real vLLM engines: a healthy fleet gives no finding; then each fault is
made (on the engines, or with vLLM's own publisher and hashing) and the doctor names it, in the
API, the Prometheus series and ``manage.py doctor``'s exit status. The two session engines are
reused as they are: faults come from how their agents are configured and what they are sent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controlplane.core import doctor as d
from harness.processes import Proc, free_port, wait_for
from harness.realvllm.engine import BLOCK_SIZE, vllm_python
from tests.realvllm.helpers import api, fresh, prompts, start_agent, stop_quietly

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PUBLISHER = Path(__file__).with_name("vllm_publisher.py")


def doctor_cli(plane) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, "manage.py", "doctor"],
        env=plane.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, out.stdout + out.stderr


def findings(plane) -> set[tuple[str, str]]:
    resp = api(plane, "GET", "/api/doctor/")
    resp.raise_for_status()
    return {(f["check"], f["subject"]) for f in resp.json()["findings"]}


def engines(plane) -> dict[str, dict]:
    resp = api(plane, "GET", "/api/engines/?page_size=100")
    resp.raise_for_status()
    return {f"{e['node_name']}/{e['engine_id']}": e for e in resp.json()["results"]}


def metric(plane, check: str) -> float:
    text = api(plane, "GET", "/api/metrics/").text
    line = f'prewarm_doctor_findings{{check="{check}"}} '
    return float(next(ln for ln in text.splitlines() if ln.startswith(line)).split()[-1])


def tap(port: int, tokens: list[int]) -> dict:
    resp = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "tiny", "prompt": tokens, "max_tokens": 1, "temperature": 0.0},
        timeout=60,
    )
    resp.raise_for_status()
    return resp.json()


def tap_agent(plane, engine, state: Path, port: int, name: str, args=(), **extra) -> Proc:
    return start_agent(
        plane,
        engine,
        state,
        name=name,
        args=args,
        tap_listen=f"127.0.0.1:{port}",
        openai_url=engine.url,
        **extra,
    )


def reported(plane, name: str, want) -> dict:
    """Wait until the engine's doctor facts satisfy ``want``; returns them."""
    last: list[dict] = [{}]

    def seen() -> dict | None:
        last[0] = engines(plane).get(name, {}).get("doctor") or {}
        return last[0] if want(last[0]) else None

    try:
        return wait_for(seen, 60, interval=0.5, what=f"{name}'s doctor facts")
    except AssertionError:
        raise AssertionError(f"{name}'s doctor facts never got there: {last[0]}") from None


def test_doctor_names_each_fault_and_nothing_on_a_healthy_fleet(vllm_engines, plane, tmp_path):
    a, b = vllm_engines["bind"], vllm_engines["connect"]
    for e in (a, b):
        fresh(e)
    ports = {"a": free_port(), "b": free_port()}
    procs: list[Proc] = [
        tap_agent(plane, a, tmp_path / "a", ports["a"], "node-a"),
        tap_agent(plane, b, tmp_path / "b", ports["b"], "node-b"),
    ]
    try:
        # -- healthy: both engines serve the same prompts, twice, through their taps ----------
        shared = prompts(41, n=3, prefix_len=200)
        wait_for(lambda: len(engines(plane)) == 2, 60, what="both engines reported")
        for port in ports.values():
            wait_for(lambda p=port: _up(p), 30, what="the taps")
            for p in shared + shared:
                tap(port, p)
        for name in ("node-a/vllm-a", "node-b/vllm-b"):
            reported(
                plane,
                name,
                lambda doc: (
                    doc.get("roots")
                    and doc.get("cache_config")
                    and (doc.get("tap") or {}).get("requests", 0) >= 6
                ),
            )
        docs = {n: e["doctor"] for n, e in engines(plane).items()}
        # The same prompts, the same first-block hashes: vLLM's sha256 NONE_HASH is shared.
        assert set(docs["node-a/vllm-a"]["roots"]) & set(docs["node-b/vllm-b"]["roots"])
        assert docs["node-a/vllm-a"]["cache_config"]["block_size"] == str(BLOCK_SIZE)
        assert findings(plane) == set()
        code, out = doctor_cli(plane)
        assert code == 0 and "healthy" in out, out
        assert metric(plane, d.HASH_SEED_MISMATCH) == 0

        # -- faults on the real engines ------------------------------------------------------
        # node-b's agent: keys the engine with the wrong block size, subscribes to a topic the
        # engine does not publish (no event arrives), asks a replay socket nobody serves.
        stop_quietly(procs.pop())
        procs.append(
            tap_agent(
                plane,
                b,
                tmp_path / "b",
                ports["b"],
                "node-b",
                block_size=2 * BLOCK_SIZE,
                topic="kv",
                replay=f"tcp://127.0.0.1:{free_port()}",
            )
        )
        wait_for(lambda: _up(ports["b"]), 30, what="node-b's tap again")
        for p in prompts(42, n=3, prefix_len=200):
            tap(ports["b"], p)
        # node-a: prompts shorter than one block; and a prompt the engine's events say it holds,
        # served after the engine dropped its cache (vLLM announces the clear with its next
        # step): predicted hits served cold, three times.
        for i in range(4):
            tap(ports["a"], [100 + i] * 10)
        hot = shared[0]
        for _ in range(3):
            reported(plane, "node-a/vllm-a", lambda doc: doc.get("last_event_at"))
            wait_for(lambda: _held(plane, "vllm-a"), 30, what="vllm-a holding the prompt")
            a.reset_prefix_cache()
            assert tap(ports["a"], hot)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

        # -- faults with vLLM's own publisher and hashing -------------------------------------
        # Two "engines" of one model whose NONE_HASH differs (PYTHONHASHSEED 1 and 2), both
        # publishing under topic "kv", which vllm-router drops.
        pubs = []
        flags = []
        for i, seed in enumerate(("1", "2")):
            ev, rp = free_port(), free_port()
            argv = [str(vllm_python()), str(PUBLISHER), f"tcp://*:{ev}", f"tcp://*:{rp}", "kv"]
            env = {**os.environ, "PYTHONHASHSEED": seed}
            pubs.append(Proc(f"publisher-{i}", argv, env, tmp_path, pipe=True).start())
            flags += [
                "--engine",
                f"engine_id=pub-{i},kv_events=tcp://127.0.0.1:{ev},replay=tcp://127.0.0.1:{rp},"
                f"model=pub-model,block_size={BLOCK_SIZE}",
            ]
        try:
            for p in pubs:
                assert p.readline().strip() == "ready", p.tail()
            procs.append(_plain_agent(plane, tmp_path / "c", flags))
            want = {
                (d.BLOCK_SIZE_WRONG, "node-b/vllm-b"),
                (d.EVENTS_NONE, "node-b/vllm-b"),
                (d.REPLAY_UNANSWERED, "node-b/vllm-b"),
                (d.SHORT_PROMPTS, "node-a/vllm-a"),
                (d.PREDICTED_NOT_DELIVERED, "node-a/vllm-a"),
                (d.HASH_SEED_MISMATCH, "pub-model"),
                (d.TOPIC_DROPPED, "node-c/pub-0"),
                (d.TOPIC_DROPPED, "node-c/pub-1"),
            }
            got = wait_for(
                lambda: (f := findings(plane)) >= want and f,
                90,
                interval=1.0,
                what="every fault named",
            )
            assert got == want, got - want
        finally:
            for p in pubs:
                p.stop(20)
        code, out = doctor_cli(plane)
        assert code == 1, out
        for check, subject in want:
            assert f"{check} [{subject}]" in out, out
        assert "change: set block_size = 32" in out
        assert metric(plane, d.TOPIC_DROPPED) == 2
        page = httpx.get(f"{plane.url}/doctor/", cookies=_session(plane), timeout=30)
        assert page.status_code == 200 and "hash_seed_mismatch" in page.text
    finally:
        for p in procs:
            print(stop_quietly(p)[-1500:])


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _held(plane, engine_id: str) -> bool:
    resp = api(plane, "GET", "/api/engines/?page_size=100")
    return any(
        e["engine_id"] == engine_id and sum(e["blocks"].values()) > 0
        for e in resp.json()["results"]
    )


def _plain_agent(plane, state: Path, engine_flags: list[str]) -> Proc:
    state.mkdir(parents=True, exist_ok=True)
    enrol = plane.manage("create_enrolment_token")
    argv = [sys.executable, "-m", "nodeagent", "--control-plane-url", plane.url]
    argv += ["--enrolment-token", enrol, "--hostname", "node-c", "--state-dir", str(state)]
    argv += ["--gpu-source", "none", "--report-interval-s", "0.2", "--metrics-listen", ""]
    argv += ["--jobs-transport", "none", "--transfer-listen", "", *engine_flags]
    return Proc("agent-node-c", argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, state.parent).start()


def _session(plane) -> dict:
    with httpx.Client(base_url=plane.url, timeout=30) as c:
        login = c.get("/login/")
        token = c.cookies.get("csrftoken")
        c.post(
            "/login/",
            data={"username": "ops", "password": "pw-123456789", "csrfmiddlewaretoken": token},
            headers={"Referer": f"{plane.url}/login/"},
        )
        assert login.status_code == 200
        return dict(c.cookies)
