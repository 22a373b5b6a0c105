"""`make demo PRESET=real` (or `PRESET=real-heavy`, the prefill-heavy model: ``presets.py``): two
real vLLM engines on CPU, their agents with a request tap in front of each engine, vllm-router (``kv_aware``, routing on the engines' own KV events) in front of the
taps, the control plane, and a load generator replaying a slice of the ServeGen trace (4 tenants,
each with its own shared prefix) as token-id prompts through the router (``driver.py``). The
taps post the request records; each request names its tenant in a header the taps read.

The second engine joins as in a scale-out: announced warming, then serving; it is added to the
router when it starts serving (the router is restarted with it: its KV-event sources are fixed
at start), and the router then learns what Prewarm's warm-ups placed there from that engine's
events, the earlier ones read from its replay socket once its next event arrives.

Costs (measured on the 2-core machine): each engine holds about 2.9 GB and is ready about a
minute after it starts (both start together, each pinned to its own core); the preset's model is
built under ``var/realvllm/`` on first use (seconds); ``make vllm-env`` (3.4 GB, ~3 minutes) must have built
``.venv-vllm``. Every process is a child of this one; Ctrl-C stops them all, engines included.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from controlplane.core.policy import knobs
from harness import launch
from harness.lifecycle import Lifecycles, Operator
from harness.processes import Proc, free_port
from harness.realvllm.driver import TENANT_HEADER
from harness.realvllm.engine import (
    EngineUnavailable,
    VllmEngine,
    ensure_model,
    vllm_python,
)
from harness.realvllm.presets import REAL_PRESETS, RealPreset
from harness.realvllm.router import RouterFront, router_available
from wire.protocol import TRANSPORT_WARMUP

# Real seconds, not a compressed trace: a replica lives two minutes, plans every 10 s. Copies are
# warm-ups: prefill-only requests the agent sends to the target engine's OpenAI server.
REAL_POLICY = {
    "mode": "auto",
    "default_transport": TRANSPORT_WARMUP,
    "forecast_every_seconds": 10,
    "plan_every_seconds": 10,
    "horizon_seconds": 120,
    "replica_ttl_seconds": 120,
    "min_confidence": 0.3,
    "max_spec_vram_fraction": knobs.MAX_SPEC_VRAM_FRACTION.high,  # the largest allowed
    "interval_seconds": 60,
    "max_bytes_per_interval": 1 << 30,
}


# The second engine joins as in a scale-out: announced (warming) 40 s into the replay, when the
# first forecasts exist, serving 60 s later; meanwhile the planner warms it with the hot tenant
# prefixes (prefill-only requests) and its own KV events confirm each copy.
JOIN = (40.0, 100.0)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def agent_config(
    path: Path,
    control_plane: str,
    enrolment: str,
    engine: VllmEngine,
    state_dir: Path,
    jobs_transport: str = "websocket",
    **engine_extra: Any,
) -> Path:
    """The agent's TOML: no GPUs (a CPU engine), jobs over the websocket (or ``jobs_transport``),
    the engine's sockets."""
    top = {
        "control_plane_url": control_plane,
        "enrolment_token": enrolment,
        "hostname": f"cpu-{engine.name}",
        "state_dir": str(state_dir),
        "gpu_source": "none",
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "report_interval_s": 1.0,
        "heartbeat_interval_s": 5.0,
        "engine_metrics_interval_s": 2.0,
        "jobs_transport": jobs_transport,
        "backoff_max_s": 5.0,
        "tap_tenant": f"header:{TENANT_HEADER}",
    }
    eng = engine.agent_engine(
        bytes_per_block=engine.model.bytes_per_block,
        kv_capacity_blocks=engine.model.kv_capacity_blocks(engine.kv_cache_gib),
        **engine_extra,
    )
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    lines += ["", "[[engines]]"] + [f"{k} = {_toml(v)}" for k, v in eng.items()]
    lines += ["", "[transfer]", 'listen = ""']
    path.write_text("\n".join(lines) + "\n")
    return path


def set_policy(fields: dict[str, Any]) -> None:
    from io import StringIO

    from django.core.management import call_command

    call_command("ensure_policy", "demo", "--fields", json.dumps(fields), stdout=StringIO())


