"""CLI configuration errors, and the lmcache transport against the controller's HTTP shapes."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import ConfigError, load_config
from nodeagent.transfers.base import Job
from nodeagent.transfers.lmcache import LmcacheTransport

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
    cfg = load_config(["--control-plane-url", "http://cp", "--state-dir", "/s", "--engine",
                       "engine_id=a,kv_events=tcp://127.0.0.1:5557,kv_events_socket=bind,block_size=32"],
                      env={})
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
            ["--control-plane-url", "http://cp", "--state-dir", "/s", "--engine",
             "engine_id=a,kv_events=tcp://127.0.0.1:5557,kv_events_socket=listen"],
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


class Controller:
    """LMCache controller's /move and /check_finish request/response shapes (api_server)."""

    def __init__(self, finish_after=2, fail=False):
        self.moves, self.checks = [], 0
        ctl = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/move":
                    ctl.moves.append(body)
                    out = {"event_id": "Move-1", "num_tokens": len(body["tokens"])}
                else:
                    ctl.checks += 1
                    done = ctl.checks >= finish_after
                    out = {"status": ("failed" if fail else "completed") if done else "running"}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.mark.parametrize("fail", [False, True])
def test_lmcache_move_copy_then_poll(fail):
    ctl = Controller(fail=fail)
    job = Job(
        "j",
        "replicate",
        "target",
        "lmcache",
        [1],
        bytes=100,
        deadline=time.time() + 10,
        lmcache={
            "controller_url": ctl.url,
            "old_position": ["inst1", "LocalCPUBackend"],
            "new_position": ["inst2", "LocalCPUBackend"],
            "tokens": [1, 2, 3],
        },
    )
    res = LmcacheTransport(poll_s=0.01).receive(job, MemoryBlockStore(), lambda n: None)
    assert ctl.moves == [
        {
            "old_position": ["inst1", "LocalCPUBackend"],
            "new_position": ["inst2", "LocalCPUBackend"],
            "tokens": [1, 2, 3],
            "copy": True,
        }
    ]
    assert res.ok is (not fail) and ctl.checks == 2
    ctl.httpd.shutdown()
