"""The whole system as separate processes, for end-to-end tests and ``bench/e2e.py``.

``Cluster`` starts, on production settings (its own PostgreSQL database and its own
``redis-server`` on a free port, so faults never touch the shared Redis) or on the embedded
default (SQLite, in-process worker and beat):
  daphne (web), ``celery worker -Q default,forecast,forecast-slow,plan,dispatch`` and ``celery beat``,
  and one real ``python -m nodeagent`` process per node with a simulated GPU source, a file
  block store and one engine whose KV events come from a ZMQ publisher in vLLM's wire format.
The first node's engine holds the burst's prefix (its events say so and its block store has the
bytes), so a plan copies it from there. The other engines load the KV their agent copies into
their block store, as an engine's connector loads external KV, and only then say so in their
own KV events (``CopyLoader``): a copy is confirmed by what actually arrived, never by the test.
Everything it starts is stopped by ``close()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgpack
import websockets

from controlplane.core import blockhash
from controlplane.core.protocol import SOCKET_MESSAGE_MAX_BYTES
from nodeagent.blockstore import FileBlockStore
from tests.agent.vllm_publisher import TestPublisher
from tests.live import REPO, free_port, wait_for
from tests.workflow import burst

logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll drowns a failure
PG_URL = os.environ.get("PREWARM_E2E_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
BYTES_PER_BLOCK = 64 * 1024
PASSWORD = "e2e-pass-123456789"
SECRET = "e2e-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz"
QUEUES = "default,forecast,forecast-slow,plan,dispatch"


class Proc:
    """One child process with its own log; restartable, killable by signal."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.p = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process group (a worker's pool children die with it)."""
        if self.alive():
            os.killpg(self.p.pid, sig)
            self.p.wait(15)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(sql)


