"""The real-engine presets: which model two vLLM engines serve and the workload sent to them, one
choice for the demo (``make demo PRESET=real`` / ``PRESET=real-heavy``), the request driver
(``--preset``) and the benches (``bench/real_ab.py --preset``).

- ``real``: the tiny model (2 layers of width 128). A prefill costs next to nothing (TTFT
  30-40 ms whatever the cache holds): it shows the mechanism, not what a warm replica saves.
- ``real-heavy``: the prefill-heavy model (16 layers of width 1024, about 197M parameters) and
  prompts that are almost all shared prefix: each tenant's prefix of 1,600-1,952 tokens, then
  at most 8 tokens of the request's own. A request that finds its prefix cached prefills its
  own few tokens; one that misses prefills the whole prefix, many times longer (as a large
  model's long prefix does on a GPU), at 0.6 requests/s so that hits do not queue behind the
  misses. ``bench/real_ab.py`` measures that ratio from the taps' records in every run and
  counts only runs where it is at least ``MIN_MISS_OVER_HIT``.

Both use vLLM's CPU block size (32, the smallest it takes), the same block size for the router's
``--kv-event-block-size`` and the agents' keys, and two engines each pinned to its own core.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.realvllm.engine import HEAVY, TINY, ModelSpec, VllmEngine
from harness.realvllm.history import servegen_history
from harness.realvllm.traces import MAX_PROMPT, TraceRequest, servegen

# The busiest ServeGen tenants replayed, each with its own shared prefix (about two workload keys
# each at block size 32), in the demo, the driver and the A/B alike. Eight, not fewer: the
# scoreboard's holdout draws a prefix when the planner wants it and it has no live record, so the
# prefixes on offer bound how soon it has ``PREWARM_HOLDOUT_MIN_ASSIGNMENTS`` a side (with four
# tenants the real-heavy demo had 3 and 4 after ten minutes).
TENANTS = 8


@dataclass(frozen=True)
class RealPreset:
    name: str
    description: str
    model: ModelSpec
    prefix_tokens: tuple[int, int] = (1056, 1600)  # each tenant's shared prefix, drawn in
    max_tail_tokens: int = MAX_PROMPT  # each request's own tokens after its prefix, at most
    rate: float = 1.0  # mean requests per wall second

    def requests(
        self, tenants: int = TENANTS, duration_s: float = 1800.0, rate: float | None = None
    ) -> list[TraceRequest]:
        """The ServeGen slice as token-id prompts of this preset's shape (``traces.servegen``)."""
        return servegen(
            tenants=tenants,
            duration_s=duration_s,
            wall_rate=self.rate if rate is None else rate,
            prefix_tokens=self.prefix_tokens,
            max_tail_tokens=self.max_tail_tokens,
        )

    def history(
        self,
        days: float,
        end: float,
        tenants: int = TENANTS,
        duration_s: float = 1800.0,
        rate: float | None = None,
    ) -> list[dict[str, Any]]:
        """Import rows of the ``days`` before the slice ``requests`` replays with the same
        arguments, ending at wall time ``end`` (``history.servegen_history``)."""
        return servegen_history(
            tenants=tenants,
            duration_s=duration_s,
            wall_rate=self.rate if rate is None else rate,
            prefix_tokens=self.prefix_tokens,
            model=self.model.served_name,
            block_size=self.model.block_size,
            days=days,
            end=end,
            max_tail_tokens=self.max_tail_tokens,
        )

    def engines(self, log_dir: Path) -> list[VllmEngine]:
        """The two engines, ``vllm-a`` then the joining ``vllm-b``, each pinned to its own core
        (one core: both on it), their KV-event publishers bound (vllm-router and the agents
        connect to them)."""
        second = "1" if (os.cpu_count() or 1) > 1 else "0"
        return [
            VllmEngine("vllm-a", log_dir, events="bind", cpu_cores="0", model=self.model),
            VllmEngine("vllm-b", log_dir, events="bind", cpu_cores=second, model=self.model),
        ]


REAL_PRESETS = {
    p.name: p
    for p in (
        RealPreset(
            "real",
            "two vLLM engines on CPU, tiny model (prefill almost free), ServeGen tenants",
            TINY,
        ),
        RealPreset(
            "real-heavy",
            "two vLLM engines on CPU, prefill-heavy model (16 x 1024), ServeGen tenants whose "
            "prompts are a 1,600-1,952-token shared prefix and at most 8 tokens of their own",
            HEAVY,
            prefix_tokens=(1600, 1952),
            max_tail_tokens=8,
            # At 1 request/s a hit's median queued behind the bursts and the misses (190 ms
            # against an 82-90 ms floor, a miss 1.8 s: 9.4x, under the A/B's 10x).
            rate=0.6,
        ),
    )
}


def add_preset_argument(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--preset NAME``, one of ``REAL_PRESETS``."""
    parser.add_argument("--preset", choices=sorted(REAL_PRESETS), default=default, help=what)
