"""Choices for nodes and engines (the lifecycle's values from ``controlplane.core.protocol``)."""

from controlplane.core import protocol as wire


class NodeState:
    ACTIVE = "active"
    STALE = "stale"
    RETIRED = "retired"
    CHOICES = [(ACTIVE, "Active"), (STALE, "Stale (missed heartbeats)"), (RETIRED, "Retired")]


class EngineLifecycle:
    WARMING = wire.ENGINE_WARMING
    SERVING = wire.ENGINE_SERVING
    DRAINING = wire.ENGINE_DRAINING
    CHOICES = [
        (WARMING, "Warming (joining, not yet taking traffic)"),
        (SERVING, "Serving"),
        (DRAINING, "Draining"),
    ]
    # Who may move an engine where: anything may go to draining; warming -> serving when ready;
    # a drained (or not yet started) engine warms up again before it takes traffic.
    ALLOWED = {WARMING: {SERVING, DRAINING}, SERVING: {DRAINING}, DRAINING: {SERVING, WARMING}}


class EngineKind:
    CHOICES = [
        ("vllm", "vLLM"),
        ("sglang", "SGLang"),
        ("trtllm", "TensorRT-LLM"),
        ("dynamo", "Dynamo"),
        ("virtual", "Virtual (simulator)"),
    ]
