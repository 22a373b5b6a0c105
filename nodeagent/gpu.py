"""GPU sources: NVML on real nodes, a simulated source for the virtual cluster, or none.

A source has ``collect() -> GpuReading``: the GPUs in the report's shape (see
``docs/agent-protocol.md``) and a status line. No driver or no GPU is a normal state: zero GPUs
and a clear status, never an exception. A failing NVML call marks that field in the GPU's
``errors`` map; a GPU that cannot be read at all is reported with ``errors["device"]``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

log = logging.getLogger(__name__)


@dataclass
class GpuReading:
    gpus: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"


class GpuSource(Protocol):
    def collect(self) -> GpuReading: ...

    def close(self) -> None: ...


class NoGpuSource:
    """``gpu_source = none``: a CPU-only node."""

    def collect(self) -> GpuReading:
        return GpuReading([], "GPU collection disabled")

    def close(self) -> None:
        pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus(bus_id: Any) -> str:
    """PCI bus ids differ in domain width between calls (0000:18:00.0 vs 00000000:18:00.0)."""
    text = _text(bus_id).lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):08x}:{rest}" if rest else text


def _not_supported(nvml: Any) -> type:
    import pynvml

    return getattr(nvml, "NVMLError_NotSupported", pynvml.NVMLError_NotSupported)


class NvmlCollector:
    """Reads every GPU through an NVML-like module (``pynvml`` or ``RecordedNvml``)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.ready = False
        self.init_error = ""

    def _init(self) -> bool:
        if self.ready:
            return True
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            msg = f"NVML unavailable ({exc}): reporting zero GPUs"
            if msg != self.init_error:
                log.warning(msg)
            self.init_error = msg
            return False
        self.ready = True
        self.init_error = ""
        return True

    def close(self) -> None:
        if self.ready:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass  # shutting down anyway
            self.ready = False

    def collect(self) -> GpuReading:
        if not self._init():
            return GpuReading([], self.init_error)
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return GpuReading([], f"NVML cannot count GPUs ({exc}): reporting zero GPUs")
        gpus: list[dict[str, Any]] = []
        handles: list[Any] = []
        bus_to_uuid: dict[str, str] = {}
        for index in range(count):
            gpu: dict[str, Any] = {"index": index, "uuid": None, "errors": {}}
            gpus.append(gpu)
            try:
                handles.append(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError as exc:
                handles.append(None)
                gpu["errors"]["device"] = str(exc)
                continue
            self._read(handles[-1], gpu)
            if gpu.get("uuid") and gpu.get("_bus"):
                bus_to_uuid[gpu["_bus"]] = gpu["uuid"]
        for gpu, handle in zip(gpus, handles, strict=True):
            if handle is not None:
                gpu["nvlink_peers"] = self._nvlink_peers(handle, gpu, bus_to_uuid)
            gpu.pop("_bus", None)
        _resolve_peers(gpus, bus_to_uuid)
        lost = sum(1 for g in gpus if "device" in g["errors"] or "memory" in g["errors"])
        status = f"{count} GPU(s)" + (f", {lost} unreadable" if lost else "")
        return GpuReading(gpus, status)

    def _call(self, gpu: dict[str, Any], name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            gpu["errors"][name] = str(exc)
            return None

    def _read(self, h: Any, gpu: dict[str, Any]) -> None:
        nvml = self.nvml
        uuid = self._call(gpu, "uuid", nvml.nvmlDeviceGetUUID, h)
        gpu["uuid"] = _text(uuid) if uuid is not None else None
        name = self._call(gpu, "name", nvml.nvmlDeviceGetName, h)
        gpu["name"] = _text(name) if name is not None else None
        pci = self._call(gpu, "pci", nvml.nvmlDeviceGetPciInfo, h)
        if pci is not None:
            gpu["_bus"] = _bus(pci.busId)
        mem = self._call(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        gpu["memory_total"] = mem.total if mem is not None else None
        gpu["memory_used"] = mem.used if mem is not None else None
        gpu["memory_free"] = mem.free if mem is not None else None
        util = self._call(gpu, "utilization_gpu", nvml.nvmlDeviceGetUtilizationRates, h)
        gpu["utilization_gpu"] = util.gpu if util is not None else None
        gen = self._call(gpu, "pcie", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
        width = self._call(gpu, "pcie", nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
        gpu["pcie"] = {"gen": gen, "width": width} if gen is not None or width is not None else None
        procs = self._call(gpu, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, h)
        gpu["processes"] = (
            None
            if procs is None
            else [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs]
        )

    def _nvlink_peers(self, h: Any, gpu: dict[str, Any], bus_to_uuid: dict[str, str]) -> list[str]:
        """Active NVLink remotes: GPUs directly, or NVSwitch bus ids (resolved in collect)."""
        nvml = self.nvml
        remotes: list[str] = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except nvml.NVMLError as exc:
                # Link 0 "Not Supported" means no NVLink; a later error is past the last link.
                if link == 0 and not isinstance(exc, _not_supported(nvml)):
                    gpu["errors"]["nvlink_peers"] = str(exc)
                break
            if remote not in remotes:
                remotes.append(remote)
        return remotes


def _resolve_peers(gpus: list[dict[str, Any]], bus_to_uuid: dict[str, str]) -> None:
    """Turn remote bus ids into peer GPU uuids: a GPU directly, or GPUs sharing an NVSwitch."""
    switch_members: dict[str, set[str]] = {}
    for g in gpus:
        for bus in g.get("nvlink_peers") or []:
            if bus not in bus_to_uuid and g.get("uuid"):
                switch_members.setdefault(bus, set()).add(g["uuid"])
    for g in gpus:
        if "nvlink_peers" not in g:
            g["nvlink_peers"] = []
            continue
        peers: set[str] = set()
        for bus in g["nvlink_peers"]:
            if bus in bus_to_uuid:
                peers.add(bus_to_uuid[bus])
            else:
                peers |= switch_members.get(bus, set())
        peers.discard(g.get("uuid"))
        g["nvlink_peers"] = sorted(peers)


class SimulatedGpuSource:
    """GPU readings served by the virtual cluster (a JSON file or an HTTP endpoint).

    The source document is ``{"gpus": [<report GPU objects>], "status": "optional text"}``;
    each GPU needs at least ``uuid``, ``index``, ``memory_total`` and ``memory_used``. An
    unreadable or invalid source gives zero GPUs and a status saying why.
    """

    REQUIRED = ("uuid", "index", "memory_total", "memory_used")

    def __init__(self, source: str, timeout_s: float = 2.0):
        self.source = source
        self.timeout_s = timeout_s

    def _load(self) -> Any:
        if self.source.startswith(("http://", "https://")):
            resp = httpx.get(self.source, timeout=self.timeout_s)
            resp.raise_for_status()
            return resp.json()
        return json.loads(Path(self.source).read_text())

    def collect(self) -> GpuReading:
        try:
            doc = self._load()
        except (OSError, ValueError, httpx.HTTPError) as exc:
            return GpuReading([], f"simulated GPU source {self.source} unreadable: {exc}")
        if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
            return GpuReading([], f"simulated GPU source {self.source}: no 'gpus' list")
        gpus = []
        for g in doc["gpus"]:
            if not isinstance(g, dict) or any(k not in g for k in self.REQUIRED):
                return GpuReading(
                    [], f"simulated GPU source {self.source}: each GPU needs {self.REQUIRED}"
                )
            gpu = {
                "nvlink_peers": [],
                "pcie": None,
                "processes": [],
                "errors": {},
                "utilization_gpu": None,
                "name": "simulated",
                **g,
            }
            gpu.setdefault("memory_free", g["memory_total"] - g["memory_used"])
            gpus.append(gpu)
        return GpuReading(gpus, str(doc.get("status") or f"{len(gpus)} simulated GPU(s)"))

    def close(self) -> None:
        pass


def make_gpu_source(kind: str, sim_source: str = "") -> GpuSource:
    if kind == "nvml":
        import pynvml

        return NvmlCollector(pynvml)
    if kind == "simulated":
        return SimulatedGpuSource(sim_source)
    return NoGpuSource()
