"""Choices for nodes and engines (the lifecycle's values from ``controlplane.core.protocol``)."""

from controlplane.choiceset import ChoiceSet
from controlplane.core import protocol as wire


class NodeState(ChoiceSet):
    ACTIVE = "active", "Active"
    STALE = "stale", "Stale (missed heartbeats)"
    RETIRED = "retired", "Retired"


class EngineLifecycle(ChoiceSet):
    WARMING = wire.ENGINE_WARMING, "Warming (joining, not yet taking traffic)"
    SERVING = wire.ENGINE_SERVING, "Serving"
    DRAINING = wire.ENGINE_DRAINING, "Draining"
    # Who may move an engine where: anything may go to draining; warming -> serving when ready;
    # a drained (or not yet started) engine warms up again before it takes traffic.
    ALLOWED = {WARMING: {SERVING, DRAINING}, SERVING: {DRAINING}, DRAINING: {SERVING, WARMING}}


class EngineKind(ChoiceSet):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    TRTLLM = "trtllm", "TensorRT-LLM"
    DYNAMO = "dynamo", "Dynamo"
    VIRTUAL = "virtual", "Virtual (simulator)"
