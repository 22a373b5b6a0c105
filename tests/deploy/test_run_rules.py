"""The run's rules themselves: a skip fails CI and `make test`, an opt-out is named in the summary
and refused under CI, exit 5 after an on-purpose deselection is not a failure."""

import os
import subprocess
import sys

import pytest

from harness.processes import REPO

pytestmark = pytest.mark.slow  # each case starts a pytest process

SUITE = """
import pytest

def test_needs_something():
    pytest.skip("needs a thing that is not here")

@pytest.mark.browser
def test_in_a_browser():
    pass
"""


@pytest.fixture
def run(tmp_path):
    (tmp_path / "test_sample.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    browser: b\n")

    def run(*args, **env):
        base = {
            k: v
            for k, v in os.environ.items()
            if k
            not in ("CI", "PREWARM_TEST_STRICT", "PREWARM_TEST_WITHOUT", "DJANGO_SETTINGS_MODULE")
        }
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "tests.run_rules",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:django",
                "-q",
                *args,
                str(tmp_path),
            ],
            cwd=REPO,
            env={**base, "PYTHONPATH": str(REPO), **env},
            capture_output=True,
            text=True,
        )

    return run


def test_a_skip_is_a_skip_for_a_developer_and_a_failure_under_ci(run):
    assert run().returncode == 0
    ci = run(CI="true")
    assert ci.returncode == 1 and "1 failed, 1 passed" in ci.stdout
    assert (
        "needs a thing that is not here" in ci.stdout and "fails the run under CI=true" in ci.stdout
    )
    assert run(PREWARM_TEST_STRICT="1").returncode == 1  # what `make test` sets


def test_an_opt_out_is_named_and_refused_under_ci(run):
    out = run("-k", "browser", PREWARM_TEST_WITHOUT="browser")
    assert out.returncode == 0  # everything left was left out on purpose: exit 5 is not a failure
    assert "LEFT OUT on purpose (PREWARM_TEST_WITHOUT): 1 browser test" in out.stdout
    refused = run(PREWARM_TEST_WITHOUT="browser", CI="true")
    assert refused.returncode == 4 and "under CI=true every test runs" in refused.stderr
    assert run("-k", "nothing_matches", CI="true").returncode == 5  # CI: nothing ran is a failure