def main(host: str, port: int, preset: RealPreset = REAL_PRESETS["real"]) -> int:
    what = f"make demo PRESET={preset.name}"
    try:
        python = vllm_python()
        ensure_model(preset.model, python=python)
        router_available()
    except EngineUnavailable as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2
    rate = preset.rate
    data = launch.DEMO_DIR / preset.name
    launch.DEMO_DIR.mkdir(parents=True, exist_ok=True)
    # A run right after Ctrl-C waits for the previous one to let go of the folder and the port.
    lock = launch.lock_run(data, beside=f"PRESET=burst PORT={port + 1}")  # noqa: F841 (held until exit)
    launch.wait_for_port(host, port)
    shutil.rmtree(data, ignore_errors=True)  # each run starts empty: the scoreboard is this run's
    data.mkdir(parents=True)
    password = launch.password()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PREWARM_DATA_DIR": str(data),
        "PYTHONUNBUFFERED": "1",
        **launch.SETTINGS,
    }
    os.environ.update(env)
    print(f"preparing the demo ({preset.name}: {preset.description}) ...", flush=True)
    credentials = data / "credentials.json"
    launch.setup_control_plane(2, password, credentials)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per health poll
    set_policy(REAL_POLICY)
    creds = json.loads(credentials.read_text())
    url = f"http://{host}:{port}/"
    cp = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::") else url.rstrip("/")

    # The publishers bind: the agents and the router both connect to them.
    engines = preset.engines(data)
    front = RouterFront(data, engines, serving=[engines[0].name])  # the joiner: when it serves
    router, taps = front.router, front.taps

    def stop_engines() -> None:
        router.stop()
        for e in engines:
            e.stop()

    children = launch.Children(on_stop=stop_engines)
    children.exit_on_signals()
    children.web(host, port, env, data)
    print("starting two vLLM engines (about a minute, ~2.9 GB each) ...", flush=True)
    started = time.monotonic()
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready()
    except EngineUnavailable as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        children.stop()
        return 1
    print(
        f"engines ready in {time.monotonic() - started:.0f} s "
        f"({', '.join(f'{e.name} {e.rss_bytes() / 2**30:.1f} GiB' for e in engines)})",
        flush=True,
    )
    for i, e in enumerate(engines):
        children.add(start_agent(e, data, cp, creds["enrolment_tokens"][i], env, taps[e.name]))
    if not wait_for_engines(cp, creds["operator_token"], {e.name for e in engines}):
        print(
            "the agents have not reported both engines within a minute; going on", file=sys.stderr
        )
    try:
        router.start().wait_ready(60)
    except EngineUnavailable as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        children.stop()
        return 1
    children.add(
        Proc(
            "driver",
            [
                sys.executable,
                "-m",
                "harness.realvllm.driver",
                "--control-plane",
                cp,
                "--router",
                router.url,
                "--trace",
                "servegen",
                "--preset",
                preset.name,
                "--rate",
                str(rate),
                "--loop",
                "--operator-token",
                creds["operator_token"],
                f"--join={engines[1].name}={JOIN[0]:g}:{JOIN[1]:g}",
            ],
            env,
            data,
            session=False,
        )
    )
    # When the joiner starts serving, the router is restarted with it (a second or two of
    # refused requests, which the load generator counts as failed).
    join = threading.Timer(JOIN[1], front.join, args=(engines[1].name,))
    join.daemon = True
    join.start()
    print(
        f"\nPrewarm is running at {url}\n"
        f"  login: admin / {password}  (also operator, viewer)\n"
        f"  preset {preset.name}: two vLLM engines on CPU, {preset.model.recipe} model "
        f"({', '.join(e.url for e in engines)}), "
        f"their agents with request taps ({', '.join(taps.values())}), vllm-router "
        f"(kv_aware) at {router.url},\n"
        f"  4 ServeGen tenants at ~{rate:g} request/s as token-id prompts through the router;\n"
        f"  {engines[1].name} joins: warming at {JOIN[0]:g} s (warm-up copies land on it), "
        f"serving (added to the router) at {JOIN[1]:g} s\n"
        f"  look at: {url} (cache map), {url}plans/, {url}jobs/, {url}scoreboard/\n"
        f"  API docs: {url}api/docs/   logs: {data}/ (vllm-*.log, vllm-router-*.log, "
        "agent-*.log, driver.log)\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    children.watch(
        lambda: next(
            (
                f"{p.what} {p.name} exited: {p.last_error()}"
                for p in (*engines, router)
                if not p.alive() and not router.restarting
            ),
            "",
        )
    )
    return 0


def start_agent(
    engine: VllmEngine,
    data: Path,
    cp: str,
    enrolment: str,
    env: dict[str, str],
    tap: str = "",
    jobs_transport: str = "websocket",
) -> Proc:
    """A real ``prewarm-agent`` beside the engine: its state and log under ``data``; it sends
    warm-ups to the engine's OpenAI server and, given ``tap`` (host:port), serves the request
    tap in front of it there."""
    state = data / f"agent-{engine.name}"
    state.mkdir(parents=True, exist_ok=True)
    cfg = agent_config(
        data / f"agent-{engine.name}.toml",
        cp,
        enrolment,
        engine,
        state,
        jobs_transport,
        openai_url=engine.url,
        served_model_name=engine.model.served_name,
        **({"tap_listen": tap} if tap else {}),
    )
    return Proc(
        f"agent-{engine.name}",
        [sys.executable, "-m", "nodeagent", "--config", str(cfg)],
        env,
        data,
        session=False,
    ).start()


def wait_for_engines(cp: str, token: str, names: set[str], timeout_s: float = 60.0) -> bool:
    """Whether the agents reported every engine named within ``timeout_s``."""
    operator = Operator(cp, token)
    try:
        return Lifecycles(operator, "demo").wait_for(names, timeout_s, threading.Event())
    finally:
        operator.close()