class EngineMetricsServer:
    """The engine's vLLM ``/metrics``: a busy engine (KV 80% used, 12 requests running), as a
    burst finds it; an idle one with ``running=0``."""

    def __init__(self, kv_usage: float = 0.5, running: int = 12):
        self.kv_usage = kv_usage
        self.running = running
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = (
                    f'vllm:kv_cache_usage_perc{{model_name="{burst.MODEL}"}} {outer.kv_usage}\n'
                    f'vllm:num_requests_running{{model_name="{burst.MODEL}"}} {outer.running}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Node:
    name: str
    publisher: TestPublisher
    store_dir: Path
    metrics_port: int
    transfer_port: int
    engine_metrics: EngineMetricsServer
    proc: Proc | None = None
    seq: int = 0
    loader: CopyLoader | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one publisher, two threads

    def _hash(self, key: int) -> int:
        return hash((self.name, key)) & (2**63 - 1)  # the engine's own block hash

    def _publish(self, event: list) -> None:
        with self.lock:
            self.seq += 1
            self.publisher.publish(b"kv", self.seq, msgpack.packb([time.time(), [event], 0]))

    def publish_stored(self, tokens: list[int], block_size: int = burst.BLOCK) -> list[int]:
        """The engine stores a chain (vLLM's positional BlockStored); returns its canonical keys."""
        keys = blockhash.chain_keys(tokens, block_size)
        hashes = [self._hash(k) for k in keys]
        self._publish(["BlockStored", hashes, None, tokens, block_size, None, "GPU"])
        return keys

    def publish_removed(self, keys: list[int]) -> None:
        """The engine evicts blocks (vLLM's positional BlockRemoved)."""
        self._publish(["BlockRemoved", [self._hash(k) for k in keys], "GPU"])

    def metrics(self) -> dict[str, float]:
        """The agent's /metrics as {'name{labels}': value}; {} while it is down."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return {}
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


class CopyLoader(threading.Thread):
    """A target engine's side of a copy: it loads the burst prefix's blocks that its agent
    wrote into its block store, from the chain's root, each only if its bytes are the source's
    (what the copy had to move), and then publishes them in its KV events, as vLLM does once its
    connector loaded external KV; blocks that leave the store (an evict job) it publishes as
    removed. What the control plane confirms is therefore what the agent really copied."""

    def __init__(self, node: Node, source_bytes: dict[int, bytes], interval_s: float = 0.1):
        super().__init__(name=f"copy-loader-{node.name}", daemon=True)
        self.node, self.source_bytes, self.interval_s = node, source_bytes, interval_s
        self.store = FileBlockStore(node.store_dir)
        self.loaded = 0  # blocks of the prefix, from its root, the engine holds
        self.stop = threading.Event()
        self.loading = threading.Event()  # cleared: the engine loads nothing yet (a test's pause)
        self.loading.set()

    def depth(self) -> int:
        for i, key in enumerate(burst.PREFIX):
            try:
                if bytes(self.store.read(key)) != self.source_bytes[key]:
                    return i
            except (FileNotFoundError, KeyError, ValueError):
                return i
        return len(burst.PREFIX)

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            if not self.loading.is_set():
                continue
            depth = self.depth()
            if depth > self.loaded:
                self.node.publish_stored(burst.PREFIX_TOKENS[: depth * burst.BLOCK])
            elif depth < self.loaded:
                self.node.publish_removed(burst.PREFIX[depth : self.loaded])
            self.loaded = depth


class Cluster:
    """Control plane processes + agents + engines; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        nodes: int = 3,
        services: bool = True,
        env: dict | None = None,
        rate_limit_bytes_per_s: int = 0,
    ):
        self.dir, self.services = workdir, services
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rate_limit = rate_limit_bytes_per_s
        self.n_nodes = nodes
        self.db = f"prewarm_e2e_{uuid.uuid4().hex[:10]}"
        self.redis_port = free_port()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "PYTHONUNBUFFERED": "1",
            "PREWARM_DATA_DIR": str(self.dir),
            "SECRET_KEY": SECRET,
            "PREWARM_SECURE": "false",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PREWARM_TICK_SECONDS": "1",
            "PREWARM_SWEEP_SECONDS": "1",
            "PREWARM_SCORE_SECONDS": "2",
            "PREWARM_MARK_STALE_SECONDS": "2",
            "PREWARM_JOB_REDELIVER_SECONDS": "3",
            "PREWARM_JOB_BACKOFF_SECONDS": "1",
            "PREWARM_JOB_ATTEMPT_SECONDS": "20",
            "PREWARM_NODE_STALE_SECONDS": "10",
            "PREWARM_DASHBOARD_COALESCE_SECONDS": "0.05",
            "PREWARM_HOLDOUT_FRACTION": "0",  # every approved item copied: the test counts them
            "CELERY_TASK_ALWAYS_EAGER": "false",
        }
        for k in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "RESIDENCY_REDIS_URL"):
            self.env.pop(k, None)
        if services:
            self.env["DATABASE_URL"] = PG_URL.rsplit("/", 1)[0] + f"/{self.db}"
            self.env["REDIS_URL"] = f"redis://127.0.0.1:{self.redis_port}/0"
        else:
            self.env["PREWARM_EMBEDDED_WORKER"] = "true"
        self.env.update(env or {})
        self.redis: Proc | None = None
        self.web: Proc | None = None
        self.worker: Proc | None = None
        self.beat: Proc | None = None
        self.nodes: list[Node] = []
        self.admin_token = ""
        self.gateway_token = ""
        self.source_bytes: dict[int, bytes] = {}

    # -- the product's bounds, for the tests' ceilings -----------------------------------------
    def setting(self, name: str) -> float:
        """A control-plane setting as this cluster's processes see it (env, else the default)."""
        from django.conf import settings

        return float(self.env.get(name, getattr(settings, name)))

    def job_bound_s(self) -> float:
        """How long a live job can take to end, by the product's own rules: every attempt runs
        out its attempt deadline (``PREWARM_JOB_ATTEMPT_SECONDS``), the sweep (every
        ``PREWARM_SWEEP_SECONDS``) notices, and the backoff before the next attempt passes."""
        from django.conf import settings

        sweep = float(
            self.env.get("PREWARM_SWEEP_SECONDS", settings.PREWARM_SCHEDULE["sweep_jobs"])
        )
        attempt, base = (
            self.setting("PREWARM_JOB_ATTEMPT_SECONDS"),
            self.setting("PREWARM_JOB_BACKOFF_SECONDS"),
        )
        most = self.setting("PREWARM_JOB_BACKOFF_MAX_SECONDS")
        return sum(
            attempt + sweep + min(most, base * 2 ** (n - 1))
            for n in range(1, int(self.setting("PREWARM_JOB_MAX_ATTEMPTS")) + 1)
        )

    def job_ceiling_s(self) -> float:
        """What a test waits at most for jobs to end: twice the bound, since on a loaded machine
        the sweep itself runs late. A passing test never waits for it."""
        return 2 * self.job_bound_s()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Cluster:
        if self.services:
            self.start_redis()
            pg_admin(f'CREATE DATABASE "{self.db}"')
        self.manage("migrate", "-v0")
        self.manage("ensure_user", "ops", "--password", PASSWORD, "--role", "admin")
        self.admin_token = self.shell(
            "from django.contrib.auth.models import User; from controlplane.accounts.models import ApiToken;"
            "print(ApiToken.issue('user', 'e2e', user=User.objects.get(username='ops'))[1])"
        )
        self.gateway_token = self.shell(
            "from controlplane.accounts.models import ApiToken; print(ApiToken.issue('gateway', 'gw')[1])"
        )
        self.web = Proc(
            "web",
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "--websocket-max-message-size",
                str(SOCKET_MESSAGE_MAX_BYTES),
                "controlplane.asgi:application",
            ],
            self.env,
            self.dir,
        )
        self.start_web()
        if self.services:
            self.worker = Proc(
                "worker",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "controlplane.celery",
                    "worker",
                    "-Q",
                    QUEUES,
                    "-c",
                    "2",
                    "-l",
                    "INFO",
                    "-n",
                    f"e2e-{self.db}@%h",
                ],
                self.env,
                self.dir,
            ).start()
            self.beat = Proc(
                "beat",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "controlplane.celery",
                    "beat",
                    "-l",
                    "WARNING",
                    "-s",
                    str(self.dir / "beat-schedule"),
                ],
                self.env,
                self.dir,
            ).start()
        for i in range(self.n_nodes):
            self.nodes.append(self._start_node(i))
        wait_for(lambda: len(self.engines()) == self.n_nodes, 60, what="every engine reported")
        self._engines_store_their_blocks()
        for node in self.nodes[1:]:  # the engines a copy can go to
            node.loader = CopyLoader(node, self.source_bytes)
            node.loader.start()
        return self

    def _engines_store_their_blocks(self) -> None:
        """Each engine publishes what it holds once its agent listens (a PUB socket drops what
        nobody subscribed to yet, so publish again until the control plane has it)."""
        chains = self.chains

        def reported() -> bool:
            for node in self.nodes:
                self.republish(node)
            time.sleep(1.0)
            blocks = {e["node_name"]: sum(e["blocks"].values()) for e in self.engines().values()}
            return all(
                blocks.get(n.name, 0) >= len(chains[n.name]) // burst.BLOCK for n in self.nodes
            )

        wait_for(reported, 60, interval=0, what="every engine's blocks in residency")

    def start_redis(self) -> None:
        if self.redis is None:
            self.redis = Proc(
                "redis",
                [
                    "redis-server",
                    "--port",
                    str(self.redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                ],
                self.env,
                self.dir,
            )
        self.redis.start()
        wait_for(
            lambda: (
                subprocess.run(
                    ["redis-cli", "-p", str(self.redis_port), "ping"],
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                == "PONG"
            ),
            20,
            what="redis-server up",
        )

    def start_web(self) -> None:
        self.web.start()

        def up():
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, what=f"daphne up: {self.web.tail(500)}")

    def close(self) -> None:
        for node in self.nodes:
            if node.loader:
                node.loader.stop.set()
                node.loader.join(5)
            if node.proc:
                node.proc.stop()
            node.publisher.close()
            node.engine_metrics.close()
        for p in (self.beat, self.worker, self.web, self.redis):
            if p:
                p.stop()
        if self.services:
            try:
                pg_admin(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            except Exception as exc:  # never hide the test's own failure behind cleanup
                print(f"dropping {self.db} failed: {exc}")

    def logs(self) -> str:
        procs = [self.web, self.worker, self.beat] + [n.proc for n in self.nodes]
        return "\n".join(f"== {p.name}\n{p.tail()}" for p in procs if p)

    # -- nodes --------------------------------------------------------------------------------
    def _start_node(self, i: int) -> Node:
        name = f"node-{i}"
        # The source (node-0, holding the burst's prefix) is busy, the others have room: where a
        # replica pays, and the planner targets no engine above its max_load (0.7).
        node = Node(
            name,
            TestPublisher(),
            self.dir / name / "blocks",
            free_port(),
            free_port(),
            # The holder is busy; the others idle, with room: where a replica pays.
            EngineMetricsServer(0.85) if i == 0 else EngineMetricsServer(0.3, running=0),
        )
        node.store_dir.mkdir(parents=True, exist_ok=True)
        gpus = self.dir / name / "gpus.json"
        gpus.write_text(
            json.dumps(
                {
                    "gpus": [
                        {
                            "index": 0,
                            "uuid": f"GPU-sim-{i}",
                            "name": "Virtual H100",
                            "memory_total": 80 << 30,
                            "memory_used": 60 << 30,
                        }
                    ]
                }
            )
        )
        if i == 0:  # the source: the engine holds the burst's prefix and the store its bytes
            store = FileBlockStore(node.store_dir)
            for n, key in enumerate(burst.PREFIX):
                data = (
                    blockhash.to_hex(key).encode() * (BYTES_PER_BLOCK // 16)
                    if n % 2
                    else os.urandom(BYTES_PER_BLOCK)
                )
                store.write(key, data)
                self.source_bytes[key] = data
        enrol = self.manage("create_enrolment_token")
        engine = (
            f"engine_id=vllm-0,kv_events={node.publisher.endpoint},replay={node.publisher.replay_endpoint},"
            f"topic=kv,block_size={burst.BLOCK},bytes_per_block={BYTES_PER_BLOCK},"
            f"kv_capacity_blocks=100000,gpu_uuids=GPU-sim-{i},model={burst.MODEL},"
            f"metrics_url={node.engine_metrics.url}"
        )
        argv = [
            sys.executable,
            "-m",
            "nodeagent",
            "--control-plane-url",
            self.url,
            "--enrolment-token",
            enrol,
            "--hostname",
            name,
            "--state-dir",
            str(self.dir / name / "state"),
            "--gpu-source",
            "simulated",
            "--gpu-sim-source",
            str(gpus),
            "--engine",
            engine,
            "--report-interval-s",
            "0.2",
            "--heartbeat-interval-s",
            "2",
            "--engine-metrics-interval-s",
            "1",
            "--metrics-listen",
            f"127.0.0.1:{node.metrics_port}",
            "--jobs-transport",
            "websocket",
            "--transfer-listen",
            f"127.0.0.1:{node.transfer_port}",
            "--transfer-advertise",
            f"127.0.0.1:{node.transfer_port}",
            "--transfer-block-store",
            "files",
            "--transfer-block-store-path",
            str(node.store_dir),
            "--backoff-max-s",
            "1",
            "--transfer-rate-limit-bytes-per-s",
            str(self.rate_limit),
            "--transfer-chunk-bytes",
            str(BYTES_PER_BLOCK),
        ]
        node.proc = Proc(f"agent-{name}", argv, self.env, self.dir).start()
        return node

    @property
    def chains(self) -> dict[str, list[int]]:
        """The tokens each engine holds from the start: the first the burst's prefix."""
        return {
            n.name: burst.PREFIX_TOKENS if i == 0 else [(i * 1000 + t) % 32000 for t in range(64)]
            for i, n in enumerate(self.nodes)
        }

    def republish(self, node: Node) -> None:
        """The engine says again what it holds (after its agent restarted and lost the events)."""
        node.publish_stored(self.chains[node.name])

    def restart_agent(self, node: Node) -> None:
        node.proc.start()

    def node_of_engine(self, engine_pk: int) -> Node:
        engine = next(e for e in self.engines().values() if e["id"] == engine_pk)
        return self.node_of(int(engine["endpoints"]["transfer"].rpartition(":")[2]))

    # -- control plane access -----------------------------------------------------------------
    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed: {out.stderr[-2000:]}")
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""

    def shell(self, code: str) -> str:
        return self.manage("shell", "--no-imports", "-c", code)

    def api(self, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)

    def get(self, path: str) -> dict | list:
        resp = self.api("GET", path)
        resp.raise_for_status()
        return resp.json()

    def results(self, path: str) -> list[dict]:
        data = self.get(path)
        return data["results"] if isinstance(data, dict) and "results" in data else data

    def engines(self) -> dict[str, dict]:
        try:
            return {
                e["endpoints"]["transfer"]: e for e in self.results("/api/engines/?page_size=500")
            }
        except httpx.HTTPError:
            return {}

    def post_records(self, records: list[dict]) -> dict:
        resp = self.api(
            "POST", "/api/request-records/", self.gateway_token, json={"records": records}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    def post_burst(self) -> dict:
        """The recorded burst, ending just before the current demand bucket (never near its end,
        where the forecast could run in the next, empty bucket)."""
        if time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)
        return self.post_records(burst.records(time.time()))

    def activate_policy(self, mode: str = "auto", **kw) -> dict:
        data = {
            "name": f"e2e-{mode}",
            "active": True,
            "mode": mode,
            "min_confidence": 0.0,
            "horizon_seconds": 300,
            "replica_ttl_seconds": 3600,
            **kw,
        }
        resp = self.api("POST", "/api/policies/", json=data)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def node_of(self, transfer_port: int) -> Node:
        return next(n for n in self.nodes if n.transfer_port == transfer_port)

    def login_cookie(self) -> str:
        """A browser's session: the login form, CSRF token and all."""
        with httpx.Client(base_url=self.url, timeout=10) as c:
            page = c.get("/login/")
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            resp = c.post(
                "/login/",
                data={"username": "ops", "password": PASSWORD, "csrfmiddlewaretoken": csrf},
                headers={"Referer": f"{self.url}/login/"},
            )
            assert resp.status_code in (200, 302), resp.text[:500]
            return f"sessionid={c.cookies['sessionid']}"


class DashboardClient:
    """A session-authenticated ``ws/dashboard/`` client in its own thread; reconnects when the
    control plane goes away, records every message with its arrival time."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.cookie = cluster.login_cookie()
        self.messages: list[tuple[float, dict]] = []
        self.connects = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        url = self.cluster.url.replace("http", "ws", 1) + "/ws/dashboard/"
        headers = {"Cookie": self.cookie, "Origin": self.cluster.url}
        while not self._stop.is_set():
            try:
                async with websockets.connect(
                    url, additional_headers=headers, open_timeout=5
                ) as ws:
                    self.connects += 1
                    while not self._stop.is_set():
                        try:
                            raw = await asyncio.wait_for(ws.recv(), 0.5)
                        except TimeoutError:
                            continue
                        self.messages.append((time.time(), json.loads(raw)))
            except (OSError, websockets.WebSocketException, TimeoutError):
                await asyncio.sleep(0.3)

    def seen(self, needle: str, since: float = 0.0) -> bool:
        """Whether a message after ``since`` mentions ``needle`` (a message type or a value)."""
        return any(needle in json.dumps(m) for t, m in self.messages if t >= since)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
