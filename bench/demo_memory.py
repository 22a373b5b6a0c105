"""Benchmark: the memory (RSS) of every process of `make demo`, sampled each minute.

Starts the demo (``python -m harness.demo``, the preset and port given), waits for
it to say it is running, then reads the resident set size of each process of its tree from
``/proc`` every ``--every`` seconds for ``--minutes``; then stops it with SIGINT (as Ctrl-C does)
and prints one row per process (web = daphne with the embedded worker, cluster = the virtual
cluster, agents by node) and one column per sample, in MB. ``--json`` keeps the samples.
A leak shows as a row that keeps climbing; docs/benchmarks.md "Memory of a long demo".

    PREWARM_SHARED_DATA=/work/shared/data .venv/bin/python bench/demo_memory.py --port 8140
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def tree(root: int) -> list[int]:
    kids, out, pending = children(), [], [root]
    while pending:
        pid = pending.pop()
        out.append(pid)
        pending.extend(kids.get(pid, []))
    return out


def label(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    if "daphne" in args:
        return "web"
    if "harness.cli" in args:
        return "cluster"
    if "nodeagent" in args:
        config = next((a for a in args if a.endswith("agent.toml")), "")
        return "agent " + (Path(config).parent.name or str(pid))
    if "harness.demo" in args:
        return "demo"
    return None


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def sample(root: int) -> dict[str, int]:
    out = {}
    for pid in tree(root):
        name, rss = label(pid), rss_kb(pid)
        if name and rss is not None:
            out[name] = rss
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="burst")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--minutes", type=int, default=12, help="samples after the first")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--log", type=Path, default=REPO / "var" / "demo-memory.log")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "harness.demo"]
            + ["--port", str(args.port), "--preset", args.preset],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    samples: list[tuple[float, dict[str, int]]] = []
    try:
        while b"Prewarm is running" not in args.log.read_bytes():
            if demo.poll() is not None:
                raise SystemExit(f"the demo exited ({demo.returncode}); see {args.log}")
            time.sleep(1.0)
        t0 = time.monotonic()
        for i in range(args.minutes + 1):
            time.sleep(max(0.0, t0 + i * args.every - time.monotonic()))
            samples.append((time.monotonic() - t0, sample(demo.pid)))
            print(
                f"{samples[-1][0]:6.0f}s "
                + " ".join(f"{k}={v // 1024}" for k, v in sorted(samples[-1][1].items())),
                flush=True,
            )
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
    names = sorted({k for _, s in samples for k in s})
    print("\nRSS in MB, one column a sample (" + f"every {args.every:.0f} s)")
    for name in names:
        print(
            f"{name:14s} "
            + " ".join(f"{s[name] // 1024:6d}" if name in s else "     -" for _, s in samples)
        )
    if args.json:
        args.json.write_text(
            json.dumps([{"t_s": round(t, 1), "rss_kb": s} for t, s in samples], indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
