"""The web process and workers give the allocator's free memory back: RSS follows what is in use."""

import subprocess
import sys
import textwrap

import pytest

from controlplane import memtrim

pytestmark = pytest.mark.skipif(not memtrim.available(), reason="no glibc malloc_trim here")

# In a child process, so the arenas measured are its own: 100 MB of 1 KiB strings (malloc's,
# not pymalloc's), all but every 64th freed (what stays keeps the freed chunks from the top of
# the heap, as a live request's objects do), then RSS before and after the trimming ``CALL``.
CHILD = textwrap.dedent(
    """
    import sys
    from controlplane import memtrim

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    blocks = [bytes(1024) + i.to_bytes(4, "little") for i in range(100_000)]
    kept = blocks[::64]
    del blocks
    before = rss_mb()
    CALL
    print(before, rss_mb(), len(kept))
    """
)


def run(call: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.replace("CALL", call)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return float(out[0]), float(out[1])


def test_a_trim_hands_back_what_was_freed():
    before, after = run("memtrim.trim()")
    assert before - after > 50, (before, after)  # ~98 of the 100 MB were freed


def test_the_thread_trims_on_its_own_and_starts_once():
    # Waits for the thread's first trim itself (the module's event), not a fixed time.
    call = textwrap.dedent(
        """
        t = memtrim.start(0.05)
        assert memtrim.start(0.05) is t
        assert memtrim.wait_for_trim(60)
        """
    )
    before, after = run(call)
    assert before - after > 50, (before, after)


def test_off_when_the_period_is_zero():
    assert memtrim.start(0) is None
