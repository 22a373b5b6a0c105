"""vLLM's own ``/metrics`` names, read from a real engine: the series the agent scrapes
(``nodeagent/engine_metrics.py``) and the ones the Grafana dashboard and docs name
(``docs/grafana-dashboard.json``) exist under those names and count what the engine served."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.engine_metrics import SERIES, parse_vllm_metrics
from tests.realvllm.helpers import fresh, prompts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def samples(url: str) -> dict[str, float]:
    """Each sample name summed over its labels."""
    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def dashboard_vllm_series() -> set[str]:
    exprs = [
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])
    ]
    return {m for e in exprs for m in re.findall(r"vllm:[a-z_]+", e)}


def test_the_names_we_read_are_the_engines_and_count_what_it_served(vllm_engines):
    engine = vllm_engines["bind"]
    fresh(engine)
    before = samples(engine.url)
    prompt = prompts(seed=11, n=1)[0]
    engine.complete(prompt)
    cached = engine.cached_tokens(prompt)  # the same prompt again: its full blocks hit
    assert cached > 0
    after = samples(engine.url)
    # Every series the agent reads, under the first (current) name it looks for.
    for field, names in SERIES.items():
        assert names[0] in after, f"{field}: {names[0]} not exported by this vLLM"
    # Every vLLM series the dashboard queries (a histogram by its _sum/_count/_bucket).
    for name in dashboard_vllm_series():
        assert any(s == name or s.startswith(name + "_") for s in after), name
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["vllm:prompt_tokens_total"] == 2 * len(prompt)
    assert delta["vllm:prompt_tokens_cached_total"] == cached
    assert delta["vllm:prefix_cache_hits_total"] == cached
    # Computed in prefill: the whole first prompt, the uncached tail of the second.
    assert delta["vllm:request_prefill_kv_computed_tokens_sum"] == 2 * len(prompt) - cached
    got = parse_vllm_metrics(httpx.get(f"{engine.url}/metrics", timeout=10).text)
    assert got["prompt_tokens_cached"] == after["vllm:prompt_tokens_cached_total"]
