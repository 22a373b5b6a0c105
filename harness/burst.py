"""A recorded burst as gateway request records.

Arrival times and prompt lengths are real: a 5-minute cut (1,379 requests, the busiest 5 minutes)
of the Azure LLM inference trace 2023, code service (`data/azure_code_burst.csv`, from
`../shared/data/traces/azure2023/AzureLLMInferenceTrace_code.csv`, Azure/AzurePublicDataset,
CC-BY-4.0; Patel et al., "Splitwise", ISCA 2024). That trace has no prompt contents, so every
request carries its tenant's shared prefix (a 2,048-token system prompt: 128 blocks of 16 tokens)
and one block of its own after it.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from wire import blockhash

FIXTURE = Path(__file__).parent / "data" / "azure_code_burst.csv"
BLOCK = 16
PREFIX_TOKENS = [(7 * i + 3) % 32000 for i in range(128 * BLOCK)]
PREFIX = blockhash.chain_keys(PREFIX_TOKENS, BLOCK)
TENANT, MODEL = "azure-code", "llama3-70b"


def arrivals() -> list[tuple[float, int]]:
    with open(FIXTURE) as f:
        rows = list(csv.DictReader(f))
    t = [datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]
    return [(x - t[0], int(r["ContextTokens"])) for x, r in zip(t, rows, strict=True)]


def records(end: float, bucket_s: int = 60) -> list[dict]:
    """The burst as request records whose last arrival falls just before ``end``'s bucket."""
    arr = arrivals()
    shift = (end // bucket_s * bucket_s - 1.0) - arr[-1][0]
    out = []
    for i, (t, tokens) in enumerate(arr):
        own = blockhash.block_key(PREFIX[-1], [i % 32000] * BLOCK)
        out.append(
            {
                "time": t + shift,
                "tenant": TENANT,
                "model": MODEL,
                "block_size": BLOCK,
                "keys": [blockhash.to_hex(k) for k in (*PREFIX, own)],
                "prompt_tokens": max(tokens, len(PREFIX_TOKENS) + BLOCK),
            }
        )
    return out
