"""Diagnostic probe, not product code: where the web process's memory is, from inside it.

Put this folder first on ``PYTHONPATH`` of a demo (``python -m harness.demo``) with ``PROBE_OUT``
set to a file: the daphne process (no other) appends a JSON line every ``PROBE_EVERY_S`` (30)
seconds with its RSS and anonymous RSS (``/proc/self/status``), the RSS of its ``[heap]`` and of
its other anonymous mappings (``/proc/self/smaps``), glibc's ``mallinfo2`` (``arena``: bytes
the allocator holds outside mmapped chunks, ``uord``: in use, ``ford``: free), tracemalloc's
traced total (``PROBE_TRACE=1``, one frame, from 30 s on), pymalloc's allocated blocks and the
thread count. ``PROBE_TRIM_AT=600,900``: at those seconds it calls ``malloc_trim(0)`` once and
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


def _is_web() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return any(b"daphne" in a for a in f.read().split(b"\0"))
    except OSError:
        return False


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


if os.environ.get("PROBE_OUT") and _is_web():
    threading.Thread(target=_run, args=(os.environ["PROBE_OUT"],), daemon=True).start()
