"""Heap snapshots for finding what grows in a long-running process (standard library only).

Set ``PREWARM_TRACEMALLOC_DIR`` to a folder and a process that calls ``start_from_env`` (the
web process, a Celery worker or beat, an agent, the virtual cluster) starts ``tracemalloc`` and
writes a snapshot there every ``PREWARM_TRACEMALLOC_EVERY_S`` seconds (default 60), named
``<label>-<pid>-<n>.snap``, keeping ``PREWARM_TRACEMALLOC_FRAMES`` frames per allocation
(default 4). Tracing starts ``PREWARM_TRACEMALLOC_DELAY_S`` seconds (default 60) after the
process does: what grows is allocated later, and start-up (migrations, imports, the health check
a launcher waits for) runs at full speed. Tracing slows a process and adds to its memory: it is for a diagnostic run, never
for production. ``python -m nodeagent.memtrace DIR`` then prints, per process, the allocation
sites that grew most between a snapshot after warm-up and the last one
(``bench/demo_memory.py --tracemalloc DIR`` does both).

It lives in the agent's package because the agent image ships only that package and the wire
modules; the control plane's image ships it too.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

ENV_DIR = "PREWARM_TRACEMALLOC_DIR"
ENV_EVERY = "PREWARM_TRACEMALLOC_EVERY_S"
ENV_FRAMES = "PREWARM_TRACEMALLOC_FRAMES"
ENV_DELAY = "PREWARM_TRACEMALLOC_DELAY_S"
_started: list[Snapshotter] = []
_NAME = re.compile(r"^(?P<label>.+)-(?P<pid>\d+)-(?P<n>\d+)\.snap$")


@dataclass
class Snapshotter:
    """Writes a tracemalloc snapshot of this process to ``folder`` every ``every_s`` seconds
    from a daemon thread, and one more when stopped."""

    folder: Path
    label: str
    every_s: float = 60.0
    frames: int = 4
    delay_s: float = 0.0
    count: int = field(default=0, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self) -> Snapshotter:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._spawn()
        # A forked child (a prefork Celery pool's) keeps tracing but not this thread.
        os.register_at_fork(after_in_child=self._after_fork)
        return self

    def _spawn(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tracemalloc", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        self.count, self.delay_s = 0, 0.0  # tracing already runs in the parent's copy
        self._stop = threading.Event()
        self._spawn()

    def snapshot(self) -> Path:
        # Unfiltered: filtering in Python costs minutes on a busy web process's heap, and the
        # tracer's own frames are few (``by_site`` shows them apart).
        snap = tracemalloc.take_snapshot()
        path = self.folder / f"{self.label}-{os.getpid()}-{self.count:04d}.snap"
        tmp = path.with_suffix(".tmp")
        snap.dump(str(tmp))
        tmp.replace(path)  # a reader never sees half a snapshot
        self.count += 1
        return path

    def _run(self) -> None:
        if self.count == 0 and self._stop.wait(self.delay_s):
            return
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        self.snapshot()
        while not self._stop.wait(self.every_s):
            self.snapshot()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if tracemalloc.is_tracing():
                self.snapshot()


def _positive(key: str, raw: str, cast):
    try:
        value = cast(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{key} must be a positive number, not {raw!r}")
    return value


def start_from_env(label: str, environ: dict[str, str] | None = None) -> Snapshotter | None:
    """Start snapshots when ``PREWARM_TRACEMALLOC_DIR`` is set; once per process (the first
    caller's label wins: the web process imports the Celery app too)."""
    env = os.environ if environ is None else environ
    folder = env.get(ENV_DIR, "")
    if not folder or _started:
        return None
    every = _positive(ENV_EVERY, env.get(ENV_EVERY, "60"), float)
    frames = _positive(ENV_FRAMES, env.get(ENV_FRAMES, "4"), int)
    delay = float(env.get(ENV_DELAY, "60") or 0)
    snapper = Snapshotter(Path(folder), label, every, frames, delay).start()
    _started.append(snapper)
    return snapper


def snapshots(folder: Path) -> dict[tuple[str, int], list[Path]]:
    """The snapshot files of ``folder`` by (label, pid), oldest first."""
    out: dict[tuple[str, int], list[tuple[int, Path]]] = {}
    for path in folder.iterdir():
        m = _NAME.match(path.name)
        if m:
            out.setdefault((m["label"], int(m["pid"])), []).append((int(m["n"]), path))
    return {k: [p for _, p in sorted(v)] for k, v in sorted(out.items())}


def _root() -> str:
    return str(Path(__file__).resolve().parents[1]) + os.sep


def by_site(snap: tracemalloc.Snapshot, root: str) -> dict[str, list[int]]:
    """Traced bytes and blocks by allocation site: the most recent frame in the project's own
    code (under ``root``, the virtual environment excluded), else the most recent frame; a
    library's allocation is charged to the project line that called into it."""
    out: dict[str, list[int]] = {}
    for trace in snap.traces:
        frames = list(trace.traceback)  # oldest first
        own = [
            f for f in frames if f.filename.startswith(root) and "site-packages" not in f.filename
        ]
        f = own[-1] if own else frames[-1]
        site = f"{f.filename.removeprefix(root)}:{f.lineno}"
        acc = out.setdefault(site, [0, 0])
        acc[0] += trace.size
        acc[1] += 1
    return out


def top_growth(first: Path, last: Path, top: int = 10) -> list[tuple[str, int, int, int]]:
    """The ``top`` sites (``by_site``) that grew most from ``first`` to ``last``: (site, bytes
    grown, blocks grown, bytes now)."""
    root = _root()
    old = by_site(tracemalloc.Snapshot.load(str(first)), root)
    new = by_site(tracemalloc.Snapshot.load(str(last)), root)
    rows = [
        (site, size - old.get(site, [0, 0])[0], n - old.get(site, [0, 0])[1], size)
        for site, (size, n) in new.items()
    ]
    return sorted(rows, key=lambda r: r[1], reverse=True)[:top]


def report(folder: Path, top: int = 10, skip: int = 1) -> str:
    """Per process: the top growers between its snapshot number ``skip`` (after warm-up) and
    its last, and its whole traced heap at both."""
    lines = []
    for (label, pid), paths in snapshots(folder).items():
        if len(paths) < 2:
            continue
        first, last = paths[min(skip, len(paths) - 2)], paths[-1]
        total = [
            sum(t.size for t in tracemalloc.Snapshot.load(str(p)).traces) / 2**20
            for p in (first, last)
        ]
        lines.append(
            f"== {label} (pid {pid}): {first.name} -> {last.name}, traced "
            f"{total[0]:.1f} -> {total[1]:.1f} MiB"
        )
        for site, grown, blocks, now in top_growth(first, last, top):
            if grown <= 0:
                break
            lines.append(
                f"  {grown / 1024:+10.1f} KiB {blocks:+8d} blocks (now {now / 1024:9.1f} KiB)  {site}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="top heap growers per process, from snapshots")
    ap.add_argument("folder", type=Path)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--skip", type=int, default=1, help="compare from this snapshot number")
    args = ap.parse_args(argv)
    print(report(args.folder, args.top, args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
