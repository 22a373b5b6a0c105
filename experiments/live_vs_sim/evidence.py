"""What a live pass's control plane did, read from its database after the pass (the demo's
embedded SQLite file): plans made (by trigger), items, replicate jobs by state, and when copies
landed, in the pass's trace seconds, beside the simulator's copies (``RunResult.replicas``)."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from experiments.live_vs_sim.figures import copy_timing
from wire.protocol import ACTION_REPLICATE, JOB_LANDED


def _epoch(text: str) -> float:
    """A Django SQLite timestamp (UTC, naive text) as epoch seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def engine_index(engine_id: str) -> int:
    """``vc-e3`` -> 3 (the virtual cluster's engine names)."""
    if not engine_id.startswith("vc-e") or not engine_id[4:].isdigit():
        raise ValueError(f"not a virtual cluster engine: {engine_id!r}")
    return int(engine_id[4:])


def live_evidence(db: Path, started_at: float, time_scale: float, joins: dict[int, float]) -> dict:
    """Plans, jobs and copy timing of one pass (``started_at``: wall epoch of trace second 0)."""
    if not db.exists():
        raise ValueError(f"no control-plane database at {db}")
    con = sqlite3.connect(db)
    try:
        plans = con.execute(
            "SELECT p.summary, (SELECT COUNT(*) FROM replication_planitem i WHERE i.plan_id = p.id)"
            " FROM replication_replicationplan p"
        ).fetchall()
        jobs = con.execute(
            "SELECT j.state, e.engine_id, (SELECT MIN(t.at) FROM replication_jobtransition t"
            " WHERE t.job_id = j.id AND t.to_state = ?)"
            " FROM replication_replicationjob j LEFT JOIN fleet_engine e ON e.id = j.target_id"
            " WHERE j.action = ?",
            (JOB_LANDED, ACTION_REPLICATE),
        ).fetchall()
    finally:
        con.close()
    triggers: Counter[str] = Counter()
    items = 0
    for summary, n in plans:
        if n:
            triggers[json.loads(summary).get("trigger", "cycle")] += 1
            items += n
    landings = [
        (engine_index(eid), (_epoch(at) - started_at) * time_scale)
        for _state, eid, at in jobs
        if at is not None and eid
    ]
    return {
        "plans_with_items": dict(triggers),
        "plan_items": items,
        "jobs": dict(Counter(state for state, _, _ in jobs)),
        **copy_timing(landings, joins),
    }


def sim_evidence(result, joins: dict[int, float]) -> dict:
    """The same figures for one simulator run (``sim.config.RunResult``)."""
    return {
        "plan_items": result.plan_items,
        "copies": len(result.replicas),
        "speculative": sum(1 for r in result.replicas if r.speculative),
        **copy_timing(((r.engine, r.placed_at) for r in result.replicas), joins),
    }
