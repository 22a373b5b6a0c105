"""Real vLLM engines (CPU build, tiny model made on the spot) for the tests in this folder.

``vllm_engines`` starts two engines once per session, one whose KV-event socket vLLM binds
(``tcp://*:P``: the agent connects) and one whose socket vLLM connects (``tcp://127.0.0.1:P``:
the agent binds), each pinned to its own core, and stops both at the end. If an engine cannot
be had (no ``.venv-vllm``, an engine that dies or never gets healthy) every test here fails
under CI=true and is skipped elsewhere, with one line saying why.
"""

from __future__ import annotations

import os

import pytest

from controlplane.harness.live import LiveControlPlane
from controlplane.harness.realvllm.engine import (
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
def vllm_engines(tmp_path_factory):
    """{"bind": engine whose publisher binds, "connect": engine whose publisher connects}."""
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


@pytest.fixture
def plane(tmp_path):
    cp = LiveControlPlane(tmp_path)
    cp.manage("migrate", "-v0")
    cp.manage("ensure_user", "ops", "--password", "pw-123456789", "--role", "admin")
    cp.start()
    cp.token = user_token(cp)
    yield cp
    cp.close()
