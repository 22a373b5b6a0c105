"""The test run's rules (a pytest plugin, loaded by tests/conftest.py): under CI=true (and in
`make test`, which sets PREWARM_TEST_STRICT=1) a skipped test fails the run, since a skip there
means something the suite needs (chromium, PostgreSQL, Redis, an engine) was not there. A developer leaves tests out on purpose, by marker, with
PREWARM_TEST_WITHOUT=browser[,...]: they are deselected and the summary names them."""

import os

import pytest

from tests.prereqs import left_out


def _ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _strict() -> bool:
    return _ci() or os.environ.get("PREWARM_TEST_STRICT", "") == "1"


_LEFT_OUT: dict[str, int] = {}


def pytest_configure(config):
    if left_out() and _ci():
        raise pytest.UsageError(
            f"PREWARM_TEST_WITHOUT={','.join(sorted(left_out()))} is a developer's "
            "opt-out; under CI=true every test runs"
        )


def pytest_collection_modifyitems(config, items):
    without = left_out()
    if not without:
        return
    keep, drop = [], []
    for item in items:
        marks = {m.name for m in item.iter_markers()} & without
        (drop if marks else keep).append(item)
        for m in marks:
            _LEFT_OUT[m] = _LEFT_OUT.get(m, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and _strict() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"{reason}\n(skipped, and a skip fails the run under CI=true and `make test`: "
            "install what it needs, or leave it out on purpose with PREWARM_TEST_WITHOUT=<marker>)"
        )
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _LEFT_OUT:
        what = ", ".join(
            f"{n} {m} test{'s' if n != 1 else ''}" for m, n in sorted(_LEFT_OUT.items())
        )
        terminalreporter.write_line(
            f"LEFT OUT on purpose (PREWARM_TEST_WITHOUT): {what}", yellow=True
        )


def pytest_sessionfinish(session, exitstatus):
    # Exit 5 (no tests ran) after everything selected was left out on purpose, or deselected by
    # this half's marker expression, is not a failure outside CI: nothing was asked to run here.
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and not _ci():
        if _LEFT_OUT or session.config.option.markexpr:
            session.exitstatus = pytest.ExitCode.OK
