"""Start and stop real ``prewarm-agent`` processes for the virtual cluster's nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def spawn_agents(
    configs: list[Path], enrolment_tokens: list[str], log_dir: Path | None = None
) -> list[subprocess.Popen]:
    """One ``python -m nodeagent --config <toml>`` per node; its enrolment token in its
    environment (used once; the agent keeps its node token in its state directory)."""
    if len(enrolment_tokens) < len(configs):
        raise ValueError(
            f"{len(configs)} agents need {len(configs)} enrolment tokens, "
            f"got {len(enrolment_tokens)}"
        )
    procs = []
    for cfg, token in zip(configs, enrolment_tokens, strict=False):
        env = {**os.environ, "PREWARM_AGENT_ENROLMENT_TOKEN": token, "PYTHONUNBUFFERED": "1"}
        out = open(log_dir / f"{cfg.parent.name}.log", "ab") if log_dir else None  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "--config", str(cfg)],
                env=env,
                stdout=out or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
            )
        )
        if out:
            out.close()  # the child has its own descriptor
    return procs


def stop_agents(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
