"""The real LMCache 0.5.6 processes, started from their own environment (``make lmcache-env``).

``lmcache_cluster``: the controller (``lmcache.v1.api_server``) and two standalone engines
(``lmcache.v1.standalone --device cpu``, real LMCacheEngines without vLLM or a GPU), instances
``A`` and ``B``, with a short pin lease so that a lapse can be watched.

``lmcache_mp``: the coordinator (``lmcache.v1.mp_coordinator``), two multiprocess servers
(``lmcache.v1.multiprocess.http_server``, CPU) ``mp-a`` and ``mp-b`` that report their cache
events to it and share a file-system L2 tier, and an engine's KV worker registered with both
(``mp_worker.py``), which stores the KV of token sequences on a server as a prefill would.

Every address is on loopback (``launch.py`` patches LMCache's outward-address lookup). Without
the environment the tests skip, and under ``CI=true`` they fail: nothing is skipped there.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.processes import REPO, Proc, free_port, wait_for

LMCACHE_PY = REPO / ".venv-lmcache" / "bin" / "python"
LAUNCH = Path(__file__).parent / "launch.py"
MP_WORKER = Path(__file__).parent / "mp_worker.py"
MP_MODEL = "test-model"  # the model mp_worker.py registers (LMCache's bench model)
PIN_TIMEOUT_S = 6  # the engines' pin_timeout_sec (LMCache's default is 300)
PIN_CHECK_S = 1
START_S = 180  # an engine imports torch and LMCache and registers: ~20 s on an idle 2-core machine
CHUNK = 256


def need_lmcache_env() -> None:
    if LMCACHE_PY.exists():
        return
    why = f"{LMCACHE_PY} is missing: run `make lmcache-env`"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def lmcache_proc(name: str, argv: list[str], log_dir: Path) -> Proc:
    """One LMCache module run by ``launch.py`` in LMCache's own environment."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
    return Proc(name, [str(LMCACHE_PY), str(LAUNCH), *argv], env, log_dir, stop_timeout_s=10.0)


