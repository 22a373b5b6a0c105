"""Channels group names, built in one place."""

CLUSTER = "cluster"  # residency, VRAM, engines: the cache map
JOBS = "jobs"  # job progress
PLANS = "plans"  # new plans, decisions


def agent(node_id: int) -> str:
    """The group an agent's socket joins: jobs for that node are sent here."""
    return f"agent.{node_id}"


DASHBOARD_GROUPS = (CLUSTER, JOBS, PLANS)
