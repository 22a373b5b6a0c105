"""Hand the C allocator's free memory back to the system now and then (glibc's ``malloc_trim``).

Why: the web process parses request-record batches of up to several MiB (JSON, then DRF
validation: hundreds of thousands of small objects at once) on whichever of its many threads
runs the view. glibc's allocator keeps what those peaks freed in the threads' arenas, mostly
as free chunks between live ones, which it returns to the system only at the top of the main
heap. Measured in the burst demo (experiments/demo-memory): the web process's Python heap stayed
at 16-98 MiB traced while its allocator held 130-170 MiB free, so RSS sat at the high-water mark
of the largest peaks and rose with each new one. ``malloc_trim(0)`` walks every arena and
releases the free pages inside them (``madvise``), not only the top: RSS then follows what is in
use. A trim walks the free chunks, holding one arena's lock at a time: on the shared 2-core
machine at load average 50, 0.5 s after 300 MB was freed, 55 ms when nothing new was.

Before the first trim, ``start`` also fixes glibc's mmap threshold (``mallopt``): a block of
at least ``PREWARM_MALLOC_MMAP_THRESHOLD_BYTES`` (128 KiB, glibc's own starting value) is mapped
on its own and unmapped when freed. glibc otherwise raises the threshold to the size of each
mapped block freed (up to 32 MiB), after which numpy and pandas arrays of a forecast come from the
heap and leave it fragmented around the small blocks that outlive them; a trim cannot hand back
a page with one live block on it. Measured in the services demo (experiments/demo-memory): the
Celery pool child's RSS climbed 0.87 MB a minute with glibc's moving threshold (its heap held
24 MB free) and -0.09 with it fixed (4 MB free), two demos side by side.

The web process, the Celery workers, the virtual cluster and the node agent each start it. No
Django here (the agent's image ships this package): the caller passes the period
(``PREWARM_MALLOC_TRIM_SECONDS``). Not glibc (musl, macOS): nothing to call, nothing started.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)
_lock = threading.Lock()
_thread: threading.Thread | None = None
_trimmed = threading.Event()  # set after the thread's first trim


def _libc_call(name: str):
    """glibc's ``name``, or None (no glibc: nothing to call)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_trim = _libc_call("malloc_trim")


def available() -> bool:
    return _trim is not None


def trim() -> bool:
    """Release the allocator's free memory now; True when glibc released some."""
    return bool(_trim(0)) if _trim is not None else False


def _loop(every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        trim()
        _trimmed.set()


def wait_for_trim(timeout_s: float) -> bool:
    """Block until the thread has trimmed once (False at ``timeout_s``): for tests."""
    return _trimmed.wait(timeout_s)


#: How often a process trims when ``PREWARM_MALLOC_TRIM_SECONDS`` is unset, seconds.
DEFAULT_EVERY_S = 60.0


def every_s_from_env(environ) -> float:
    """``PREWARM_MALLOC_TRIM_SECONDS`` from ``environ`` (``DEFAULT_EVERY_S`` when unset; 0: never),
    for processes without Django's settings; the settings read the same variable and default."""
    raw = environ.get("PREWARM_MALLOC_TRIM_SECONDS") or DEFAULT_EVERY_S
    try:
        every_s = float(raw)
    except ValueError:
        every_s = float("nan")
    if every_s != every_s or every_s == float("inf"):  # NaN, a word, or forever
        raise ValueError(f"PREWARM_MALLOC_TRIM_SECONDS: seconds (0: never), not {raw!r}")
    return every_s


_mallopt = _libc_call("mallopt")
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h

#: Blocks this large or larger are mapped on their own when ``PREWARM_MALLOC_MMAP_THRESHOLD_BYTES``
#: is unset (glibc's own starting threshold, which it then no longer raises).
DEFAULT_MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold(nbytes: int) -> bool:
    """Map blocks of at least ``nbytes`` on their own, and stop glibc moving that threshold up;
    True when glibc took it. 0: leave glibc's moving threshold alone."""
    if nbytes <= 0 or _mallopt is None:
        return False
    return bool(_mallopt(_M_MMAP_THRESHOLD, int(nbytes)))


def mmap_threshold_from_env(environ) -> int:
    """``PREWARM_MALLOC_MMAP_THRESHOLD_BYTES`` from ``environ`` (``DEFAULT_MMAP_THRESHOLD_BYTES``
    when unset; 0: glibc's own moving threshold). glibc takes at most 32 MiB."""
    raw = environ.get("PREWARM_MALLOC_MMAP_THRESHOLD_BYTES") or DEFAULT_MMAP_THRESHOLD_BYTES
    try:
        nbytes = int(raw)
    except ValueError:
        nbytes = -1
    if not 0 <= nbytes <= 32 * 1024 * 1024:
        raise ValueError(
            f"PREWARM_MALLOC_MMAP_THRESHOLD_BYTES: bytes from 0 to 33554432, not {raw!r}"
        )
    return nbytes


def start(
    every_s: float,
    stop: threading.Event | None = None,
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD_BYTES,
) -> threading.Thread | None:
    """Fix the mmap threshold at ``mmap_threshold`` bytes (0: glibc's moving one), then trim every
    ``every_s`` seconds from a daemon thread; once per process (a second call returns the
    running thread). None when ``every_s`` is 0 or less or there is no glibc."""
    global _thread
    fix_mmap_threshold(mmap_threshold)
    if every_s <= 0 or not available():
        return None
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(
                target=_loop,
                args=(every_s, stop or threading.Event()),
                name="malloc-trim",
                daemon=True,
            )
            _thread.start()
            log.info("returning free heap memory to the system every %g s", every_s)
        return _thread
