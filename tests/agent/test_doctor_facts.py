"""What an agent learns of its engine for the fleet doctor, from the engine's own events and
/metrics: the blocks a prompt would hit, its first-block hashes, its cache settings."""

from nodeagent.engine_metrics import parse_vllm_metrics
from nodeagent.engine_residency import EngineResidency
from wire import blockhash

TOKENS = list(range(100, 164))  # two 32-token blocks


def stored(hashes, parent=None, tokens=TOKENS, extra=None):
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 32,
        "lora_id": None,
        "medium": "GPU",
        # vLLM 0.32 sends one entry per block, None for plain text
        "extra_keys": extra if extra is not None else [None] * len(hashes),
    }


def test_cached_depth_follows_stores_removals_and_clears():
    r = EngineResidency("e", 32)
    keys = blockhash.request_keys(TOKENS + [7] * 10, 32)
    assert r.cached_depth(keys) == 0
    r.apply_events([stored([11, 12])])
    assert r.cached_depth(keys) == 2 and r.event_block_size == 32 and r.last_event_at > 0
    r.apply_events([{"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}])
    assert r.cached_depth(keys) == 1
    r.apply_events([{"type": "AllBlocksCleared"}])
    assert r.cached_depth(keys) == 0


def test_a_prompts_first_block_hash_is_kept_by_its_canonical_key():
    r = EngineResidency("e", 32)
    r.apply_events([stored([11, 12])])
    first = blockhash.chain_keys(TOKENS, 32)[0]
    assert r.roots == {first: 11}  # the second block has a parent: not a first block


def test_the_engines_cache_settings_from_its_metrics():
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",'
        'prefix_caching_hash_algo="sha256",gpu_memory_utilization="0.9"} 1.0\n'
        "vllm:num_requests_running 2.0\n"
    )
    got = parse_vllm_metrics(text)
    assert got["cache_config"] == {
        "block_size": "32",
        "prefix_caching_hash_algo": "sha256",
        "enable_prefix_caching": "True",
    }
    assert got["running"] == 2
