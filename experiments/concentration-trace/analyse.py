"""Read traces made by ``trace.py``: where each run's worst 1% of requests (after the 300 s
warm-up) fall, the worst prefix's holders and queue around its burst, and the warm-up items.

    python experiments/concentration-trace/analyse.py reactive.pkl predictive.pkl ...
"""

from __future__ import annotations

import collections
import pickle
import sys

import numpy as np

WARMUP_S = 300.0


def main() -> None:
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            d = pickle.load(f)
        t, pid, ttft = d["t"], d["pid"], d["ttft"]
        sel = t >= WARMUP_S
        p99 = float(np.percentile(ttft[sel], 99))
        bad = np.where(sel & (ttft >= p99))[0]
        worst, n = collections.Counter(pid[bad].tolist()).most_common(1)[0]
        minute = collections.Counter(((t[bad] // 60) * 60).astype(int).tolist()).most_common(1)
        print(
            f"{path}: p99 {p99:.2f} s; prefix {worst} is {n} of the {len(bad)} worst; "
            f"worst minute {minute}; their mean wait {d['wait'][bad].mean():.2f} s"
        )
        for start in sorted({x for x, _ in minute} | {600}):
            w = (t >= start) & (t < start + 30) & (pid == worst)
            print(
                f"  prefix {worst} {start}-{start + 30} s: {w.sum()} requests, "
                f"{int((d['cached'][w] == 0).sum())} misses, wait mean "
                f"{d['wait'][w].mean():.2f} s max {d['wait'][w].max():.2f} s"
            )
        for tick, holders, queues, serving, load in d["ticks"]:
            if 570 <= tick <= 630:
                top = sorted(queues.items(), key=lambda x: -x[1])[:3]
                print(
                    f"  t={tick:.0f} load {load:.2f} serving {len(serving)} holders of "
                    f"{worst}: {holders.get(worst)} longest queues {top}"
                )
        items = collections.Counter(x[1] for x in d["items"] if 470 <= x[0] <= 600)
        print(f"  items planned 470-600 s per prefix: {sorted(items.items())}")
        fb = [x for x in d["fallback"] if x[1] == worst and 595 <= x[0] <= 700]
        print(
            f"  fallback copies of {worst} tried 595-700 s: {len(fb)}, started "
            f"{sum(1 for x in fb if x[4] is not None)}"
        )


if __name__ == "__main__":
    main()
