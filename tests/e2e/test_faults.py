"""Faults in the end-to-end setup: a worker killed mid-task, an agent killed mid-transfer, Redis
restarted empty, the control plane restarted. The system recovers by itself; no agent report is
lost; every job ends in a defined state; each recovery time is printed and bounded."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from harness.e2e.dashboard import DashboardClient
from harness.processes import REPO, wait_for
from tests.e2e.test_end_to_end import holders, jobs

pytestmark = [pytest.mark.services, pytest.mark.slow]
TERMINAL = {
    "landed",
    "confirmed",
    "unconfirmed",
    "lost",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
}
# Recovery that involves no job (reports caught up, residency rebuilt) is bounded by the agents'
# report backoff (1 s here) and the node stale time (10 s): a minute is six times that.
RECOVERY_LIMIT_S = 60


def agent_seq(cluster, node) -> int:
    return json.loads((cluster.dir / node.name / "state" / "state.json").read_text())["seq"]


def reports_in(cluster, node) -> bool:
    """Every report the agent has built so far has reached the control plane, none waits."""
    seq = agent_seq(cluster, node)
    server = {n["name"]: n for n in cluster.results("/api/nodes/")}.get(node.name)
    spooled = node.metrics().get("prewarm_agent_spool_reports")
    return (
        bool(server) and server["state"] == "active" and server["last_seq"] >= seq and spooled == 0
    )


def healthy(cluster, engines_with_prefix: int) -> bool:
    try:
        return (
            all(reports_in(cluster, n) for n in cluster.nodes)
            and len(holders(cluster)) >= engines_with_prefix
            and all(j["state"] in TERMINAL for j in jobs(cluster))
        )
    except Exception:  # the control plane is still coming back
        return False


def health(cluster) -> dict:
    """What ``healthy`` looks at, for a failure message."""
    try:
        return {
            "nodes": cluster.results("/api/nodes/"),
            "seqs": [agent_seq(cluster, n) for n in cluster.nodes],
            "spools": [n.metrics().get("prewarm_agent_spool_reports") for n in cluster.nodes],
            "holders": sorted(holders(cluster)),
            "jobs": [j["state"] for j in jobs(cluster)],
        }
    except Exception as exc:
        return {"error": repr(exc)}


def job_story(cluster) -> list[dict]:
    """Each job's state, attempt, error and transitions, for a failure message."""
    try:
        return [
            {
                k: j.get(k)
                for k in (
                    "id",
                    "state",
                    "attempt",
                    "max_attempts",
                    "error",
                    "source",
                    "target",
                    "deadline",
                    "transitions",
                    "created_at",
                    "updated_at",
                )
            }
            for j in jobs(cluster)
        ]
    except Exception as exc:
        return [{"error": repr(exc)}]


