"""Record NVML answers on a real node, and replay them as an NVML-like module.

A *scenario* is a JSON file holding what each ``pynvml`` call returned (or which
``NVML_ERROR_*`` it raised) on one node at one moment. ``record(pynvml)`` produces it on real
hardware (``bench/gpu_check.py --record PATH``); ``RecordedNvml(scenario)`` answers the same calls
from it, raising the real ``pynvml.NVMLError`` subclasses, so the GPU collector is tested against
the library's behaviour without a GPU. Layout::

    {"name": "...", "nvmlInit": null | {"error": "NVML_ERROR_DRIVER_NOT_LOADED"},
     "nvmlSystemGetDriverVersion": "550.54.15",
     "devices": [{"nvmlDeviceGetHandleByIndex": null | {"error": ...},
                  "nvmlDeviceGetUUID": "GPU-...", "nvmlDeviceGetName": "...",
                  "nvmlDeviceGetPciInfo": {"busId": "00000000:18:00.0"},
                  "nvmlDeviceGetMemoryInfo": {"total": .., "used": .., "free": ..},
                  "nvmlDeviceGetUtilizationRates": {"gpu": 87, "memory": 40},
                  "nvmlDeviceGetCurrPcieLinkGeneration": 5, "nvmlDeviceGetCurrPcieLinkWidth": 16,
                  "nvmlDeviceGetComputeRunningProcesses": [{"pid": 1, "usedGpuMemory": 1}],
                  "nvmlDeviceGetNvLinkState": {"0": 1, ...},
                  "nvmlDeviceGetNvLinkRemotePciInfo": {"0": {"busId": "..."}, ...}}]}

Any value may instead be ``{"error": "NVML_ERROR_..."}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

DEVICE_CALLS = (
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetComputeRunningProcesses",
)
_OBJECT_FIELDS = {
    "nvmlDeviceGetPciInfo": ("busId",),
    "nvmlDeviceGetMemoryInfo": ("total", "used", "free"),
    "nvmlDeviceGetUtilizationRates": ("gpu", "memory"),
}


def _error(exc: Exception) -> dict[str, str]:
    code = getattr(exc, "value", None)
    names = [n for n in dir(pynvml) if n.startswith("NVML_ERROR_") and getattr(pynvml, n) == code]
    return {"error": names[0] if names else "NVML_ERROR_UNKNOWN"}


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _plain(call: str, value: Any) -> Any:
    """A pynvml return value as JSON."""
    if call in _OBJECT_FIELDS:
        return {f: _text(getattr(value, f)) for f in _OBJECT_FIELDS[call]}
    if call == "nvmlDeviceGetComputeRunningProcesses":
        return [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in value]
    return _text(value)


def record(nvml: Any, name: str = "recorded") -> dict[str, Any]:
    """Call every function the collector uses and keep the answers (run on a GPU node)."""
    scenario: dict[str, Any] = {"name": name, "devices": []}
    try:
        nvml.nvmlInit()
        scenario["nvmlInit"] = None
    except nvml.NVMLError as exc:
        scenario["nvmlInit"] = _error(exc)
        return scenario
    try:
        scenario["nvmlSystemGetDriverVersion"] = _text(nvml.nvmlSystemGetDriverVersion())
        for i in range(nvml.nvmlDeviceGetCount()):
            dev: dict[str, Any] = {}
            scenario["devices"].append(dev)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                dev["nvmlDeviceGetHandleByIndex"] = None
            except nvml.NVMLError as exc:
                dev["nvmlDeviceGetHandleByIndex"] = _error(exc)
                continue
            for call in DEVICE_CALLS:
                try:
                    dev[call] = _plain(call, getattr(nvml, call)(handle))
                except nvml.NVMLError as exc:
                    dev[call] = _error(exc)
            states: dict[str, Any] = {}
            remotes: dict[str, Any] = {}
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                try:
                    states[str(link)] = nvml.nvmlDeviceGetNvLinkState(handle, link)
                except nvml.NVMLError as exc:
                    states[str(link)] = _error(exc)
                    break  # links are numbered densely: the first missing one ends the list
                try:
                    remotes[str(link)] = _plain(
                        "nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                    )
                except nvml.NVMLError as exc:
                    remotes[str(link)] = _error(exc)
            dev["nvmlDeviceGetNvLinkState"] = states
            dev["nvmlDeviceGetNvLinkRemotePciInfo"] = remotes
    finally:
        nvml.nvmlShutdown()
    return scenario


class RecordedNvml:
    """An NVML-like module that answers from a recorded scenario (for tests and demos)."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED

    def __init__(self, scenario: dict[str, Any]):
        self.scenario = scenario
        self.initialised = False

    @classmethod
    def from_file(cls, path: str | Path) -> RecordedNvml:
        return cls(json.loads(Path(path).read_text()))

    @staticmethod
    def _answer(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"error"}:
            raise pynvml.NVMLError(getattr(pynvml, value["error"]))
        return value

    def _require_init(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self._answer(self.scenario.get("nvmlInit"))
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return str(self._answer(self.scenario.get("nvmlSystemGetDriverVersion", "")))

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.scenario.get("devices", []))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        self._require_init()
        devices = self.scenario.get("devices", [])
        if not 0 <= index < len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._answer(devices[index].get("nvmlDeviceGetHandleByIndex"))
        return devices[index]

    def _device(self, call: str, handle: dict[str, Any]) -> Any:
        self._require_init()
        if call not in handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        value = self._answer(handle[call])
        if call in _OBJECT_FIELDS:
            return SimpleNamespace(**value)
        if call == "nvmlDeviceGetComputeRunningProcesses":
            return [SimpleNamespace(**p) for p in value]
        return value

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return self._device("nvmlDeviceGetUUID", h)

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return self._device("nvmlDeviceGetName", h)

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> Any:
        return self._device("nvmlDeviceGetPciInfo", h)

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        return self._device("nvmlDeviceGetMemoryInfo", h)

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> Any:
        return self._device("nvmlDeviceGetUtilizationRates", h)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkGeneration", h)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkWidth", h)

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:
        return self._device("nvmlDeviceGetComputeRunningProcesses", h)

    def _link(self, call: str, h: dict[str, Any], link: int) -> Any:
        self._require_init()
        links = h.get(call, {})
        if str(link) not in links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._answer(links[str(link)])

    def nvmlDeviceGetNvLinkState(self, h: dict[str, Any], link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkState", h, link)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: dict[str, Any], link: int) -> Any:
        return SimpleNamespace(**self._link("nvmlDeviceGetNvLinkRemotePciInfo", h, link))
