"""`make demo PRESET=real` (or `PRESET=real-heavy`, the prefill-heavy model: ``presets.py``): two
real vLLM engines on CPU, their agents with a request tap in front of each engine, vllm-router (``kv_aware``, routing on the engines' own KV events) in front of the
taps, the control plane, and a load generator replaying a slice of the ServeGen trace (the
``TENANTS`` busiest tenants, each with its own shared prefix) as token-id prompts through the router (``driver.py``). The
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
import sys
import threading
import time
from pathlib import Path
from typing import Any

from controlplane.core.policy import knobs
from harness import launch
from harness.processes import Proc
from harness.realvllm.engine import (
    EngineUnavailable,
    VllmEngine,
    ensure_model,
    vllm_python,
)
from harness.realvllm.engine_agents import start_agents
from harness.realvllm.presets import REAL_PRESETS, TENANTS, RealPreset
from harness.realvllm.router import RouterFront, router_available
from harness.virtual.history import post_history
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
    # Half the prefixes held out at random, as in the burst demo: the scoreboard's holdout.
    "holdout_fraction": 0.5,
}
# Days of the slice's tenants' earlier demand imported before the replay (as the burst demo's
# cluster imports them): the day-scale forecasters have history from the first minute.
HISTORY_DAYS = 2.0


# The second engine joins as in a scale-out: announced (warming) 40 s into the replay, when the
# first forecasts exist, serving 60 s later; meanwhile the planner warms it with the hot tenant
# prefixes (prefill-only requests) and its own KV events confirm each copy.
JOIN = (40.0, 100.0)


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
    data = launch.DEMO_DIR / preset.name
    # A run right after Ctrl-C waits for the previous one to let go of the folder and the port.
    _lock, env = launch.fresh_run(data, host, port, beside=f"PRESET=burst PORT={port + 1}")
    password, creds = _set_up_control_plane(preset, data)
    url = f"http://{host}:{port}/"
    cp = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::") else url.rstrip("/")

    # The publishers bind: the agents and the router both connect to them.
    engines = preset.engines(data)
    front = RouterFront(data, engines, serving=[engines[0].name])  # the joiner: when it serves
    router = front.router

    def stop_engines() -> None:
        router.stop()
        for e in engines:
            e.stop()

    children = launch.Children(on_stop=stop_engines)
    children.exit_on_signals()
    children.web(host, port, env, data)
    try:
        _start_engines(engines)
        if not start_agents(children, engines, data, cp, creds, env, front.taps):
            print(
                "the agents have not reported both engines within a minute; going on",
                file=sys.stderr,
            )
        router.start().wait_ready(60)
    except EngineUnavailable as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        children.stop()
        return 1
    _import_history(preset, cp, creds["operator_token"])
    children.add(_driver(preset, cp, router.url, creds["operator_token"], engines[1], env, data))
    # When the joiner starts serving, the router is restarted with it (a second or two of
    # refused requests, which the load generator counts as failed).
    join = threading.Timer(JOIN[1], front.join, args=(engines[1].name,))
    join.daemon = True
    join.start()
    _print_running(preset, url, password, engines, front, data)
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


def _set_up_control_plane(preset: RealPreset, data: Path) -> tuple[str, dict[str, Any]]:
    """Migrations, users, the real demo's policy and two agents' credentials: the demo password
    and the credentials."""
    password = launch.password()
    print(f"preparing the demo ({preset.name}: {preset.description}) ...", flush=True)
    credentials = data / "credentials.json"
    launch.setup_control_plane(2, password, credentials)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per health poll
    set_policy(REAL_POLICY)
    return password, json.loads(credentials.read_text())


def _start_engines(engines: list[VllmEngine]) -> None:
    """Both engines started together, then waited for; raises EngineUnavailable."""
    print("starting two vLLM engines (about a minute, ~2.9 GB each) ...", flush=True)
    started = time.monotonic()
    for e in engines:
        e.start()
    for e in engines:
        e.wait_ready()
    print(
        f"engines ready in {time.monotonic() - started:.0f} s "
        f"({', '.join(f'{e.name} {e.rss_bytes() / 2**30:.1f} GiB' for e in engines)})",
        flush=True,
    )


def _import_history(preset: RealPreset, cp: str, token: str) -> None:
    """``HISTORY_DAYS`` of the replayed tenants' demand before now, through the product's
    ``POST /api/history-imports/``."""
    summary = post_history(cp, token, preset.history(HISTORY_DAYS, time.time()), "real-demo")
    print(
        f"imported {HISTORY_DAYS:g} days of history: {summary['requests']} requests in "
        f"{summary['rows']} rows",
        flush=True,
    )


def _driver(
    preset: RealPreset,
    cp: str,
    router: str,
    operator_token: str,
    joiner: VllmEngine,
    env: dict[str, str],
    data: Path,
) -> Proc:
    """The load generator: the preset's ServeGen tenants through the router, looped; it
    announces the joiner warming, then serving (``JOIN``)."""
    argv = [
        sys.executable,
        "-m",
        "harness.realvllm.driver",
        "--control-plane",
        cp,
        "--router",
        router,
        "--trace",
        "servegen",
        "--preset",
        preset.name,
        "--rate",
        str(preset.rate),
        "--tenants",
        str(TENANTS),
        "--loop",
        "--operator-token",
        operator_token,
        f"--join={joiner.name}={JOIN[0]:g}:{JOIN[1]:g}",
    ]
    return Proc("driver", argv, env, data, session=False)


def _print_running(
    preset: RealPreset,
    url: str,
    password: str,
    engines: list[VllmEngine],
    front: RouterFront,
    data: Path,
) -> None:
    print(
        f"\nPrewarm is running at {url}\n"
        f"  login: admin / {password}  (also operator, viewer)\n"
        f"  preset {preset.name}: two vLLM engines on CPU, {preset.model.recipe} model "
        f"({', '.join(e.url for e in engines)}), "
        f"their agents with request taps ({', '.join(front.taps.values())}), vllm-router "
        f"(kv_aware) at {front.router.url},\n"
        f"  {TENANTS} ServeGen tenants at ~{preset.rate:g} request/s as token-id prompts through the "
        "router;\n"
        f"  {engines[1].name} joins: warming at {JOIN[0]:g} s (warm-up copies land on it), "
        f"serving (added to the router) at {JOIN[1]:g} s\n"
        f"  look at: {url} (cache map), {url}plans/, {url}jobs/, {url}scoreboard/\n"
        f"  API docs: {url}api/docs/   logs: {data}/ (vllm-*.log, vllm-router-*.log, "
        "agent-*.log, driver.log)\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
