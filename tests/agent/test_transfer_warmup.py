"""The ``warmup`` executor against a stand-in of vLLM's OpenAI-compatible /v1/completions.

The stand-in answers as vLLM does (``usage.prompt_tokens`` and, with
``--enable-prompt-tokens-details``, ``usage.prompt_tokens_details.cached_tokens``: full blocks
already cached). A real vLLM CPU engine runs these requests in the real-engine fixture's tests.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.processes import free_port
from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job
from nodeagent.transfers.warmup import WarmupTransport

TOKENS = [(7 * i + 3) % 2000 for i in range(300)]


class FakeVllm:
    """/v1/completions with vLLM's reply shape; remembers what it computed (32-token blocks)."""

    def __init__(self, status: int = 200, block: int = 32):
        self.requests: list[dict] = []
        self.cached: set[tuple[int, ...]] = set()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                if self.path != "/v1/completions" or status != 200:
                    self.send_response(status if status != 200 else 404)
                    out = json.dumps({"error": {"message": "maximum context length is 256 tokens"}})
                else:
                    prompt = body["prompt"]
                    blocks = [tuple(prompt[: (i + 1) * block]) for i in range(len(prompt) // block)]
                    hit = sum(1 for b in blocks if b in fake.cached) * block
                    fake.cached.update(blocks)
                    self.send_response(200)
                    out = json.dumps(
                        {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "choices": [{"index": 0, "text": " w7", "finish_reason": "length"}],
                            "usage": {
                                "prompt_tokens": len(prompt),
                                "completion_tokens": 1,
                                "total_tokens": len(prompt) + 1,
                                "prompt_tokens_details": {"cached_tokens": hit},
                            },
                        }
                    )
                data = out.encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def vllm():
    fake = FakeVllm()
    yield fake
    fake.close()


def job(**kw) -> Job:
    msg = {
        "id": "j-1",
        "role": "target",
        "transport": "warmup",
        "keys": [],
        "source": {"engine_id": "vllm-a", "kv_peer": ""},
        "target": {"engine_id": "vllm-b"},
        "tokens": TOKENS,
        "block_size": 32,
        **kw,
    }
    return Job.from_message(msg)


def engine(url: str, **kw) -> EngineConfig:
    return EngineConfig(
        engine_id="vllm-b",
        kv_events="tcp://127.0.0.1:1",
        model="/models/tiny",
        served_model_name="tiny",
        openai_url=url,
        **kw,
    )


def test_prefill_only_request_lands_and_reports_cached_tokens(vllm):
    t = WarmupTransport({"vllm-b": engine(vllm.url)})
    store = MemoryBlockStore(1 << 20)
    first = t.receive(job(), store, lambda n: None)
    assert first.ok and first.bytes == 0, first.error  # recomputed: no bytes crossed a link
    assert vllm.requests[0] == {
        "model": "tiny",
        "prompt": TOKENS,
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
    }
    assert first.extra["prompt_tokens"] == 300 and first.extra["cached_tokens"] == 0
    again = t.receive(job(), store, lambda n: None)
    assert again.ok and again.extra["cached_tokens"] == 288  # full blocks only, as vLLM reports
    assert t.send(job(role="source"), store, lambda n: None).ok  # the source has nothing to do


def test_pull_from_the_source_peer_when_configured(vllm):
    t = WarmupTransport({"vllm-b": engine(vllm.url, warmup_pull=True)})
    r = t.receive(
        job(source={"engine_id": "vllm-a", "kv_peer": "10.0.0.7:5710"}),
        MemoryBlockStore(1),
        lambda n: None,
    )
    assert r.ok, r.error
    assert vllm.requests[0]["kv_transfer_params"] == {
        "remote_kv_source": {
            "kv_request_id": "prewarm-j-1-1",
            "remote_host": "10.0.0.7",
            "remote_port": 5710,
        }
    }
    # Without a peer endpoint on the source it recomputes.
    t.receive(job(), MemoryBlockStore(1), lambda n: None)
    assert "kv_transfer_params" not in vllm.requests[1]


def test_errors_say_what_went_wrong(vllm):
    store = MemoryBlockStore(1)
    assert (
        "no openai_url"
        in WarmupTransport({"vllm-b": engine("")}).receive(job(), store, print).error
    )
    assert "not configured" in WarmupTransport({}).receive(job(), store, print).error
    assert (
        "no token ids"
        in WarmupTransport({"vllm-b": engine(vllm.url)}).receive(job(tokens=[]), store, print).error
    )
    refused = f"http://127.0.0.1:{free_port()}"
    err = WarmupTransport({"vllm-b": engine(refused)}).receive(job(), store, print).error
    assert "did not answer" in err and refused in err
    bad = FakeVllm(status=400)
    try:
        err = WarmupTransport({"vllm-b": engine(bad.url)}).receive(job(), store, print).error
        assert "HTTP 400" in err and "maximum context length" in err
    finally:
        bad.close()
    with pytest.raises(ValueError, match="token ids"):
        job(tokens=[1, -2])
