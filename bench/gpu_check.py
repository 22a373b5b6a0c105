"""Device check for a GPU node: the NVML collector on real hardware, and the GPU <-> pinned-host
copy bandwidth of KV blocks (the path that feeds a transfer). Skips with a clear message when
there is no GPU. ``--record PATH`` also writes an NVML scenario file for the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeagent.gpu import NvmlCollector  # noqa: E402
from nodeagent.nvml_scenario import record  # noqa: E402


def copy_bandwidth(block_bytes: int, blocks: int, repeats: int) -> dict | None:
    try:
        import torch
    except ImportError:
        print("torch not installed: skipping the copy measurement")
        return None
    if not torch.cuda.is_available():
        print("no CUDA device: skipping the copy measurement")
        return None
    host = [torch.empty(block_bytes, dtype=torch.uint8).pin_memory() for _ in range(blocks)]
    dev = [torch.empty(block_bytes, dtype=torch.uint8, device="cuda") for _ in range(blocks)]
    total = block_bytes * blocks
    out = {}
    for name, pairs in (
        ("h2d", list(zip(dev, host, strict=True))),
        ("d2h", list(zip(host, dev, strict=True))),
    ):
        best = 0.0
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = max(best, total / (time.perf_counter() - t0))
        out[f"{name}_bytes_per_s"] = round(best)
    out.update(block_bytes=block_bytes, blocks=blocks, device=torch.cuda.get_device_name(0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--record", help="write the NVML scenario recorded on this node here")
    a = ap.parse_args()
    try:
        import pynvml
    except ImportError:
        print("nvidia-ml-py missing")
        return
    reading = NvmlCollector(pynvml).collect()
    print(f"NVML: {reading.status}")
    for g in reading.gpus:
        print(
            f"  [{g['index']}] {g.get('name')} {g.get('uuid')} used {g.get('memory_used')} of "
            f"{g.get('memory_total')} util {g.get('utilization_gpu')} pcie {g.get('pcie')} "
            f"peers {len(g.get('nvlink_peers') or [])} errors {g['errors']}"
        )
    if a.record:
        Path(a.record).write_text(json.dumps(record(pynvml, "recorded"), indent=1))
        print(f"scenario written to {a.record}")
    copy = copy_bandwidth(5 << 20, 64 if a.quick else 256, 3 if a.quick else 5)
    out = {"nvml_status": reading.status, "gpus": reading.gpus, "copy": copy}
    if copy:
        print(f"{'metric':<22}{'value':>18}")
        for k in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
            print(f"{k:<22}{copy[k]:>18,}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
