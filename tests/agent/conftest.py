"""Fixtures for the node agent tests: real vLLM messages, a ZMQ publisher, a fake control plane."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgpack
import pytest

from tests.agent.fake_control_plane import FakeControlPlane

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("PREWARM_SHARED_DATA", REPO.parent / "shared" / "data"))
EVENTS = SHARED / "vllm-kv-events"
VERSIONS = ["0.10.1", "0.33.0"]


def load_messages(version: str) -> tuple[list[list[bytes]], dict]:
    frames = msgpack.unpackb((EVENTS / f"vllm-{version}.frames.msgpack").read_bytes())
    expected = json.loads((EVENTS / f"vllm-{version}.expected.json").read_text())
    return frames, expected


@pytest.fixture
def control_plane():
    cp = FakeControlPlane(enrolment_tokens=("enrol-1", "enrol-2", "enrol-3"))
    yield cp
    cp.stop()
