"""HTTP endpoints the agents read: each node's GPUs and each engine's vLLM-style ``/metrics``
and OpenAI-compatible completions.

``GET /nodes/<node>/gpus`` is the simulated GPU source document of ``docs/agent.md``
(``gpu_sim_source``); ``GET /engines/<engine_id>/metrics`` is Prometheus text with the vLLM
series the agent scrapes (``nodeagent/engine_metrics.py``). The cluster's loop replaces the
documents; request threads only read them.

``POST /engines/<engine_id>/v1/completions`` answers as vLLM's OpenAI server does, for the
``warmup`` executor: the prompt (token ids) is handed to ``on_completion`` (the cluster), which
blocks until the engine has prefilled it in sim time and returns the reply (with
``usage.prompt_tokens_details.cached_tokens``) or raises ``ValueError`` for a 400.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 64 << 20


class Endpoints:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_completion: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    ):
        self.gpus: dict[str, bytes] = {}
        self.metrics: dict[str, bytes] = {}
        self.ready = False  # /healthz answers 200 once the agents' configurations are written
        self.on_completion = on_completion
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                parts = self.path.strip("/").split("/")
                n = int(self.headers.get("Content-Length") or 0)
                if (
                    len(parts) != 4
                    or parts[0] != "engines"
                    or parts[2:] != ["v1", "completions"]
                    or outer.on_completion is None
                    or n > MAX_BODY
                ):
                    self.send_error(404 if n <= MAX_BODY else 413)
                    return
                try:
                    req = json.loads(self.rfile.read(n))
                    self._reply(200, outer.on_completion(parts[1], req))
                except (ValueError, KeyError, TypeError) as exc:
                    self._reply(
                        400,
                        {
                            "object": "error",
                            "message": str(exc),
                            "type": "BadRequestError",
                            "code": 400,
                        },
                    )

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                parts = self.path.strip("/").split("/")
                body, kind = None, "application/json"
                if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "gpus":
                    body = outer.gpus.get(parts[1])
                elif len(parts) == 3 and parts[0] == "engines" and parts[2] == "metrics":
                    body, kind = outer.metrics.get(parts[1]), "text/plain; version=0.0.4"
                elif parts == ["healthz"] and outer.ready:
                    body = b'{"ok": true}'
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass  # agents poll every second: no access log

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="vc-http", daemon=True
        )
        self.thread.start()

    def set_gpus(self, node: str, doc: dict) -> None:
        self.gpus[node] = json.dumps(doc).encode()

    def set_metrics(self, engine_id: str, values: dict[str, float], model: str) -> None:
        lines = []
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", values["running"]),
            ("vllm:num_requests_waiting", "gauge", values["waiting"]),
            ("vllm:kv_cache_usage_perc", "gauge", values["kv_usage"]),
            ("vllm:prefix_cache_queries_total", "counter", values["queries"]),
            ("vllm:prefix_cache_hits_total", "counter", values["hits"]),
        ):
            base = name[:-6] if name.endswith("_total") else name
            lines.append(f"# TYPE {base} {kind}")
            lines.append(f'{name}{{model_name="{model}",engine="0"}} {value}')
        self.metrics[engine_id] = ("\n".join(lines) + "\n").encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
