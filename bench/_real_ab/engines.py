"""bench/real_ab.py's engine checks: a cold and a cached prefill's TTFT, and the reset between
runs shown to empty each engine's prefix cache."""

from __future__ import annotations

import statistics

from harness.realvllm.driver import Gateway, Target
from harness.realvllm.engine import EngineUnavailable, VllmEngine


def cold_and_cached_s(
    engine: VllmEngine, prompt: list[int], repeats: int = 5
) -> tuple[float, float]:
    """Median TTFT of a cold prefill (reset before each) and of the same prompt cached."""
    gw = Gateway("http://127.0.0.1:9", "unused", [Target(engine.name, engine.url)])
    cold, warm = [], []
    try:
        for _ in range(repeats):
            engine.reset_prefix_cache()
            rec = gw.send(prompt, 1, target=gw.targets[engine.name])
            again = gw.send(prompt, 1, target=gw.targets[engine.name])
            if rec is None or again is None:
                raise EngineUnavailable(f"{engine.name} failed a probe request")
            cold.append(rec["ttft_s"])
            warm.append(again["ttft_s"])
        engine.reset_prefix_cache()
    finally:
        gw.http.close()
    return statistics.median(cold), statistics.median(warm)


def reset_and_check(engines: list[VllmEngine], probe: list[int]) -> None:
    """Empty each engine's prefix cache and show it is empty: the probe (cached before the
    reset) must miss after it; then reset once more so the run starts with nothing."""
    for e in engines:
        e.complete(probe)
        if e.cached_tokens(probe) == 0:
            raise RuntimeError(f"{e.name}: the probe is not cached even before the reset")
        if not e.reset_prefix_cache():
            raise RuntimeError(f"{e.name}: /reset_prefix_cache did not succeed")
        if (left := e.cached_tokens(probe)) != 0:
            raise RuntimeError(f"{e.name}: {left} probe tokens still cached after the reset")
        e.reset_prefix_cache()
