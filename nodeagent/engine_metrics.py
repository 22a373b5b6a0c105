"""Scrape the few vLLM ``/metrics`` series the control plane shows (hit rate, load, KV use)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# report field -> vLLM sample names (older and newer releases)
SERIES = {
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


# vLLM's start-up cache settings, an info gauge whose labels are the values
# (``vllm/v1/metrics/loggers.py``, ``log_metrics_info``): the ones KV-aware routing depends on.
CACHE_CONFIG = "vllm:cache_config_info"
CACHE_SETTINGS = ("block_size", "prefix_caching_hash_algo", "enable_prefix_caching")


def parse_vllm_metrics(text: str) -> dict[str, Any]:
    """Sum each series over its labels (one engine may export several model/rank labels); the
    engine's cache settings, where it exports them, under ``cache_config``."""
    wanted = {name: field for field, names in SERIES.items() for name in names}
    out: dict[str, float] = {}
    config: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG:
                config = {k: sample.labels[k] for k in CACHE_SETTINGS if k in sample.labels}
                continue
            field = wanted.get(sample.name)
            if field is not None:
                out[field] = out.get(field, 0.0) + sample.value
    got: dict[str, Any] = {k: (int(v) if k != "kv_usage" else round(v, 4)) for k, v in out.items()}
    if config:
        got["cache_config"] = config
    return got


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        resp = await client.get(url)
        resp.raise_for_status()
        return parse_vllm_metrics(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("metrics scrape of %s failed: %s", url, exc)
        return None
