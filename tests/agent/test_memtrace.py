"""Heap snapshots for a diagnostic run: written where asked, and the report names what grew."""

import inspect
import tracemalloc

import pytest

from nodeagent import memtrace


@pytest.fixture
def tracing():
    was = tracemalloc.is_tracing()
    yield
    if not was:
        tracemalloc.stop()


def test_the_report_names_the_line_that_grew(tmp_path, tracing):
    snapper = memtrace.Snapshotter(tmp_path, "node-a", frames=2)
    tracemalloc.start(2)
    snapper.snapshot()
    snapper.snapshot()
    line = inspect.currentframe().f_lineno + 1
    kept = [bytes(1000) + bytes([i % 256]) for i in range(3000)]  # the grower: ~3 MB
    snapper.snapshot()
    assert sorted(p.name for p in tmp_path.iterdir())[-1].endswith("-0002.snap")
    text = memtrace.report(tmp_path, top=3)
    lines = text.splitlines()
    assert lines[0].startswith("== node-a (pid ")
    # The top grower is the list comprehension above (its line), about 3 MB.
    assert lines[1].endswith(f"tests/agent/test_memtrace.py:{line}"), lines[1]
    assert float(lines[1].split()[0]) > 2900  # KiB
    assert len(kept) == 3000


def test_off_without_a_folder_and_a_bad_value_is_refused(tmp_path):
    assert memtrace.start_from_env("node-a", {}) is None
    with pytest.raises(ValueError, match="PREWARM_TRACEMALLOC_EVERY_S"):
        memtrace.start_from_env(
            "node-a",
            {"PREWARM_TRACEMALLOC_DIR": str(tmp_path), "PREWARM_TRACEMALLOC_EVERY_S": "soon"},
        )
