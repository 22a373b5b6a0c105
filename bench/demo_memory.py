"""Benchmark: the memory (RSS) of every process of a long demo, and whether any keeps growing.

Starts the demo (``python -m harness.demo``, the preset given) once per mode, side
by side: ``embedded`` (daphne with the Celery worker and beat as threads of the web process, as
``make demo`` runs) and ``services`` (PostgreSQL and a Redis of its own: daphne, a Celery worker
and beat each a process of their own, as a deployment runs them). Both run the virtual cluster,
which starts one real agent per virtual node. Once each says it is running, the resident set
size of each process of its tree is read from ``/proc`` every ``--every`` seconds for
``--minutes``, with its anonymous memory beside (``smaps_rollup``: heap, allocator arenas, thread
stacks; the JSON's ``anon_kb``); then each is stopped with SIGINT (as Ctrl-C does). Every sample
row carries the 1-minute load average.

The verdict: each process's slope (least squares, MB a minute) over the last ``--window``
minutes (30), or over the second half of a shorter run; the run fails (exit 1) when any is above
``--max-slope`` (0.5 MB a minute) and the window is covered. A run of an hour passes only with
flat memory; a shorter one prints the slopes and says it cannot tell. ``--quick``: embedded only,
samples every 10 s for 40 s (a smoke run; no verdict). ``--tracemalloc DIR``: every process
writes heap snapshots there and the end prints each process's top growers
(``nodeagent/memtrace.py``). docs/benchmarks.md "Memory over hours".

    PYTHONPATH=$PWD PREWARM_SHARED_DATA=/work/shared/data \\
        .venv/bin/python bench/demo_memory.py --port 8140 --json bench/results/demo_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from _common import REPO

from harness.processes import Proc

PG_URL = os.environ.get("PREWARM_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/prewarm")
MB = 1024.0  # kB per MB (MiB)


def processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process."""
    out: dict[int, tuple[int, list[str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(entry.name)] = (ppid, [a.decode(errors="replace") for a in argv if a])
    return out


def label(args: list[str]) -> str | None:
    if "daphne" in args:
        return "web"
    # Celery retitles its processes ("[celeryd: celery@host:MainProcess] ... worker ...",
    # "[celeryd: celery@host:ForkPoolWorker-1]", "[celery beat] ..."): read the whole line.
    line = " ".join(args)
    if "ForkPoolWorker" in line:
        return "worker pool"  # a prefork pool's child runs the tasks
    if "celery" in line and " worker" in line:
        return "worker"
    if "celery" in line and " beat" in line:
        return "beat"
    if "harness.cli" in args:
        return "cluster"
    if "nodeagent" in args:
        config = next((a for a in args if a.endswith("agent.toml")), "")
        return "agent " + Path(config).parent.name
    if "harness.demo" in args:
        return "demo"
    return None


def kb_field(path: str, key: str) -> int | None:
    """A ``Key:  N kB`` field of a /proc file, or None (gone, or no such field)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kb(pid: int) -> int | None:
    return kb_field(f"/proc/{pid}/status", "VmRSS:")


def sample(root: int) -> tuple[dict[str, int], dict[str, int]]:
    """label -> RSS in kB of each process of ``root``'s tree, and label -> its anonymous memory
    (``smaps_rollup``: the heap, allocator arenas and thread stacks, not mapped files)."""
    procs = processes()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[str, int] = {}
    anon: dict[str, int] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        pending.extend(kids.get(pid, []))
        if pid not in procs:
            continue
        name = label(procs[pid][1])
        rss = rss_kb(pid)
        if name and rss is not None:
            key = name if name not in out else f"{name} {pid}"
            out[key] = rss
            anon[key] = kb_field(f"/proc/{pid}/smaps_rollup", "Anonymous:") or 0
    return out, anon


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, MB) points; None for fewer than 3."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def slopes(
    samples: list[tuple[float, float, dict[str, int]]], window_min: float
) -> dict[str, float | None]:
    """Per process: MB a minute over the last ``window_min`` minutes of the samples, or over
    their second half when the run is shorter than twice that."""
    if not samples:
        return {}
    end = samples[-1][0] / 60.0
    start = end - window_min if end >= 2 * window_min else end / 2
    names = sorted({k for _, _, s in samples for k in s})
    return {
        name: slope(
            [(t / 60.0, s[name] / MB) for t, _, s in samples if t / 60.0 >= start and name in s]
        )
        for name in names
    }


class Run:
    """One demo of one mode: its process, log, data folder and (services) database and Redis."""

    def __init__(self, mode: str, args, base_env: dict[str, str], port: int):
        self.mode, self.port = mode, port
        self.dir = args.out / f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.log = self.dir.with_suffix(".log")
        self.env = dict(base_env)
        self.redis = None
        self.database = None
        self.proc: Proc | None = None
        if mode == "services":
            self._services()

    def _services(self) -> None:
        from harness.processes import ensure_database, free_port, wait_for

        self.database = f"prewarm_memory_{uuid.uuid4().hex[:8]}"
        url = urlsplit(PG_URL)._replace(path=f"/{self.database}").geturl()
        ensure_database(url)  # one line and exit when PostgreSQL does not answer
        redis_port = free_port()
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no"]
        self.redis = Proc("redis-" + self.mode, argv, dict(os.environ), self.dir.parent).start()
        import redis

        wait_for(lambda: redis.Redis(port=redis_port).ping(), 20, what="the bench's redis-server")
        self.env.update(
            DATABASE_URL=url,
            REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            SECRET_KEY="bench-" + uuid.uuid4().hex * 2,
            ALLOWED_HOSTS="127.0.0.1,localhost",
            PREWARM_SECURE="false",
        )

    def start(self, preset: str) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.unlink(missing_ok=True)  # running() reads this run's log only
        argv = [sys.executable, "-m", "harness.demo", "--port", str(self.port)]
        argv += ["--preset", preset, "--data-dir", str(self.dir)]
        self.proc = Proc(self.mode, argv, self.env, log_path=self.log, stop_timeout_s=90).start()

    def running(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            raise SystemExit(
                f"the {self.mode} demo exited ({self.proc.returncode}); see {self.log}"
            )
        return b"Prewarm is running" in self.log.read_bytes()

    def stop(self) -> None:
        if (
            self.proc is not None and self.proc.alive()
        ):  # as Ctrl-C does: the demo stops its children
            self.proc.send(signal.SIGINT, group=False)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.redis is not None:
            self.redis.stop()
        if self.database:
            from harness.processes import pg_admin

            pg_admin(PG_URL, f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="burst")
    ap.add_argument("--port", type=int, default=8140, help="the first mode's; the next, +1")
    ap.add_argument("--modes", default="embedded,services", help="embedded, services or both")
    ap.add_argument("--minutes", type=float, default=60.0, help="sampled after the demo runs")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--window", type=float, default=30.0, help="minutes the slope is taken over")
    ap.add_argument("--max-slope", type=float, default=0.5, help="MB a minute, per process")
    ap.add_argument("--quick", action="store_true", help="embedded, 40 s, no verdict")
    ap.add_argument("--out", type=Path, default=REPO / "var" / "demo-memory")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--tracemalloc", type=Path, help="every process writes heap snapshots here (slow)"
    )
    args = ap.parse_args(argv)
    # Stopped by a signal, still stop the demos: a background job starts with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.modes, args.minutes, args.every = "embedded", 40 / 60, 10.0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"embedded", "services"}:
        ap.error("--modes: embedded, services or both")
    # The repository first; a caller's PYTHONPATH (a diagnostic probe's folder) kept after it.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if args.tracemalloc:
        args.tracemalloc.mkdir(parents=True, exist_ok=True)
        env["PREWARM_TRACEMALLOC_DIR"] = str(args.tracemalloc.resolve())
        env.setdefault("PREWARM_TRACEMALLOC_EVERY_S", str(args.every))
    runs: list[Run] = []
    samples: dict[str, list[tuple[float, float, dict[str, int]]]] = {m: [] for m in modes}
    anons: dict[str, list[tuple[float, float, dict[str, int]]]] = {m: [] for m in modes}
    try:
        for i, mode in enumerate(modes):
            runs.append(Run(mode, args, env, args.port + i))
            runs[-1].start(args.preset)
        while not all(r.running() for r in runs):
            time.sleep(1.0)
        t0 = time.monotonic()
        n = int(round(args.minutes * 60 / args.every))
        for i in range(n + 1):
            time.sleep(max(0.0, t0 + i * args.every - time.monotonic()))
            t, load = time.monotonic() - t0, os.getloadavg()[0]
            for r in runs:
                s, anon = sample(r.proc.pid)
                samples[r.mode].append((t, load, s))
                anons[r.mode].append((t, load, anon))
                print(
                    f"{t:6.0f}s load {load:5.2f} {r.mode:8s} "
                    + " ".join(f"{k}={v // 1024}" for k, v in sorted(s.items())),
                    flush=True,
                )
    finally:
        for r in runs:
            r.stop()
    failed = []
    covered = args.minutes >= 2 * args.window and not args.quick
    for mode, rows in samples.items():
        if not rows:
            continue
        names = sorted({k for _, _, s in rows for k in s})
        print(f"\n{mode}: RSS in MB, one column a sample (every {args.every:.0f} s)")
        print(f"{'load (1 min)':20s} " + " ".join(f"{load:6.2f}" for _, load, _ in rows))
        for name in names:
            print(
                f"{name:20s} "
                + " ".join(f"{s[name] // 1024:6d}" if name in s else "     -" for _, _, s in rows)
            )
        span = f"last {args.window:.0f} min" if covered else "second half"
        print(
            f"slope over the {span}, MB a minute (limit {args.max_slope}; anonymous memory beside):"
        )
        anon_slopes = slopes(anons[mode], args.window)
        for name, value in slopes(rows, args.window).items():
            mark = ""
            if value is not None and value > args.max_slope:
                mark = "  OVER" if covered else "  (over, run too short to judge)"
                if covered:
                    failed.append(f"{mode} {name}")
            shown = "-" if value is None else f"{value:+.3f}"
            other = anon_slopes.get(name)
            shown += "" if other is None else f"  (anon {other:+.3f})"
            print(f"  {name:20s} {shown}{mark}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    mode: {
                        "samples": [
                            {"t_s": round(t, 1), "load_1m": load, "rss_kb": s, "anon_kb": a}
                            for (t, load, s), (_, _, a) in zip(rows, anons[mode], strict=True)
                        ],
                        "slope_mb_per_min": slopes(rows, args.window),
                        "anon_slope_mb_per_min": slopes(anons[mode], args.window),
                    }
                    for mode, rows in samples.items()
                },
                indent=1,
            )
        )
    if args.tracemalloc:
        from nodeagent import memtrace

        print("\ntop growers per process (tracemalloc):")
        print(memtrace.report(args.tracemalloc, top=8))
    if failed:
        print(f"\nFAIL: memory grows in {', '.join(failed)}")
        return 1
    print("\n" + ("PASS: every process flat" if covered else "no verdict: run too short"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
