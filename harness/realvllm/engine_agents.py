"""The real ``prewarm-agent`` beside each real engine (the real demo and the real A/B bench):
its TOML, its process, and the wait until the control plane has seen every engine."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from harness.launch import Children
from harness.lifecycle import Lifecycles, Operator
from harness.processes import Proc, free_port
from harness.realvllm.engine import VllmEngine
from harness.realvllm.replay_gateway import TENANT_HEADER


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


def start_agents(
    children: Children,
    engines: list[VllmEngine],
    data: Path,
    cp: str,
    creds: dict[str, Any],
    env: dict[str, str],
    taps: dict[str, str],
    *,
    report_to: str = "",
    jobs_transport: str = "websocket",
    timeout_s: float = 60.0,
) -> bool:
    """An agent beside each engine, a child of ``children``: the i-th enrolled with the i-th
    of ``creds``'s enrolment tokens, serving the engine's request tap (``taps``), reporting to
    ``report_to`` (a pass-through in front of the control plane) or else to ``cp``. Whether the
    control plane has seen every engine within ``timeout_s``."""
    for i, e in enumerate(engines):
        token = creds["enrolment_tokens"][i]
        agent = start_agent(
            e, data, report_to or cp, token, env, taps[e.name], jobs_transport=jobs_transport
        )
        children.add(agent)
    names = {e.name for e in engines}
    return wait_for_engines(cp, creds["operator_token"], names, timeout_s)


def wait_for_engines(cp: str, token: str, names: set[str], timeout_s: float = 60.0) -> bool:
    """Whether the agents reported every engine named within ``timeout_s``."""
    operator = Operator(cp, token)
    try:
        return Lifecycles(operator, "demo").wait_for(names, timeout_s, threading.Event())
    finally:
        operator.close()