def recover(cluster, what: str, t0: float, engines_with_prefix: int, timings: dict) -> None:
    # Healthy includes every job ended: the jobs' own bound can be the longer one.
    ceiling = max(RECOVERY_LIMIT_S, cluster.job_ceiling_s())
    try:
        wait_for(
            lambda: healthy(cluster, engines_with_prefix),
            ceiling,
            interval=0.3,
            what=f"recovery from {what}",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {json.dumps(health(cluster), default=str)[:3000]}") from None
    timings[what] = round(time.time() - t0, 2)
    print(f"recovered from {what} in {timings[what]}s")


@pytest.mark.parametrize("services_cluster", [3], indirect=True)
def test_recovers_from_worker_agent_redis_and_control_plane_faults(services_cluster):
    cluster, timings = services_cluster, {}
    src, *targets = cluster.nodes
    # Slow the source's sends so that a transfer is long enough to be cut (8 MiB at 2 MiB/s).
    src.proc.stop()
    src.proc.argv[src.proc.argv.index("--transfer-rate-limit-bytes-per-s") + 1] = str(2 << 20)
    cluster.restart_agent(src)
    wait_for(lambda: reports_in(cluster, src), 30, what="the source agent back")
    cluster.republish(src)
    for node in targets:  # the engines load copied KV only once the copies' states are checked
        node.loader.loading.clear()
    dash = DashboardClient(cluster)
    try:
        wait_for(lambda: len(holders(cluster)) == 1, 30, what="the source's prefix in residency")
        # 1. The worker is killed (SIGKILL, pool and all) while the burst's cycle runs.
        cluster.post_burst()
        cluster.activate_policy("auto")
        wait_for(
            lambda: "forecast_all" in cluster.worker.tail(20000),
            30,
            what="the forecast task received",
        )
        t0 = time.time()
        cluster.worker.kill(signal.SIGKILL)
        time.sleep(1)
        cluster.worker.start()
        wait_for(
            lambda: jobs(cluster), cluster.job_ceiling_s(), what="jobs after the worker's restart"
        )
        timings["worker killed: jobs dispatched"] = round(time.time() - t0, 2)
        # 2. A target agent is killed mid-transfer, and comes back.
        running = wait_for(
            lambda: [j for j in jobs(cluster) if j["state"] == "running"],
            cluster.job_ceiling_s(),
            interval=0.05,
            what="a running job",
        )[0]
        victim = cluster.node_of_engine(running["target"])
        t0 = time.time()
        victim.proc.kill(signal.SIGKILL)
        time.sleep(2)
        cluster.restart_agent(victim)
        try:
            wait_for(
                lambda: all(j["state"] in TERMINAL for j in jobs(cluster)),
                cluster.job_ceiling_s(),
                what="every job in a terminal state after the agent kill",
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {json.dumps(job_story(cluster), default=str)[:6000]}"
            ) from None
        timings["agent killed: every job ended"] = round(time.time() - t0, 2)
        finished = jobs(cluster)
        # The product's rule: a job retries (PREWARM_JOB_MAX_ATTEMPTS, with backoff) and succeeds
        # once its target's agent is back; if the agent takes longer to come back than the retry
        # window (the backoffs plus the source's own connect retries: seconds; a loaded machine
        # can take longer to start a Python process), the job fails with every attempt used and
        # says why. Every other job lands.
        story = json.dumps(job_story(cluster), default=str)[:6000]
        for j in finished:
            if j["state"] == "failed":
                assert j["target"] == running["target"] and j["attempt"] == j["max_attempts"], story
                assert j["error"], (
                    story
                )  # e.g. "source on node 1: transfer to 127.0.0.1:<port> failed: ..."
            else:  # TCP moves bytes between agents' stores; a copy counts only once the engine shows it
                assert j["state"] == "landed", story
        assert max(j["attempt"] for j in finished if j["target"] == running["target"]) >= 2, story
        timings["agent killed: victim's job"] = next(
            j["state"] for j in finished if j["id"] == running["id"]
        )
        for node in targets:  # the engines load the KV their agents copied: their events say so
            node.loader.loading.set()
        wait_for(
            lambda: all(j["state"] in ("confirmed", "failed") for j in jobs(cluster)),
            RECOVERY_LIMIT_S,
            what="every landed copy confirmed by its engine's KV events",
        )
        # The source and each engine a copy reached hold the prefix (an engine without a
        # landed copy does not: nothing publishes it for the test).
        with_prefix = 1 + len({j["target"] for j in jobs(cluster) if j["state"] == "confirmed"})
        recover(cluster, "agent killed mid-transfer", t0, with_prefix, timings)
        # 3. Redis restarts empty (broker, channel layer, residency index all gone).
        t0 = time.time()
        cluster.redis.kill(signal.SIGKILL)
        time.sleep(1)
        cluster.start_redis()
        recover(cluster, "Redis restarted empty", t0, with_prefix, timings)
        # 4. The control plane (web) restarts.
        stopping = time.time()
        cluster.web.stop()
        t0 = time.time()  # from the moment it is gone (daphne's graceful stop is not recovery)
        timings["control plane graceful stop"] = round(t0 - stopping, 2)
        time.sleep(1)
        cluster.start_web()
        recover(cluster, "control plane restarted", t0, with_prefix, timings)
        wait_for(lambda: dash.connects >= 2, 30, what="the dashboard reconnected")
        # No report lost: what agents that never died counted as applied, the server applied.
        for node in targets:
            if node is victim:
                continue
            before = node.metrics()
            applied = {n["name"]: n["reports_applied"] for n in cluster.results("/api/nodes/")}[
                node.name
            ]
            after = node.metrics()

            def sent(m):
                return m.get('prewarm_agent_reports_total{outcome="applied"}', 0) + m.get(
                    'prewarm_agent_reports_total{outcome="stale"}', 0
                )

            assert sent(before) <= applied <= sent(after) + 1, (node.name, before, applied, after)
            assert after.get('prewarm_agent_reports_total{outcome="rejected"}', 0) == 0
            assert after.get("prewarm_agent_spool_dropped_reports_total", 0) == 0
        print("recovery times (s):", json.dumps(timings))
        # Kept for docs/reliability.md: the run's figures and the machine's load while it ran.
        out = REPO / "test-artifacts" / "recovery-times.jsonl"
        out.parent.mkdir(exist_ok=True)
        with out.open("a") as f:
            f.write(json.dumps({"at": time.time(), "loadavg": os.getloadavg(), **timings}) + "\n")
    finally:
        dash.close()
