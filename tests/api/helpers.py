"""Builders shared by API tests."""


def report(
    seq: int,
    stored=(),
    removed=(),
    mode="delta",
    engine="vllm-0",
    boot="boot-1",
    cleared=False,
    gpus=None,
):
    return {
        "seq": seq,
        "boot_id": boot,
        "sent_at": 1764540000.0 + seq,
        "gpus": gpus
        if gpus is not None
        else [
            {
                "uuid": "GPU-aaa",
                "index": 0,
                "name": "NVIDIA H100",
                "memory_total": 80 * 2**30,
                "memory_used": 70 * 2**30,
                "memory_free": 10 * 2**30,
                "utilization_gpu": 90,
            }
        ],
        "engines": [
            {
                "engine_id": engine,
                "kind": "vllm",
                "model": "llama3-70b",
                "block_size": 16,
                "bytes_per_block": 5_242_880,
                "kv_capacity_blocks": 10_000,
                "gpu_uuids": ["GPU-aaa"],
            }
        ],
        "residency": [
            {
                "engine_id": engine,
                "mode": mode,
                "stored": [list(r) for r in stored],
                "removed": [list(r) for r in removed],
                "cleared": cleared,
            }
        ],
    }
