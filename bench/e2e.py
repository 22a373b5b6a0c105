"""End-to-end benchmark on real processes: engine report -> residency -> dashboard, and
plan -> approval -> job -> engine-confirmed copy, p50/p99, on the embedded default and on
PostgreSQL + Redis.

Each setup is a ``harness.e2e.cluster.Cluster``: daphne, the Celery worker and beat (embedded: the
in-process worker), one real ``python -m nodeagent`` process per engine with a simulated GPU, a
file block store and a vLLM-format ZMQ KV-event publisher, and a dashboard websocket client. Per
iteration, engine 0 stores a new 4-block chain (its bytes in its block store, a ``BlockStored``
event on its publisher), then a one-item plan copies that chain to another engine. A landed copy
counts only once the target engine shows it: when the job has landed, the target engine loads the
copied KV and publishes its own ``BlockStored`` (as vLLM does), and its agent's report confirms
the job. Targets: report -> browser p99 < 250 ms, approve -> agent ack p99 < 500 ms.

  report_to_residency   event published -> ``/api/residency/lookup/`` shows the holder (polled)
  report_to_dashboard   event published -> the dashboard's ``residency.delta`` for it arrives
  approve_to_ack        approve POST sent -> the agent's ``job.ack`` recorded (job -> running)
  approve_to_landed     approve POST sent -> the executor's result recorded (job -> landed)
  event_to_confirmed    the target's ``BlockStored`` published -> ``GET /api/replication-jobs/<id>/``
                        says ``confirmed`` (polled) and the lookup shows the target holding it
  approve_to_confirmed  approve POST sent -> confirmed (the bench reacts to ``landed`` by polling)
  baseline: approve_post_ms, the approval request alone (its own database work, no dispatch)

Baseline, in the same run: each setup runs twice, once with the agents reporting on their 1 s
tick only (``PREWARM_AGENT_REPORT_MIN_INTERVAL_S=1``: what agents did before they reported
changes early), once as configured by default (a change reported within
``report_min_interval_s``, 0.1 s, of the previous report). ``--no-baseline`` skips the first.

Each setup runs in a child process (Django is configured once per process, on that cluster's
database). ``--quick``: PostgreSQL + Redis only, 4 engines, 8 iterations (< 1 minute);
full: both setups, 16 engines, 40 iterations each.

    python bench/e2e.py [--quick] [--json PATH] [--setups services,embedded] [--engines N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, parser, percentile, table, write_json

from controlplane.core.policy import knobs
from wire import protocol

TICK_ONLY = "PREWARM_AGENT_REPORT_MIN_INTERVAL_S"
STAGES = (
    "report_to_residency",
    "report_to_dashboard",
    "approve_post",
    "approve_to_ack",
    "approve_to_landed",
    "event_to_confirmed",
    "approve_to_confirmed",
)
TARGETS_MS = {"report_to_dashboard": 250.0, "approve_to_ack": 500.0}
BLOCKS = 4


def _configure_django(env: dict[str, str]) -> None:
    """This process talks to the cluster's database (and Redis) the way its web process does."""
    for k in (
        "DATABASE_URL",
        "REDIS_URL",
        "PREWARM_DATA_DIR",
        "SECRET_KEY",
        "PREWARM_SECURE",
        "ALLOWED_HOSTS",
        "DJANGO_SETTINGS_MODULE",
    ):
        if k in env:
            os.environ[k] = env[k]
    os.environ["PREWARM_EMBEDDED_WORKER"] = "false"  # never a second in-process worker here
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def _wait(pred, timeout: float, what: str, interval: float = 0.01):
    # harness/processes.py's poller, at a finer interval: the waits here are the measured latencies.
    from harness.processes import wait_for

    return wait_for(pred, timeout, interval=interval, what=what)


def _holds(cluster, engine: int, hexes: list[str]) -> bool:
    resp = cluster.api("POST", "/api/residency/lookup/", json={"keys": hexes})
    return resp.status_code == 200 and any(
        h["engine"] == engine and h["depth"] == len(hexes) for h in resp.json()["holders"]
    )


def _dashboard_delta_at(dash, engine_pk: int, since: float) -> float | None:
    """Arrival of the first dashboard delta after ``since`` naming the engine's residency (a
    report names an engine only when its residency changed; every report carries GPUs)."""
    for t, m in list(dash.messages):
        if (
            t >= since
            and m.get("type") == "delta"
            and engine_pk in (m.get("residency") or {}).get("engines", [])
        ):
            return t
    return None


