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

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from harness import burst
from harness.e2e.access import ControlPlaneAccess
from harness.e2e.engines import CopyLoader, EngineMetricsServer, Node
from harness.e2e.settings import BYTES_PER_BLOCK, PASSWORD, PG_URL, QUEUES, SECRET
from harness.event_publisher import TestPublisher
from harness.processes import (
    Proc,
    celery_beat_argv,
    celery_worker_argv,
    daphne_argv,
    free_port,
    pg_admin,
    wait_for,
)
from nodeagent.blockstore import FileBlockStore
from wire import blockhash

logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll drowns a failure


class Cluster(ControlPlaneAccess):
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
            pg_admin(PG_URL, f'CREATE DATABASE "{self.db}"')
        self.manage("migrate", "-v0")
        self.manage("ensure_user", "ops", "--password", PASSWORD, "--role", "admin")
        self.admin_token = self.shell(
            "from django.contrib.auth.models import User; from controlplane.accounts.models import ApiToken;"
            "print(ApiToken.issue('user', 'e2e', user=User.objects.get(username='ops'))[1])"
        )
        self.gateway_token = self.shell(
            "from controlplane.accounts.models import ApiToken; print(ApiToken.issue('gateway', 'gw')[1])"
        )
        self.web = Proc("web", daphne_argv("127.0.0.1", self.port), self.env, self.dir)
        self.start_web()
        if self.services:
            self.worker = Proc(
                "worker",
                celery_worker_argv(QUEUES, 2, f"e2e-{self.db}@%h"),
                self.env,
                self.dir,
            ).start()
            self.beat = Proc(
                "beat", celery_beat_argv(self.dir / "beat-schedule"), self.env, self.dir
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
                pg_admin(PG_URL, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
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
        if i == 0:  # the source: the engine holds the burst's prefix and the store its bytes
            self._hold_prefix(node)
        argv = self._agent_argv(i, node, self._gpu_file(i, name))
        node.proc = Proc(f"agent-{name}", argv, self.env, self.dir).start()
        return node

    def _gpu_file(self, i: int, name: str) -> Path:
        """The node's simulated GPU: one H100 with 20 GiB free."""
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
        return gpus

    def _hold_prefix(self, node: Node) -> None:
        """The burst's prefix in the source node's block store (kept in ``source_bytes``)."""
        store = FileBlockStore(node.store_dir)
        for n, key in enumerate(burst.PREFIX):
            data = (
                blockhash.to_hex(key).encode() * (BYTES_PER_BLOCK // 16)
                if n % 2
                else os.urandom(BYTES_PER_BLOCK)
            )
            store.write(key, data)
            self.source_bytes[key] = data

    def _agent_argv(self, i: int, node: Node, gpus: Path) -> list[str]:
        """A real agent for the node: enrolled afresh, its one engine publishing on the node's
        ZMQ sockets, transfers over tcp into its file block store."""
        name = node.name
        enrol = self.manage("create_enrolment_token")
        engine = (
            f"engine_id=vllm-0,kv_events={node.publisher.endpoint},replay={node.publisher.replay_endpoint},"
            f"topic=kv,block_size={burst.BLOCK},bytes_per_block={BYTES_PER_BLOCK},"
            f"kv_capacity_blocks=100000,gpu_uuids=GPU-sim-{i},model={burst.MODEL},"
            f"metrics_url={node.engine_metrics.url}"
        )
        return [
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

    def node_of(self, transfer_port: int) -> Node:
        return next(n for n in self.nodes if n.transfer_port == transfer_port)
