"""Choices for nodes and engines (the lifecycle's values from ``wire.protocol``)."""

from controlplane.choiceset import ChoiceSet
from wire import protocol


class NodeState(ChoiceSet):
    ACTIVE = "active", "Active"
    STALE = "stale", "Stale (missed heartbeats)"
    RETIRED = "retired", "Retired"


class EngineLifecycle(ChoiceSet):
    WARMING = protocol.ENGINE_WARMING, "Warming (joining, not yet taking traffic)"
    SERVING = protocol.ENGINE_SERVING, "Serving"
    DRAINING = protocol.ENGINE_DRAINING, "Draining"
    # Who may move an engine where: anything may go to draining; warming -> serving when ready;
    # a drained (or not yet started) engine warms up again before it takes traffic.
    ALLOWED = {WARMING: {SERVING, DRAINING}, SERVING: {DRAINING}, DRAINING: {SERVING, WARMING}}


class EngineKind(ChoiceSet):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    TRTLLM = "trtllm", "TensorRT-LLM"
    DYNAMO = "dynamo", "Dynamo"
    VIRTUAL = "virtual", "Virtual (simulator)"


# A node label only an admin or an enrolment token sets (an agent's own labels may not): the
# tenants the node's engines serve, comma-separated. Where set, the node's request taps' records
# count for those tenants only.
TENANTS_LABEL = "prewarm/tenants"


def served_tenants(labels: dict) -> set[str] | None:
    """The tenants a node's label names, or None (the label unset: any tenant)."""
    value = str(labels.get(TENANTS_LABEL) or "").strip()
    return {t.strip() for t in value.split(",") if t.strip()} if value else None
