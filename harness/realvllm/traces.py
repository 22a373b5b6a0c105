"""The driver's workloads as token-id prompts for the project's models (one word vocabulary): a slice of the Mooncake
conversation trace (each 512-token hash id becomes one 32-token vLLM block whose token ids are
drawn from the id, so the trace's prefix sharing becomes vLLM's block sharing exactly) or ServeGen
tenants, each with its own shared prefix."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from controlplane.core.traces.paths import shared_data_dir
from controlplane.sim.workloads.base import Workload
from controlplane.sim.workloads.mooncake import load_mooncake

TRACE_BLOCK = 512  # tokens per Mooncake hash id
BLOCK = 32  # tokens per vLLM block on CPU
VOCAB = (4, 2048)  # the models' word ids
MAX_PROMPT = 2016  # 63 blocks: leaves room for the answer in a 2048-token model
TENANT = "mooncake"


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # wall seconds from the start of the slice
    token_ids: list[int]
    max_tokens: int
    tenant: str = TENANT


def block_tokens(hash_id: int, n: int = BLOCK) -> list[int]:
    """The token ids one trace block becomes (the same for the same hash id, everywhere)."""
    rng = random.Random(hash_id * 2654435761 + 97)
    return [rng.randrange(*VOCAB) for _ in range(n)]


def prompt_of(chain: tuple[int, ...] | list[int], suffix_tokens: int, salt: int) -> list[int]:
    """A trace request's prompt: one 32-token block per hash id of its shared prefix, then its
    own suffix (the trace's tail divided by 16, drawn from ``salt``), capped to fit the model."""
    tokens: list[int] = []
    for h in chain:
        if len(tokens) + BLOCK > MAX_PROMPT:
            break
        tokens += block_tokens(int(h))
    rng = random.Random(salt)
    own = max(1, math.ceil(suffix_tokens * BLOCK / TRACE_BLOCK))
    tokens += [rng.randrange(*VOCAB) for _ in range(min(own, MAX_PROMPT - len(tokens)))]
    return tokens


def mooncake(
    path: Path | None = None, start_s: float = 0.0, duration_s: float = 600.0, limit: int = 0
) -> list[TraceRequest]:
    """The requests of ``[start_s, start_s + duration_s)`` of the trace (read by the simulator's
    loader), times from the start of the slice."""
    path = path or mooncake_path()
    if not path.exists():
        raise FileNotFoundError(f"the Mooncake trace is not at {path} (set PREWARM_SHARED_DATA)")
    w = load_mooncake(path).window(start_s, duration_s)
    n = len(w) if not limit else min(limit, len(w))
    return [
        TraceRequest(
            float(w.t[i]),
            prompt_of(w.prefixes[int(w.pid[i])], int(w.suffix_tokens[i]), i),
            max(1, min(8, int(w.output_tokens[i]) // 64)),
        )
        for i in range(n)
    ]


def servegen(
    tenants: int = 4,
    duration_s: float = 1800.0,
    time_scale: float = 10.0,
    wall_rate: float = 1.0,
    prefix_tokens: tuple[int, int] = (1056, 1600),
    seed: int = 0,
    max_tail_tokens: int = MAX_PROMPT,
) -> list[TraceRequest]:
    """The busiest ServeGen tenants over the window with the steepest demand ramp (the virtual
    cluster's ``burst`` choice, read by the simulator's loader), ``time_scale`` trace seconds per
    wall second, rates scaled to ``wall_rate`` requests per wall second on average.

    Each tenant (a ServeGen client, named as in the trace) has one shared prefix of 1,056-1,600
    tokens (drawn per tenant, seeded: a system prompt, tools, documents) so that every request
    of a tenant falls in one prefix group (groups end at 1,024 tokens, docs/api.md); each
    request adds its own prompt (the loader's length divided by 4, at most ``max_tail_tokens``
    and what the model fits) and asks for at most 8 tokens."""
    w, prefixes = servegen_window(tenants, duration_s, time_scale, wall_rate, prefix_tokens, seed)
    out = []
    for i in range(len(w)):
        prefix = prefixes[int(w.pid[i])]
        rng = random.Random(i * 7919 + seed)
        own = max(1, min(int(w.suffix_tokens[i]) // 4, max_tail_tokens, MAX_PROMPT - len(prefix)))
        out.append(
            TraceRequest(
                float(w.t[i]) / time_scale,
                prefix + [rng.randrange(*VOCAB) for _ in range(own)],
                max(1, min(8, int(w.output_tokens[i]) // 64)),
                w.prefix_wkey[int(w.pid[i])],
            )
        )
    return out


def servegen_window(
    tenants: int,
    duration_s: float,
    time_scale: float,
    wall_rate: float,
    prefix_tokens: tuple[int, int],
    seed: int = 0,
) -> tuple[Workload, list[list[int]]]:
    """The simulator's workload ``servegen`` replays (its ``history``: each tenant's expected
    requests per window before it, at the replay's rate scale) and each tenant's prefix as
    token ids, in the workload's prefix order."""
    from controlplane.sim.workloads import servegen as sg

    path = shared_data_dir() / "traces" / "servegen-m-large"
    windows = sg.load_servegen_windows(path)
    start = sg.ramp_start(windows, duration_s)
    chosen = sg.top_tenants(path, tenants, start, duration_s)
    trace_rate = sum(sg.mean_rate({n: t}, start, duration_s) for n, t in chosen.items())
    if trace_rate <= 0:
        raise ValueError("the ServeGen window has no traffic")
    w = sg.load_servegen(
        path,
        start=start,
        duration_s=duration_s,
        tenants=tenants,
        rate_scale=wall_rate / (trace_rate * time_scale),
        prefix_tokens=prefix_tokens,
        seed=seed,
    )
    lengths = sg.prefix_lengths(w.prefix_wkey, prefix_tokens, seed)
    prefixes = []
    for name in w.prefix_wkey:
        rng = random.Random(f"servegen-prefix-{name}-{seed}")
        prefixes.append([rng.randrange(*VOCAB) for _ in range(min(lengths[name], MAX_PROMPT - 64))])
    return w, prefixes


def mooncake_path() -> Path:
    return shared_data_dir() / "traces" / "mooncake" / "conversation_trace.jsonl"
