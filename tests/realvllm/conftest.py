"""Real vLLM engines (CPU build, tiny model made on the spot) for the tests in this folder.

Two engines are started once per session, each pinned to its own core, and stopped at the end.
``vllm_engines`` gives them as one whose KV-event socket vLLM binds (``tcp://*:P``: the agent
connects) and one whose socket vLLM connects (``tcp://127.0.0.1:P``: the agent binds);
``routed_engines`` gives both with the socket bound, as vllm-router (which connects) needs. An
engine a test left the other way is restarted that way first (a minute), so tests that need the
same shape in a row pay for nothing. If an engine cannot
be had (no ``.venv-vllm``, an engine that dies or never gets healthy) every test here fails
under CI=true and is skipped elsewhere, with one line saying why.
"""

from __future__ import annotations

import os

import pytest

from harness.live import LiveControlPlane
from harness.realvllm.engine import (
    EngineUnavailable,
    VllmEngine,
    ensure_model,
    vllm_python,
)
from tests.realvllm.helpers import user_token


def unavailable(reason: str) -> None:
    line = f"real vLLM engine unavailable: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(line, pytrace=False)
    pytest.skip(line)


@pytest.fixture(scope="session")
def engine_pair(tmp_path_factory):
    """{"bind": engine whose publisher binds, "connect": engine whose publisher connected at
    start}: use ``vllm_engines`` or ``routed_engines``, which say what each test needs."""
    log_dir = tmp_path_factory.mktemp("vllm")
    engines: dict[str, VllmEngine] = {}
    try:
        try:
            python = vllm_python()
            ensure_model(python=python)
            engines = {
                "bind": VllmEngine("vllm-a", log_dir, events="bind", cpu_cores="0"),
                "connect": VllmEngine(
                    "vllm-b",
                    log_dir,
                    events="connect",
                    cpu_cores="1" if (os.cpu_count() or 1) > 1 else "0",
                ),
            }
            for e in engines.values():
                e.start()
            for e in engines.values():
                e.wait_ready()
        except EngineUnavailable as exc:
            unavailable(str(exc))
        for e in engines.values():
            print(f"{e.name}: ready in {e.ready_s:.1f} s, {e.rss_bytes() / 2**30:.2f} GiB resident")
        yield engines
    finally:
        for e in engines.values():
            e.stop()


def _in_shape(engines, shape: dict[str, str]):
    try:
        for side, events in shape.items():
            engines[side].use_events(events)
    except EngineUnavailable as exc:
        unavailable(str(exc))
    return engines


@pytest.fixture
def vllm_engines(engine_pair):
    """{"bind": engine whose publisher binds, "connect": engine whose publisher connects}."""
    return _in_shape(engine_pair, {"bind": "bind", "connect": "connect"})


@pytest.fixture
def routed_engines(engine_pair):
    """The two engines, both publishers bound: vllm-router's SUB sockets connect to them."""
    engines = _in_shape(engine_pair, {"bind": "bind", "connect": "bind"})
    return engines["bind"], engines["connect"]


# The e2e harness's cadences: ticks every second, jobs retried after a second.
FAST = {
    "PREWARM_TICK_SECONDS": "1",
    "PREWARM_SWEEP_SECONDS": "1",
    "PREWARM_SCORE_SECONDS": "2",
    "PREWARM_MARK_STALE_SECONDS": "2",
    "PREWARM_JOB_REDELIVER_SECONDS": "3",
    "PREWARM_JOB_BACKOFF_SECONDS": "1",
    "PREWARM_JOB_ATTEMPT_SECONDS": "60",
    "PREWARM_EMBEDDED_WORKER": "true",
    "CELERY_TASK_ALWAYS_EAGER": "false",
    "PREWARM_HOLDOUT_FRACTION": "0",  # the one item is copied, not held out
}


@pytest.fixture
def worker_plane(tmp_path):
    """A control plane with its Celery worker and beat in the web process, at FAST cadences,
    an admin's token (``cp.token``) and a gateway token (``cp.gateway``)."""
    cp = LiveControlPlane(tmp_path, env=FAST)
    cp.manage("migrate", "-v0")
    cp.manage("ensure_user", "ops", "--password", "pw-123456789", "--role", "admin")
    cp.start()
    cp.token = user_token(cp)
    cp.gateway = cp.manage(
        "shell",
        "--no-imports",
        "-c",
        "from controlplane.accounts.models import ApiToken; "
        "print(ApiToken.issue('gateway', 'gw')[1])",
    ).splitlines()[-1]
    yield cp
    cp.close()


@pytest.fixture
def plane(tmp_path):
    cp = LiveControlPlane(tmp_path)
    cp.manage("migrate", "-v0")
    cp.manage("ensure_user", "ops", "--password", "pw-123456789", "--role", "admin")
    cp.start()
    cp.token = user_token(cp)
    yield cp
    cp.close()
