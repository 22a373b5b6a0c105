"""Diagnostic probe, not product code: where the web process's memory is, from inside it.

Put this folder first on ``PYTHONPATH`` of a demo (``python -m harness.demo``) with ``PROBE_OUT``
set to a file: the daphne process appends a JSON line every ``PROBE_EVERY_S`` (30)
seconds (``PROBE_MATCH=celery,nodeagent``: the processes whose command line holds one of those,
each to ``PROBE_OUT.<pid>``, a prefork pool's children included, started again after the fork) with its RSS and anonymous RSS (``/proc/self/status``), the RSS of its ``[heap]`` and of
its other anonymous mappings (``/proc/self/smaps``), glibc's ``mallinfo2`` (``arena``: bytes
the allocator holds outside mmapped chunks, ``uord``: in use, ``ford``: free), tracemalloc's
traced total (``PROBE_TRACE=1``, one frame, from 30 s on), pymalloc's allocated blocks, its arenas
and the bytes in their used and free blocks (``sys._debugmallocstats``), and the thread count. ``PROBE_TRIM_AT=600,900``: at those seconds it calls ``malloc_trim(0)`` once and
writes a row tagged ``after_trim``.
"""

import ctypes
import gc
import json
import os
import sys
import threading
import time
import tracemalloc


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _matches() -> bool:
    words = [w.encode() for w in os.environ.get("PROBE_MATCH", "daphne").split(",") if w]
    try:
        with open("/proc/self/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return False
    return any(w in line for w in words)


def _pymalloc() -> dict[str, int]:
    """pymalloc's arenas and blocks from ``sys._debugmallocstats`` (it writes to C's stderr)."""
    import tempfile

    keys = {
        "# arenas allocated current": "py_arenas",
        "# bytes in allocated blocks": "py_used",
        "# bytes in available blocks": "py_free",
    }
    out: dict[str, int] = {}
    with tempfile.TemporaryFile("w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        for line in tmp:
            head, _, value = line.partition("=")
            name = keys.get(head.strip())
            if name:
                out[name] = int(value.strip().replace(",", ""))
            elif "unused pools *" in head:
                out["py_unused_pools"] = int(head.split()[0])
    return out


def _status() -> dict[str, int]:
    keys = {"VmRSS", "RssAnon", "RssFile", "Threads"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in keys:
                out[key] = int(line.split()[1])
    return out


def _maps() -> tuple[int, int, int]:
    """kB of RSS in [heap], in other anonymous mappings, and the number of mappings."""
    heap = anon = n = 0
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                name, n = (parts[5] if len(parts) > 5 else ""), n + 1
            elif parts[0] == "Rss:":
                heap += int(parts[1]) if name == "[heap]" else 0
                anon += int(parts[1]) if name == "" else 0
    return heap, anon, n


def _row(libc, t0: float, tag: str) -> dict:
    mi = libc.mallinfo2()
    heap, anon, nmaps = _maps()
    return {
        "t": round(time.time() - t0, 1),
        "tag": tag,
        **_status(),
        "heap_kb": heap,
        "anon_maps_kb": anon,
        "nmaps": nmaps,
        "arena": mi.arena,
        "hblkhd": mi.hblkhd,
        "uord": mi.uordblks,
        "ford": mi.fordblks,
        "keep": mi.keepcost,
        "traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
        "blocks": sys.getallocatedblocks(),
        **_pymalloc(),
        "load": os.getloadavg()[0],
    }


def _run(out: str) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    trims = [float(x) for x in os.environ.get("PROBE_TRIM_AT", "").split(",") if x]
    every = float(os.environ.get("PROBE_EVERY_S", "30"))
    t0 = time.time()
    if os.environ.get("PROBE_TRACE"):
        time.sleep(30)
        tracemalloc.start(1)
    done: set[float] = set()
    with open(out, "a") as f:
        while True:
            row = _row(libc, t0, "s")
            if int(row["t"]) % 300 < every:
                row["gc_objects"] = len(gc.get_objects())
            f.write(json.dumps(row) + "\n")
            for at in trims:
                if at not in done and row["t"] >= at:
                    done.add(at)
                    libc.malloc_trim(0)
                    f.write(json.dumps(_row(libc, t0, "after_trim")) + "\n")
            f.flush()
            time.sleep(every)


def _start() -> None:
    out = os.environ["PROBE_OUT"]
    if os.environ.get("PROBE_MATCH"):
        out = f"{out}.{os.getpid()}"
    threading.Thread(target=_run, args=(out,), daemon=True).start()


if os.environ.get("PROBE_OUT") and _matches():
    _start()
    os.register_at_fork(after_in_child=_start)
