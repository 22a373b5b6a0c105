"""The web process and workers give the allocator's free memory back: RSS follows what is in use."""

import os
import subprocess
import sys
import textwrap

import pytest

from nodeagent import memtrim

pytestmark = pytest.mark.skipif(not memtrim.available(), reason="no glibc malloc_trim here")

# In a child process, so the arenas measured are its own: 100 MB of 1 KiB strings (malloc's,
# not pymalloc's), all but every 64th freed (what stays keeps the freed chunks from the top of
# the heap, as a live request's objects do), then RSS before and after the trimming ``CALL``.
CHILD = textwrap.dedent(
    """
    import sys
    from nodeagent import memtrim

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


def test_a_period_that_is_not_a_number_is_refused_by_name():
    assert memtrim.every_s_from_env({}) == memtrim.DEFAULT_EVERY_S
    assert memtrim.every_s_from_env({"PREWARM_MALLOC_TRIM_SECONDS": "0"}) == 0
    for bad in ("soon", "nan", "inf"):
        with pytest.raises(ValueError, match="PREWARM_MALLOC_TRIM_SECONDS"):
            memtrim.every_s_from_env({"PREWARM_MALLOC_TRIM_SECONDS": bad})


# The agent's entry point with the agent itself replaced by a wait for the first trim: its
# subscriber, tap and transfer threads leave freed chunks in their own arenas as the web's do.
AGENT = textwrap.dedent(
    """
    import sys
    from nodeagent import agent, cli, memtrim

    agent.run_agent = lambda cfg: 0 if memtrim.wait_for_trim(60) else 1
    sys.exit(cli.main(["--control-plane-url", "http://127.0.0.1:9", "--state-dir", sys.argv[1]]))
    """
)


def run_agent_entry(tmp_path, every: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREWARM_MALLOC_TRIM_SECONDS": every}
    argv = [sys.executable, "-c", AGENT, str(tmp_path)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90)


def test_the_agent_trims_on_its_own_and_refuses_a_bad_period(tmp_path):
    assert run_agent_entry(tmp_path, "0.05").returncode == 0
    bad = run_agent_entry(tmp_path, "soon")
    assert bad.returncode == 2 and "PREWARM_MALLOC_TRIM_SECONDS" in bad.stderr, bad.stderr


# After a mapped 1 MiB block is freed, glibc's moving threshold takes a 512 KiB block from the
# heap; with the threshold fixed it is mapped on its own (``hblkhd``: bytes in mapped blocks).
MAPPED = textwrap.dedent(
    """
    import ctypes, sys
    from nodeagent import memtrim

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    memtrim.start(0, mmap_threshold=int(sys.argv[1]))
    libc.free(libc.malloc(1 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(512 << 10)
    print(libc.mallinfo2().hblkhd - before)
    libc.free(block)
    """
)


def mapped_bytes_of_a_512k_block(threshold: int) -> int:
    argv = [sys.executable, "-c", MAPPED, str(threshold)]
    return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def test_a_fixed_threshold_keeps_large_blocks_out_of_the_heap():
    assert mapped_bytes_of_a_512k_block(0) == 0  # glibc's moving threshold: from the heap
    assert mapped_bytes_of_a_512k_block(memtrim.DEFAULT_MMAP_THRESHOLD_BYTES) >= 512 << 10


def test_a_threshold_out_of_range_is_refused_by_name():
    assert memtrim.mmap_threshold_from_env({}) == memtrim.DEFAULT_MMAP_THRESHOLD_BYTES
    for bad in ("big", "-1", str(64 << 20)):
        with pytest.raises(ValueError, match="PREWARM_MALLOC_MMAP_THRESHOLD_BYTES"):
            memtrim.mmap_threshold_from_env({"PREWARM_MALLOC_MMAP_THRESHOLD_BYTES": bad})
