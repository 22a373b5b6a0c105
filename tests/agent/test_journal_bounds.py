"""The agent's job journal answers recent jobs again and forgets old ones, in memory and on disk."""

import json

from nodeagent import jobs
from nodeagent.jobs import Journal


def result(i: int, state: str = "succeeded") -> dict:
    return {"type": "job.result", "job_id": f"job-{i}", "state": state, "attempt": 1}


def test_the_newest_are_kept_and_the_file_is_compacted(tmp_path):
    path = tmp_path / "jobs.journal"
    j = Journal(path, keep=10)
    for i in range(100):
        j.record(result(i))
    assert list(j.results) == [f"job-{i}" for i in range(90, 100)]
    assert j.get("job-99") == result(99) and j.get("job-5") is None
    lines = path.read_text().splitlines()
    assert len(lines) <= 20  # compacted whenever it reaches twice the kept
    again = Journal(path, keep=10)  # an agent restart reads the same answers back
    assert again.results == j.results
    assert len(path.read_text().splitlines()) == 10  # and compacts at start


def test_results_past_their_age_are_forgotten(tmp_path, monkeypatch):
    now = [1_000_000.0]
    monkeypatch.setattr(jobs.time, "time", lambda: now[0])
    path = tmp_path / "jobs.journal"
    j = Journal(path, keep=1000, keep_s=3600)
    j.record(result(1))
    now[0] += 1800
    j.record(result(2))
    now[0] += 1801  # job-1 is past the hour, job-2 is not
    j.record(result(3))
    assert list(j.results) == ["job-2", "job-3"]
    now[0] += 7200
    assert Journal(path, keep=1000, keep_s=3600).results == {}  # all old at the next start


def test_a_torn_line_and_old_lines_without_a_time_are_read(tmp_path):
    path = tmp_path / "jobs.journal"
    path.write_text(json.dumps(result(1)) + "\n" + '{"job_id": "job-2", "sta')
    j = Journal(path)
    assert j.get("job-1") == result(1) and j.get("job-2") is None
