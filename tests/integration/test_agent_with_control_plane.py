"""A real agent process reports real vLLM events to a real control plane, through an outage."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from harness.event_publisher import TestPublisher
from harness.live import LiveControlPlane
from harness.processes import Proc, wait_for
from tests.agent.conftest import load_messages

pytestmark = pytest.mark.slow


@pytest.fixture
def plane(tmp_path):
    cp = LiveControlPlane(tmp_path)
    cp.manage("migrate", "-v0")
    cp.manage("ensure_user", "ops", "--password", "pw-123456789", "--role", "operator")
    yield cp.start()
    cp.close()


def engine_blocks(cp: LiveControlPlane, token: str) -> dict:
    resp = httpx.get(
        f"{cp.url}/api/engines/", headers={"Authorization": f"Bearer {token}"}, timeout=5
    )
    resp.raise_for_status()
    return {e["engine_id"]: e["blocks"] for e in resp.json()["results"]}


def user_token(cp: LiveControlPlane) -> str:
    code = (
        "from django.contrib.auth.models import User; from controlplane.accounts.models import ApiToken;"
        "print(ApiToken.issue('user', 't', user=User.objects.get(username='ops'))[1])"
    )
    return cp.manage("shell", "--no-imports", "-c", code).splitlines()[-1]


def test_agent_reports_real_events_and_loses_nothing_while_control_plane_is_down(plane, tmp_path):
    frames, expected = load_messages("0.33.0")
    pub = TestPublisher()
    gpu_file = tmp_path / "gpus.json"
    gpu_file.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-sim-0",
                        "name": "Virtual H100",
                        "memory_total": 80 << 30,
                        "memory_used": 60 << 30,
                        "memory_free": 20 << 30,
                    }
                ]
            }
        )
    )
    enrol = plane.manage("create_enrolment_token")
    engine = (
        f"engine_id=vllm-0,kv_events={pub.endpoint},replay={pub.replay_endpoint},"
        f"topic={expected['topic']},block_size={expected['block_size']},bytes_per_block=65536,"
        "kv_capacity_blocks=4096,gpu_uuids=GPU-sim-0"
    )
    agent = Proc(
        "agent",
        [
            sys.executable,
            "-m",
            "nodeagent",
            "--control-plane-url",
            plane.url,
            "--enrolment-token",
            enrol,
            "--hostname",
            "node-int",
            "--state-dir",
            str(tmp_path / "agent"),
            "--gpu-source",
            "simulated",
            "--gpu-sim-source",
            str(gpu_file),
            "--engine",
            engine,
            "--report-interval-s",
            "0.2",
            "--metrics-listen",
            "",
            "--jobs-transport",
            "none",
            "--transfer-listen",
            "",
            "--backoff-max-s",
            "1",
        ],
        None,
        tmp_path,
        stop_timeout_s=10,
    ).start()
    try:
        token = user_token(plane)
        wait_for(
            lambda: "vllm-0" in engine_blocks(plane, token), 30, what="the engine to be reported"
        )
        half = len(frames) // 2
        for topic, seq, payload in frames[:half]:
            pub.publish(topic, int.from_bytes(seq, "big"), payload)
        wait_for(lambda: engine_blocks(plane, token)["vllm-0"], 20, what="first half applied")
        plane.stop()
        for topic, seq, payload in frames[half:]:
            pub.publish(topic, int.from_bytes(seq, "big"), payload)
        import time

        time.sleep(3)  # the agent spools while nobody answers
        plane.start()
        want = len(expected["resident_after_all"])
        wait_for(
            lambda: sum(engine_blocks(plane, token)["vllm-0"].values()) == want,
            30,
            what=f"{want} resident blocks after the outage",
        )
        assert agent.alive(), "the agent must survive the outage"
    finally:
        agent.stop()
        pub.close()
        print((tmp_path / "agent.log").read_text()[-3000:])