def _one_plan(policy_id: int, source: int, target: int, hexes: list[str], nbytes: int) -> int:
    from controlplane.replication.models import PlanItem, ReplicationPlan
    from wire import protocol

    plan = ReplicationPlan.objects.create(
        policy_id=policy_id, mode="manual", state="proposed", summary={"items": 1, "bench": "e2e"}
    )
    PlanItem.objects.create(
        plan=plan,
        prefix_keys=hexes,
        prefix_tokens=BLOCKS * 16,
        source_id=source,
        target_id=target,
        tier=protocol.TIER_GPU,
        bytes=nbytes,
        expected_ttft_saved_s=1.0,
        cost_s=0.01,
        confidence=0.9,
        reason="bench/e2e.py: one copy",
    )
    return plan.pk


def _ack_and_landed(plan_id: int) -> tuple[int, float, float] | None:
    """(job id, running at, landed at) once the plan's job has landed."""
    from controlplane.replication.models import JobTransition
    from wire import protocol

    rows = {
        state: (job, at)
        for job, state, at in JobTransition.objects.filter(
            job__item__plan_id=plan_id, to_state__in=[protocol.JOB_RUNNING, protocol.JOB_LANDED]
        ).values_list("job_id", "to_state", "at")
    }
    if protocol.JOB_RUNNING in rows and protocol.JOB_LANDED in rows:
        run, landed = rows[protocol.JOB_RUNNING], rows[protocol.JOB_LANDED]
        return landed[0], run[1].timestamp(), landed[1].timestamp()
    return None


def _job_state(cluster, job_id: int) -> str | None:
    resp = cluster.api("GET", f"/api/replication-jobs/{job_id}/")
    return resp.json().get("state") if resp.status_code == 200 else None


def _one_round(
    cluster, dash, policy_id: int, source_node, source: dict, target_node, target: dict, i: int
) -> dict:
    """Engine 0 stores a new chain; a one-item plan copies it to ``target``. Stage times in ms."""
    from harness.e2e.settings import BYTES_PER_BLOCK
    from nodeagent.blockstore import FileBlockStore
    from wire import blockhash

    out = {}
    tokens = [(104_729 * (i + 1) + 31 * t) % 32000 for t in range(BLOCKS * 16)]
    keys = blockhash.chain_keys(tokens, 16)
    store = FileBlockStore(source_node.store_dir)
    for k in keys:
        store.write(k, os.urandom(BYTES_PER_BLOCK))
    hexes = [blockhash.to_hex(k) for k in keys]
    t0 = time.time()
    source_node.publish_stored(tokens, 16)
    _wait(lambda: _holds(cluster, source["id"], hexes), 30, "the source in residency")
    out["report_to_residency"] = (time.time() - t0) * 1e3
    t_dash = _wait(lambda: _dashboard_delta_at(dash, source["id"], t0), 30, "the dashboard delta")
    out["report_to_dashboard"] = (t_dash - t0) * 1e3
    plan_id = _one_plan(policy_id, source["id"], target["id"], hexes, BLOCKS * BYTES_PER_BLOCK)
    t1 = time.time()
    resp = cluster.api("POST", f"/api/plans/{plan_id}/approve/", json={})
    out["approve_post"] = (time.time() - t1) * 1e3
    assert resp.status_code == 200 and not resp.json().get("refused"), resp.text
    job_id, ack, landed = _wait(lambda: _ack_and_landed(plan_id), 60, "the job to land", 0.02)
    out["approve_to_ack"] = (ack - t1) * 1e3
    out["approve_to_landed"] = (landed - t1) * 1e3
    # The target engine loads the copied KV: its own event is what confirms the copy.
    t2 = time.time()
    target_node.publish_stored(tokens, 16)
    _wait(lambda: _job_state(cluster, job_id) == protocol.JOB_CONFIRMED, 30, "the job confirmed")
    _wait(lambda: _holds(cluster, target["id"], hexes), 30, "the replica in residency")
    out["event_to_confirmed"] = (time.time() - t2) * 1e3
    out["approve_to_confirmed"] = (time.time() - t1) * 1e3
    return out


