"""The ``lmcache-mp`` executor against the real LMCache coordinator, with a stand-in MP server.

The stand-in plays one LMCache multiprocess server: it registers with the coordinator, answers
the calls the coordinator proxies to it (``POST /cache/prefetches``, the status poll, ``DELETE
/cache/objects``) and reports what it stores and deletes as cache events in the coordinator's
own schema (``POST /events``), with the object keys the coordinator itself derives from the
token ids (its directory lookup names them). The directory then lists the copy, which is what
confirms it."""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job
from nodeagent.transfers.lmcache_mp import LmcacheMpTransport
from tests.lmcache.conftest import tokens

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]
MODEL = "tiny"


class StandInServer:
    """An MP server's HTTP face and its cache events, for one instance id."""

    def __init__(self, coordinator: str, instance: str):
        self.coordinator, self.instance = coordinator, instance
        self.seq = itertools.count(1)
        self.pending: dict[str, dict] = {}
        self.deleted: list[dict] = []
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
                )

            def do_POST(self):  # noqa: N802
                body = self._body()
                chunks = len(body["token_ids"]) // 256
                if not chunks:  # as an MP server answers a sequence shorter than one chunk
                    self._json(200, {"chunks": 0, "status": "noop"})
                    return
                rid = f"r{len(me.pending) + 1}"
                me.pending[rid] = body
                self._json(200, {"request_id": rid, "chunks": chunks, "status": "submitted"})

            def do_GET(self):  # noqa: N802
                rid = self.path.rstrip("/").rsplit("/", 1)[-1]
                body = me.pending.pop(rid, None)
                if body is None:
                    self._json(404, {"detail": "unknown request"})
                    return
                me.report("store", body["token_ids"], body["model_name"], body["world_size"])
                self._json(200, {"status": "completed"})

            def do_DELETE(self):  # noqa: N802
                body = self._body()
                me.deleted.append(body)
                me.events("delete", [{"key": k} for k in body["keys"]])
                self._json(200, {"deleted": len(body["keys"]), "skipped": 0})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        r = httpx.post(
            coordinator + "/instances",
            json={
                "instance_id": instance,
                "ip": "127.0.0.1",
                "http_port": self.http.server_address[1],
            },
            timeout=10,
        )
        r.raise_for_status()

    def events(self, kind: str, entries: list[dict]) -> None:
        batch = {
            "instance_id": self.instance,
            "incarnation": 0,
            "seq": next(self.seq),
            "event_type": kind,
            "tier": "l1",
            "backend": "dram",
            "entries": entries,
            "ts": time.time(),
        }
        httpx.post(
            self.coordinator + "/events", json={"batches": [batch]}, timeout=10
        ).raise_for_status()

    def report(self, kind: str, token_ids: list[int], model: str, world_size: int) -> None:
        look = httpx.post(
            self.coordinator + "/directory/lookup",
            json={"token_ids": token_ids, "model_name": model, "world_size": world_size},
            timeout=10,
        ).json()
        self.events(
            kind,
            [
                {
                    "key": r["key"],
                    "size_bytes": 4096,
                    "token_ids": token_ids[i * 256 : (i + 1) * 256],
                    "token_offset": i * 256,
                }
                for i, r in enumerate(look["results"])
            ],
        )

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def job(toks: list[int], action: str = "replicate") -> Job:
    return Job.from_message(
        {
            "id": "mp-1",
            "action": action,
            "role": "target",
            "transport": "lmcache-mp",
            "keys": [],
            "target": {"engine_id": "vllm-b"},
            "tokens": toks,
            "lmcache": {"model_name": MODEL, "target_instance": "mp-b"},
        }
    )


def directory(url: str, toks: list[int]) -> list[set[str]]:
    doc = httpx.post(
        url + "/directory/lookup",
        json={"token_ids": toks, "model_name": MODEL, "world_size": 1},
        timeout=10,
    ).json()
    return [{p["instance_id"] for p in r["placements"]} for r in doc["results"]]


def test_prefetch_is_confirmed_by_the_directory_pinned_and_deleted(lmcache_coordinator):
    url = lmcache_coordinator
    server = StandInServer(url, "mp-b")
    try:
        ex = LmcacheMpTransport(
            {
                "vllm-b": EngineConfig(
                    engine_id="vllm-b", kv_events="tcp://127.0.0.1:1", lmcache_instance_id="mp-b"
                )
            },
            url,
            poll_s=0.05,
        )
        toks = tokens(0, 768)
        assert directory(url, toks) == [set(), set(), set()]
        result = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
        assert result.ok, result.error
        assert result.extra["confirmation"] == {
            "by": "lmcache-directory",
            "tokens": 768,
            "before": 0,  # the directory listed nothing on mp-b before the prefetch
            "chunks": 3,
            "instance_id": "mp-b",
        }
        # A second prefetch of what the target already lists places nothing: the reading's
        # "before" equals what the plan asks for, which the control plane judges redundant.
        again = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
        assert again.ok and again.extra["confirmation"]["before"] == 768, again.extra
        assert directory(url, toks) == [{"mp-b"}] * 3
        assert httpx.get(url + "/cache/pins", timeout=10).status_code == 200
        # The replica ends: unpinned, and the server's copy deleted through the coordinator.
        gone = ex.evict(job(toks, action="evict"))
        assert gone.ok, gone.error
        assert server.deleted and len(server.deleted[0]["keys"]) == 3
        assert directory(url, toks) == [set(), set(), set()]
        # A wrong instance, and a prefix shorter than one chunk, say so.
        bad = LmcacheMpTransport({}, url).receive(
            Job.from_message(
                {
                    **job(toks).__dict__,
                    "id": "x",
                    "role": "target",
                    "lmcache": {"target_instance": "nope"},
                    "keys": [],
                }
            ),
            MemoryBlockStore(1),
            lambda n: None,
        )
        assert not bad.ok and "nope" in bad.error and "404" in bad.error, bad.error
        short = ex.receive(job(tokens(0, 100)), MemoryBlockStore(1), lambda n: None)
        assert not short.ok and "shorter than one" in short.error, short.error
    finally:
        server.close()
