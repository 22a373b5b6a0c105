"""CLI configuration errors and the engine options of the executors that reach real engines (the
``lmcache`` executor runs against the real LMCache controller in ``tests/lmcache``)."""

import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def test_flags_env_and_file_merge(tmp_path):
    f = tmp_path / "a.toml"
    f.write_text(
        'control_plane_url = "http://cp"\nstate_dir = "/s"\nreport_interval_s = 2\n'
        '[[engines]]\nengine_id = "vllm-0"\nkv_events = "tcp://127.0.0.1:5557"\n'
        "[transfer]\nretries = 5\n"
    )
    cfg = load_config(
        ["--config", str(f), "--report-interval-s", "0.5"],
        env={"PREWARM_AGENT_TRANSFER_RETRIES": "1"},
    )
    assert cfg.report_interval_s == 0.5 and cfg.transfer.retries == 1
    assert cfg.engines[0].engine_id == "vllm-0" and cfg.engines[0].block_size == 16
    assert cfg.engines[0].kv_events_socket == "connect"


def test_kv_events_socket_bind_for_an_engine_that_connects():
    cfg = load_config(
        [
            "--control-plane-url",
            "http://cp",
            "--state-dir",
            "/s",
            "--engine",
            "engine_id=a,kv_events=tcp://127.0.0.1:5557,kv_events_socket=bind,block_size=32",
        ],
        env={},
    )
    assert cfg.engines[0].kv_events_socket == "bind" and cfg.engines[0].block_size == 32


@pytest.mark.parametrize(
    "argv,msg",
    [
        ([], "control_plane_url is required"),
        (
            ["--control-plane-url", "http://cp", "--state-dir", "/s", "--report-interval-s", "x"],
            "not a valid float",
        ),
        (
            ["--control-plane-url", "http://cp", "--state-dir", "/s", "--engine", "engine_id=a"],
            "kv_events must be a ZMQ endpoint",
        ),
        (
            [
                "--control-plane-url",
                "http://cp",
                "--state-dir",
                "/s",
                "--engine",
                "engine_id=a,kv_events=tcp://127.0.0.1:5557,kv_events_socket=listen",
            ],
            "kv_events_socket 'listen' must be connect",
        ),
    ],
)
def test_config_errors(argv, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(argv, env={})


def test_cli_exits_nonzero_with_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "nodeagent", "--config", str(tmp_path / "no")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "does not exist" in out.stderr


def test_engine_endpoints_for_real_engine_executors():
    cfg = load_config(
        [
            "--control-plane-url",
            "http://cp",
            "--state-dir",
            "/s",
            "--lmcache-controller-url",
            "http://127.0.0.1:9000",
            "--engine",
            "engine_id=a,kv_events=tcp://127.0.0.1:1,openai_url=http://127.0.0.1:8000,"
            "served_model_name=tiny,kv_peer=127.0.0.1:5710,warmup_pull=true,lmcache_instance_id=A",
        ],
        env={},
    )
    e = cfg.engines[0]
    assert (e.openai_url, e.served_model_name, e.kv_peer, e.warmup_pull, e.lmcache_instance_id) == (
        "http://127.0.0.1:8000",
        "tiny",
        "127.0.0.1:5710",
        True,
        "A",
    )
    assert cfg.lmcache_controller_url == "http://127.0.0.1:9000"
    for bad, msg in (
        ("openai_url=localhost:8000", "openai_url must start"),
        ("kv_peer=nohost", "kv_peer"),
    ):
        with pytest.raises(ConfigError, match=msg):
            load_config(
                [
                    "--control-plane-url",
                    "http://cp",
                    "--state-dir",
                    "/s",
                    "--engine",
                    f"engine_id=a,kv_events=tcp://127.0.0.1:1,{bad}",
                ],
                env={},
            )
