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

No Django here: the caller passes the period (``PREWARM_MALLOC_TRIM_SECONDS``). Not glibc (musl,
macOS): nothing to call, nothing started.
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


def _libc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # no glibc: nothing to trim with
        return None


_trim = _libc_trim()


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
    return float(environ.get("PREWARM_MALLOC_TRIM_SECONDS") or DEFAULT_EVERY_S)


def start(every_s: float, stop: threading.Event | None = None) -> threading.Thread | None:
    """Trim every ``every_s`` seconds from a daemon thread; once per process (a second call
    returns the running thread). None when ``every_s`` is 0 or less or there is no glibc."""
    global _thread
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