@dataclass
class LmcacheCluster:
    url: str  # the controller
    engines: dict[str, int] = field(default_factory=dict)  # instance -> internal API port
    procs: list[Proc] = field(default_factory=list)

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def key_count(self, instance: str) -> int:
        resp = httpx.get(
            f"{self.url}/controller/workers", params={"instance_id": instance}, timeout=10
        )
        return (
            sum(w["key_count"] for w in resp.json().get("workers", []))
            if resp.status_code == 200
            else 0
        )

    def store(self, instance: str, start: int, end: int) -> int:
        """Store KV for mock tokens ``range(start, end)`` on an engine; returns its key count.
        An engine skips stores for a few seconds after it (re)registers: store until the
        controller counts the chunks."""
        want = self.key_count(instance) + (end - start) // CHUNK
        url = f"http://127.0.0.1:{self.engines[instance]}/cache/store"

        def stored() -> bool:
            try:  # the engine registers before its internal API listens
                httpx.post(url, params={"tokens_mock": f"{start},{end}"}, timeout=30)
            except httpx.HTTPError:
                return False
            return self.key_count(instance) >= want

        wait_for(stored, 60, interval=1.0, what=f"{end - start} tokens stored on {instance}")
        return self.key_count(instance)

    def pinned(self, instance: str) -> int | None:
        """The objects the engine's pin monitor holds pinned (``lmcache:pin_monitor_pinned_objects
        _count`` on its internal API, read live): 0 once every lease on it lapsed."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.engines[instance]}/metrics", timeout=10).text
        except httpx.HTTPError:
            return None
        for line in text.splitlines():
            if line.startswith("lmcache:pin_monitor_pinned_objects_count"):
                return int(float(line.rpartition(" ")[2]))
        return None

    def clear(self, instance: str) -> int:
        resp = self.post("/clear", {"instance_id": instance, "location": "LocalCPUBackend"})
        resp.raise_for_status()
        return resp.json()["num_tokens"]


def _engine_config(path: Path, instance: str, pull: int, reply: int) -> int:
    api = free_port()
    path.write_text(
        "\n".join(
            [
                "chunk_size: 256",
                "local_cpu: true",
                "max_local_cpu_size: 0.05",
                "enable_controller: true",
                f'lmcache_instance_id: "{instance}"',
                f'controller_pull_url: "127.0.0.1:{pull}"',
                f'controller_reply_url: "127.0.0.1:{reply}"',
                f"lmcache_worker_ports: [{free_port()}]",
                "lmcache_worker_heartbeat_time: 3",
                "enable_p2p: true",
                'p2p_host: "127.0.0.1"',
                f"p2p_init_ports: [{free_port()}]",
                f"p2p_lookup_ports: [{free_port()}]",
                'transfer_channel: "mock_memory"',
                "internal_api_server_enabled: true",
                'internal_api_server_host: "127.0.0.1"',
                # Worker 0's internal API listens at port_start + 1.
                f"internal_api_server_port_start: {api - 1}",
                "enable_kv_events: true",
                f"pin_timeout_sec: {PIN_TIMEOUT_S}",
                f"pin_check_interval_sec: {PIN_CHECK_S}",
                "",
            ]
        )
    )
    return api


@pytest.fixture(scope="session")
def lmcache_cluster(tmp_path_factory):
    need_lmcache_env()
    work = tmp_path_factory.mktemp("lmcache")
    http, pull, reply, beat = (free_port() for _ in range(4))
    cluster = LmcacheCluster(f"http://127.0.0.1:{http}")
    ctl = lmcache_proc(
        "controller",
        [
            "lmcache.v1.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(http),
            "--monitor-ports",
            f'{{"pull": {pull}, "reply": {reply}, "heartbeat": {beat}}}',
        ],
        work,
    ).start()
    cluster.procs.append(ctl)
    try:

        def answers() -> bool:
            assert ctl.alive(), ctl.tail()
            try:
                return cluster.post("/query_worker_info", {"instance_id": "all"}).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, START_S, interval=0.5, what="the LMCache controller")
        for instance in ("A", "B"):
            cfg = work / f"{instance}.yaml"
            cluster.engines[instance] = _engine_config(cfg, instance, pull, reply)
            cluster.procs.append(
                lmcache_proc(
                    instance,
                    ["lmcache.v1.standalone", "--config", str(cfg), "--device", "cpu"],
                    work,
                ).start()
            )
        for proc in cluster.procs[1:]:

            def registered(proc=proc) -> bool:
                assert proc.alive(), proc.tail()
                infos = cluster.post("/query_worker_info", {"instance_id": proc.name}).json()[
                    "worker_infos"
                ]
                return bool(infos)

            wait_for(
                registered, START_S, interval=0.5, what=f"LMCache engine {proc.name} registered"
            )
        yield cluster
    finally:
        for proc in reversed(cluster.procs):
            proc.stop()


def tokens(start: int, end: int) -> list[int]:
    return list(range(start, end))


@pytest.fixture(scope="session")
def lmcache_coordinator(tmp_path_factory):
    """The real coordinator (``lmcache.v1.mp_coordinator``); yields its URL."""
    need_lmcache_env()
    work = tmp_path_factory.mktemp("coordinator")
    port = free_port()
    proc = lmcache_proc(
        "coordinator",
        ["lmcache.v1.mp_coordinator", "--host", "127.0.0.1", "--port", str(port)],
        work,
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.alive(), proc.tail()
            try:
                return httpx.get(url + "/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, START_S, interval=0.5, what="the LMCache coordinator")
        yield url
    finally:
        proc.stop()


@dataclass
class LmcacheMp:
    coordinator: str  # its URL
    servers: dict[str, int] = field(default_factory=dict)  # instance -> request (ZMQ) port
    worker: Proc | None = None

    def store(self, instance: str, tokens: list[int]) -> None:
        """The engine on ``instance`` prefills ``tokens``: the server stores their KV (whole
        chunks) in its L1 and the shared L2, and reports it to the coordinator."""
        assert self.worker is not None and self.worker.stdin
        server = list(self.servers).index(instance)
        self.worker.stdin.write(json.dumps({"server": server, "tokens": tokens}) + "\n")
        self.worker.stdin.flush()
        answer = json.loads(self.worker.readline() or "{}")
        assert answer.get("ok"), answer

    def directory(self, tokens: list[int]) -> list[set[tuple[str, str]]]:
        """Per chunk of ``tokens``, the (instance, tier) placements the directory lists."""
        doc = httpx.post(
            self.coordinator + "/directory/lookup",
            json={"token_ids": tokens, "model_name": MP_MODEL, "world_size": 1},
            timeout=10,
        ).json()
        return [{(p["instance_id"], p["tier"]) for p in r["placements"]} for r in doc["results"]]


@pytest.fixture(scope="session")
def lmcache_mp(lmcache_coordinator, tmp_path_factory):
    work = tmp_path_factory.mktemp("lmcache-mp")
    (work / "l2").mkdir()
    mp = LmcacheMp(lmcache_coordinator)
    procs: list[Proc] = []
    try:
        for instance in ("mp-a", "mp-b"):
            mp.servers[instance] = port = free_port()
            procs.append(
                lmcache_proc(
                    instance,
                    [
                        "lmcache.v1.multiprocess.http_server",
                        *("--instance-id", instance, "--host", "127.0.0.1", "--port", str(port)),
                        *("--http-host", "127.0.0.1", "--http-port", str(free_port())),
                        *("--l1-size-gb", "0.1", "--eviction-policy", "LRU"),
                        *(
                            "--l2-adapter",
                            json.dumps({"type": "fs", "base_path": str(work / "l2")}),
                        ),
                        *("--coordinator-url", lmcache_coordinator),
                        *("--coordinator-advertise-ip", "127.0.0.1"),
                        "--coordinator-event-reporting",
                        *("--coordinator-event-flush-interval", "0.2"),
                    ],
                    work,
                ).start()
            )

        def registered() -> bool:
            for proc in procs:
                assert proc.alive(), proc.tail()
            listed = httpx.get(lmcache_coordinator + "/instances", timeout=5).json()["instances"]
            return {i["instance_id"] for i in listed} >= set(mp.servers)

        wait_for(registered, START_S, interval=0.5, what="the MP servers registered")
        mp.worker = Proc(
            "worker",
            [str(LMCACHE_PY), str(MP_WORKER)]
            + [f"tcp://127.0.0.1:{port}" for port in mp.servers.values()],
            {**os.environ, "PYTHONHASHSEED": "0", "LMCACHE_DISABLE_BANNER": "1"},
            work,
            pipe=True,
        ).start()
        ready = mp.worker.readline()
        assert json.loads(ready or "{}").get("ready"), mp.worker.tail()
        yield mp
    finally:
        if mp.worker is not None:
            try:  # its stdin closed, it unregisters its KV caches and exits
                mp.worker.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                mp.worker.kill()
        for proc in reversed(procs):
            proc.stop()
