"""A stand-in for the control plane's agent endpoints, written from docs/agent-protocol.md.

It is a peer of the agent in unit tests only (the lead's end-to-end tests use the real Django
endpoints). It applies reports the way the protocol says (atomic, seq-checked, snapshot replaces,
cleared empties first) so tests can compare what it holds with the agent's residency, and it
serves jobs over long-poll and records job events.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import msgpack

from wire.protocol import decode_key, key_hex


class FakeControlPlane:
    def __init__(self, port: int = 0, enrolment_tokens: tuple[str, ...] = ("enrol-1",)):
        self.lock = threading.Condition()
        self.enrolment_tokens = set(enrolment_tokens)
        self.nodes: dict[str, int] = {}  # agent token -> node id
        self.last_seq: dict[int, int] = {}
        self.boot: dict[int, str] = {}
        self.reports: list[dict[str, Any]] = []
        self.residency: dict[tuple[int, str], dict[tuple[str, str], list[Any]]] = {}
        self.snapshot_requests: dict[int, list[str]] = {}
        self.jobs: dict[int, list[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.hostnames: dict[int, str] = {}
        self.port = port
        self.httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Go down: the port stops answering (connections refused)."""
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def node_id(self, hostname: str) -> int:
        return next(n for n, h in self.hostnames.items() if h == hostname)

    def assign(self, node_id: int, job: dict[str, Any]) -> None:
        with self.lock:
            self.jobs.setdefault(node_id, []).append({"type": "job.assign", "job": job})
            self.lock.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 20.0) -> bool:
        end = time.monotonic() + timeout
        with self.lock:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(left)
            return True

    def results(self, job_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("job_id") == job_id and e["type"] == "job.result"]

    # -- protocol ---------------------------------------------------------------------------
    def apply_report(self, node: int, report: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        seq = report["seq"]
        last = self.last_seq.get(node, 0)
        new_boot = self.boot.get(node) not in (None, report["boot_id"])
        snapshot_only = all(r["mode"] == "snapshot" for r in report["residency"])
        if seq <= last and not (new_boot and snapshot_only):
            return 409, {
                "error": "stale_seq",
                "detail": "seq not greater",
                "field": "seq",
                "last_seq": last,
            }
        for entry in report["residency"]:
            held = self.residency.setdefault((node, entry["engine_id"]), {})
            if entry["mode"] == "snapshot" or entry["cleared"]:
                held.clear()
            # Keys as the agent's JSON form (hex), whichever encoding carried them, as the real
            # control plane accepts both.
            for key, parent, medium, flags in entry["stored"]:
                key, parent = _hex(key), None if parent is None else _hex(parent)
                held[(key, medium)] = [key, parent, medium, flags]
            for key, medium in entry["removed"]:
                held.pop((_hex(key), medium), None)
        self.last_seq[node] = seq
        self.boot[node] = report["boot_id"]
        self.reports.append(report)
        self.lock.notify_all()
        return 200, {
            "applied_seq": seq,
            "snapshot_requested": self.snapshot_requests.pop(node, []),
            "server_time": time.time(),
        }


def _hex(key: Any) -> str:
    return key_hex(decode_key(key, "key"))


def _handler(cp: FakeControlPlane) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            # No keep-alive: stop() must look like a dead control plane to every client.
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> Any:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Type", "").startswith("application/msgpack"):
                return msgpack.unpackb(raw, raw=False)
            return json.loads(raw or b"{}")

        def _node(self) -> int | None:
            auth = self.headers.get("Authorization", "")
            return cp.nodes.get(auth.removeprefix("Bearer "))

        def do_POST(self) -> None:
            path = urlparse(self.path).path
            body = self._body()
            with cp.lock:
                if path == "/api/agents/enrol/":
                    tok = body.get("enrolment_token")
                    if tok not in cp.enrolment_tokens:
                        return self._reply(
                            403,
                            {"error": "invalid_token", "detail": "no", "field": "enrolment_token"},
                        )
                    cp.enrolment_tokens.discard(tok)
                    node = len(cp.nodes) + 1
                    token = f"pwa_node{node}"
                    cp.nodes[token] = node
                    cp.hostnames[node] = body.get("hostname")
                    cp.lock.notify_all()
                    return self._reply(
                        201, {"node_id": node, "agent_token": token, "report_interval_s": None}
                    )
                node = self._node()
                if node is None:
                    return self._reply(401, {"error": "unauthorized", "detail": "", "field": None})
                if path == "/api/agents/report/":
                    return self._reply(*cp.apply_report(node, body))
                if path == "/api/agents/heartbeat/":
                    cp.heartbeats += 1
                    return self._reply(200, {"server_time": time.time()})
                if path.startswith("/api/agents/jobs/") and path.endswith("/events/"):
                    cp.events.append({**body, "node": node})
                    cp.lock.notify_all()
                    return self._reply(200, {})
            self._reply(404, {"error": "not_found", "detail": path, "field": None})

        def do_GET(self) -> None:
            url = urlparse(self.path)
            node = self._node()
            if node is None:
                return self._reply(401, {"error": "unauthorized", "detail": "", "field": None})
            if url.path == "/api/agents/jobs/":
                wait = float(parse_qs(url.query).get("wait", ["0"])[0])
                with cp.lock:
                    cp.lock.wait_for(lambda: cp.jobs.get(node), timeout=min(wait, 2.0))
                    out = cp.jobs.pop(node, [])
                return self._reply(200, out)
            self._reply(404, {"error": "not_found", "detail": url.path, "field": None})

    return Handler
