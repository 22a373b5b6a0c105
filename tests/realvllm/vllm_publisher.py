"""Publish KV events with vLLM's own publisher and hashing, as an engine would, for the fleet
doctor's tests: run with vLLM's environment (``.venv-vllm/bin/python``).

    vllm_publisher.py ENDPOINT REPLAY_ENDPOINT TOPIC

Hashes the blocks of one fixed prompt (``TOKENS``, 32-token blocks) the way vLLM's prefix cache
does (``init_none_hash`` then ``hash_block_tokens``, sha256: ``PYTHONHASHSEED`` in the
environment chooses ``NONE_HASH``), and publishes them as a ``BlockStored`` through
``ZmqEventPublisher`` under ``TOPIC`` twice a second until it is stopped. Prints ``ready`` once
it publishes.
"""

from __future__ import annotations

import sys
import time

from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils

BLOCK = 32
TOKENS = [7 + (i * 13) % 1900 for i in range(2 * BLOCK)]


def block_hashes() -> list[bytes]:
    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    out, parent = [], None
    for i in range(0, len(TOKENS), BLOCK):
        parent = kv_cache_utils.hash_block_tokens(fn, parent, TOKENS[i : i + BLOCK])
        out.append(bytes(parent))
    return out


def main() -> None:
    endpoint, replay, topic = sys.argv[1:4]
    pub = ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic=topic)
    hashes = block_hashes()
    event = BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=TOKENS,
        block_size=BLOCK,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    print("ready", flush=True)
    while True:
        pub.publish(KVEventBatch(ts=time.time(), events=[event]))
        time.sleep(0.5)


if __name__ == "__main__":
    main()