def run_setup(setup: str, engines: int, iterations: int) -> dict:
    """One cluster, ``iterations`` report and copy rounds; per-stage samples in ms."""
    from harness.e2e.cluster import Cluster
    from harness.e2e.dashboard import DashboardClient

    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        cluster = Cluster(Path(tmp) / "cluster", nodes=engines, services=setup == "services")
        dash = None
        try:
            cluster.start()
            started_s = time.time() - t_start
            _configure_django(cluster.env)
            policy = cluster.activate_policy(
                "manual",
                plan_every_seconds=3600,
                forecast_every_seconds=3600,
                max_bytes_per_interval=10**13,
                max_spec_vram_fraction=knobs.MAX_SPEC_VRAM_FRACTION.high,
            )
            dash = DashboardClient(cluster)
            _wait(
                lambda: any(m.get("type") == "snapshot" for _, m in dash.messages),
                30,
                "dashboard snapshot",
            )
            by_node = {e["node_name"]: e for e in cluster.engines().values()}
            source_node = cluster.nodes[0]
            source = by_node[source_node.name]
            samples: dict[str, list[float]] = {s: [] for s in STAGES}
            for i in range(iterations):
                target_node = cluster.nodes[1 + i % (engines - 1)]
                target = by_node[target_node.name]
                for stage, ms in _one_round(
                    cluster, dash, policy["id"], source_node, source, target_node, target, i
                ).items():
                    samples[stage].append(ms)
            return {
                "setup": setup,
                "engines": engines,
                "iterations": iterations,
                "cluster_start_s": round(started_s, 1),
                "samples_ms": samples,
            }
        finally:
            if dash:
                dash.close()
            cluster.close()


def summarise(run: dict) -> dict:
    out = {k: run[k] for k in ("setup", "engines", "iterations", "cluster_start_s")}
    for stage, values in run["samples_ms"].items():
        out[f"{stage}_p50_ms"] = round(percentile(values, 50), 1)
        out[f"{stage}_p99_ms"] = round(percentile(values, 99), 1)
    return out


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--setups", help="comma-separated: services, embedded")
    ap.add_argument("--engines", type=int)
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--child", help=argparse_hidden())
    ap.add_argument("--no-baseline", action="store_true", help="skip the tick-only run")
    args = ap.parse_args(argv)
    if args.child:  # one setup, in its own process
        sys.path.insert(0, str(REPO))
        print(json.dumps(run_setup(args.child, args.engines, args.iterations)))
        return 0
    setups = (args.setups or ("services" if args.quick else "services,embedded")).split(",")
    engines = args.engines or (4 if args.quick else 16)
    iterations = args.iterations or (8 if args.quick else 40)
    load_before = os.getloadavg()
    results = []
    variants = [("", {})] if args.no_baseline else [("tick only", {TICK_ONLY: "1"}), ("", {})]
    for setup, (label, env) in ((s, v) for s in setups for v in variants):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                setup,
                "--engines",
                str(engines),
                "--iterations",
                str(iterations),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, **env},
        )
        if out.returncode:
            print(out.stdout[-3000:], out.stderr[-5000:], file=sys.stderr)
            return out.returncode
        result = summarise(json.loads(out.stdout.strip().splitlines()[-1]))
        if label:
            result["setup"] += f" ({label})"
        results.append(result)
    rows = [
        (
            f"{stage} p50 / p99 (ms)",
            *(f"{r[f'{stage}_p50_ms']} / {r[f'{stage}_p99_ms']}" for r in results),
        )
        for stage in STAGES
    ]
    rows.append(("cluster start (s)", *(str(r["cluster_start_s"]) for r in results)))
    print(
        table(
            rows,
            (
                "measure",
                *(f"{r['setup']} ({r['engines']} engines, n={r['iterations']})" for r in results),
            ),
        )
    )
    for stage, limit in TARGETS_MS.items():
        for r in results:
            p99 = r[f"{stage}_p99_ms"]
            print(
                f"target {stage} p99 < {limit:.0f} ms ({r['setup']}): {p99} ms, "
                f"{p99 / limit:.2f} of the limit -> {'meets' if p99 < limit else 'MISSES'}"
            )
    print("baseline: approve_post is the approval request alone; the stages after it include it")
    load = os.getloadavg()
    print(f"load average before / after: {load_before[0]:.2f} / {load[0]:.2f} (1 min)")
    write_json(
        args.json,
        {"setups": results, "load_average_before": load_before, "load_average_after": load},
    )
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
