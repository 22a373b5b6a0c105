"""Start and stop real ``prewarm-agent`` processes for the virtual cluster's nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.processes import Proc


def spawn_agents(
    configs: list[Path], enrolment_tokens: list[str], log_dir: Path | None = None
) -> list[Proc]:
    """One ``python -m nodeagent --config <toml>`` per node, logging to
    ``<log_dir>/<node>.log``; its enrolment token in its environment (used once; the agent keeps
    its node token in its state directory). The agents stay in this process's group: whoever
    started the cluster in a group of its own stops them with it."""
    if len(enrolment_tokens) < len(configs):
        raise ValueError(
            f"{len(configs)} agents need {len(configs)} enrolment tokens, "
            f"got {len(enrolment_tokens)}"
        )
    procs = []
    for cfg, token in zip(configs, enrolment_tokens, strict=False):
        env = {**os.environ, "PREWARM_AGENT_ENROLMENT_TOKEN": token, "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "nodeagent", "--config", str(cfg)]
        procs.append(Proc(cfg.parent.name, argv, env, log_dir, session=False).start())
    return procs


def stop_agents(procs: list[Proc], timeout_s: float = 10.0) -> None:
    """SIGTERM to every agent at once, then wait for each (SIGKILL after ``timeout_s``)."""
    for p in procs:
        p.send(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
