"""`make demo PRESET=real`: two real vLLM engines on CPU, their agents, the control plane and a
gateway-like request driver replaying a slice of the ServeGen trace (4 tenants, each with its own
shared prefix) as token-id prompts (``driver.py``).

Costs (measured on the 2-core machine): each engine holds about 2.9 GB and is ready about a
minute after it starts (both start together, each pinned to its own core); the tiny model is built
under ``var/realvllm/`` on first use; ``make vllm-env`` (3.4 GB, ~3 minutes) must have built
``.venv-vllm``. Every process is a child of this one; Ctrl-C stops them all, engines included.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from controlplane.realvllm.engine import (
    BYTES_PER_BLOCK,
    KV_CAPACITY_BLOCKS,
    EngineUnavailable,
    VllmEngine,
    ensure_model,
    free_port,
    vllm_python,
)

# Real seconds, not a compressed trace: a replica lives two minutes, plans every 10 s.
REAL_POLICY = {
    "mode": "auto",
    "forecast_every_seconds": 10,
    "plan_every_seconds": 10,
    "horizon_seconds": 120,
    "replica_ttl_seconds": 120,
    "min_confidence": 0.3,
    "max_spec_vram_fraction": 0.5,
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
    **engine_extra: Any,
) -> Path:
    """The agent's TOML: no GPUs (a CPU engine), jobs over the websocket, the engine's sockets."""
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
        "jobs_transport": "websocket",
        "backoff_max_s": 5.0,
    }
    eng = engine.agent_engine(
        bytes_per_block=BYTES_PER_BLOCK, kv_capacity_blocks=KV_CAPACITY_BLOCKS, **engine_extra
    )
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    lines += ["", "[[engines]]"] + [f"{k} = {_toml(v)}" for k, v in eng.items()]
    lines += ["", "[transfer]", 'listen = ""']
    path.write_text("\n".join(lines) + "\n")
    return path


def _policy(fields: dict[str, Any]) -> None:
    from io import StringIO

    from django.core.management import call_command

    call_command("ensure_policy", "demo", "--fields", json.dumps(fields), stdout=StringIO())


def _warmup_executor() -> bool:
    """Whether this control plane has the `warmup` executor (a prefill-only request)."""
    from controlplane.replication.models import Transport

    return "warmup" in {c[0] for c in Transport.CHOICES}


def main(host: str, port: int, rate: float = 1.0) -> int:
    from controlplane import demo

    try:
        python = vllm_python()
        ensure_model(python=python)
    except EngineUnavailable as exc:
        print(f"make demo PRESET=real: {exc}", file=sys.stderr)
        return 2
    data = demo.DEMO_DIR / "real"
    demo.DEMO_DIR.mkdir(parents=True, exist_ok=True)
    # A run right after Ctrl-C waits for the previous one to let go of the folder and the port.
    lock = demo._lock(data, beside=f"PRESET=burst PORT={port + 1}")  # noqa: F841 (held until exit)
    demo._wait_for_port(host, port)
    shutil.rmtree(data, ignore_errors=True)  # each run starts empty: the scoreboard is this run's
    data.mkdir(parents=True)
    password = demo._password()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PREWARM_DATA_DIR": str(data),
        "PYTHONUNBUFFERED": "1",
        **demo.SETTINGS,
    }
    os.environ.update(env)
    print(
        "preparing the demo (real: two vLLM engines on CPU, tiny model, ServeGen tenants) ...",
        flush=True,
    )
    credentials = data / "credentials.json"
    demo._setup(2, password, credentials)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per health poll
    policy = dict(REAL_POLICY)
    if _warmup_executor():
        policy["default_transport"] = "warmup"
    _policy(policy)
    creds = json.loads(credentials.read_text())
    url = f"http://{host}:{port}/"
    cp = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::") else url.rstrip("/")

    procs: list[subprocess.Popen] = []
    engines = [
        VllmEngine("vllm-a", data, events="connect", cpu_cores="0"),
        VllmEngine(
            "vllm-b", data, events="connect", cpu_cores="1" if (os.cpu_count() or 1) > 1 else "0"
        ),
    ]

    def stop(*_: object) -> None:
        for p in reversed(procs):  # the driver first, so its last records reach the web
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        for e in engines:
            e.stop()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    web_log = open(data / "web.log", "ab")  # noqa: SIM115 - the child keeps it
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                "controlplane.asgi:application",
            ],
            cwd=demo.ROOT,
            env={**env, "PREWARM_EMBEDDED_WORKER": "true"},
            stdout=web_log,
            stderr=subprocess.STDOUT,
        )
    )
    demo._wait_healthy(url, procs[0])
    print("starting two vLLM engines (about a minute, ~2.9 GB each) ...", flush=True)
    started = time.monotonic()
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready()
    except EngineUnavailable as exc:
        print(f"make demo PRESET=real: {exc}", file=sys.stderr)
        stop()
    print(
        f"engines ready in {time.monotonic() - started:.0f} s "
        f"({', '.join(f'{e.name} {e.rss_bytes() / 2**30:.1f} GiB' for e in engines)})",
        flush=True,
    )
    extra: dict[str, Any] = {}
    if _warmup_executor():  # the agent sends warm-ups to the engine's OpenAI-compatible server
        extra = {"served_model_name": "tiny"}
    for i, e in enumerate(engines):
        state = data / f"agent-{e.name}"
        state.mkdir()
        cfg = agent_config(
            data / f"agent-{e.name}.toml",
            cp,
            creds["enrolment_tokens"][i],
            e,
            state,
            **({"openai_url": e.url, **extra} if extra else {}),
        )
        with open(data / f"agent-{e.name}.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "nodeagent", "--config", str(cfg)],
                    cwd=demo.ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    _wait_engines(cp, creds["operator_token"], {e.name for e in engines}, procs)
    with open(data / "driver.log", "ab") as log:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "controlplane.realvllm.driver",
                    "--control-plane",
                    cp,
                    "--gateway-token",
                    creds["gateway_token"],
                    "--trace",
                    "servegen",
                    "--rate",
                    str(rate),
                    "--loop",
                    "--operator-token",
                    creds["operator_token"],
                    f"--join={engines[1].name}={JOIN[0]:g}:{JOIN[1]:g}",
                    *[f"--engine=cpu-{e.name}/{e.name}={e.url}" for e in engines],
                ],
                cwd=demo.ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    print(
        f"\nPrewarm is running at {url}\n"
        f"  login: admin / {password}  (also operator, viewer)\n"
        f"  preset real: two vLLM engines on CPU ({', '.join(e.url for e in engines)}), "
        f"their agents, 4 ServeGen tenants at ~{rate:g} request/s as token-id prompts;\n"
        f"  {engines[1].name} joins: warming at {JOIN[0]:g} s (warm-up copies land on it), "
        f"serving at {JOIN[1]:g} s\n"
        f"  look at: {url} (cache map), {url}plans/, {url}jobs/, {url}scoreboard/\n"
        f"  API docs: {url}api/docs/   logs: {data}/ (vllm-*.log, agent-*.log, driver.log)\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    while True:
        for p in procs:
            if p.poll() is not None:
                print(f"a demo process exited with code {p.returncode}; stopping", file=sys.stderr)
                stop()
        for e in engines:
            if not e.alive():
                print(f"vLLM engine {e.name} exited: {e.last_error()}; stopping", file=sys.stderr)
                stop()
        time.sleep(0.5)


def _wait_engines(
    cp: str, token: str, names: set[str], procs: list[subprocess.Popen], timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(
                f"{cp}/api/engines/?page_size=100",
                headers={"Authorization": f"Bearer {token}"},
                timeout=5,
            )
            if resp.status_code == 200 and names <= {
                e["engine_id"] for e in resp.json()["results"]
            }:
                return
        except httpx.HTTPError:
            pass
        if any(p.poll() is not None for p in procs):
            return  # the main loop reports which one exited
        time.sleep(0.5)
    print("the agents have not reported both engines within a minute; going on", file=sys.stderr)
