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
