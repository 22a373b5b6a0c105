"""Parse and validate an agent report (docs/agent-protocol.md) without Django.

Everything is checked before anything is applied, so a bad report changes nothing. Errors name the
field, e.g. ``residency[0].stored[12][0]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from wire.protocol import (
    MODE_DELTA,
    MODE_SNAPSHOT,
    MODES,
    ProtocolError,
    decode_removed,
    decode_stored,
)

MAX_ID_LEN = 100
_MAX_BYTES = 2**63 - 1  # a signed 64-bit database column

ReportError = ProtocolError  # a report that breaks the protocol; ``field`` says where


@dataclass
class ResidencyEntry:
    """One engine's parsed residency entry (the agent's own per-engine state is
    ``nodeagent.engine_residency.EngineResidency``)."""

    engine_id: str
    mode: str  # protocol.MODE_DELTA | protocol.MODE_SNAPSHOT
    cleared: bool
    stored: list[tuple[int, int | None, str]]
    removed: list[tuple[int, str]]
    engine_scoped: int = 0  # how many stored keys had no token ids


@dataclass
class Report:
    seq: int
    boot_id: str
    sent_at: float | None
    # The transports the agent's executors run; None from an agent too old to say.
    transports: list[str] | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    residency: list[ResidencyEntry] = field(default_factory=list)

    @property
    def snapshot_only(self) -> bool:
        return bool(self.residency) and all(r.mode == MODE_SNAPSHOT for r in self.residency)


def _int(value: Any, where: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ReportError(where, f"expected an integer in [{lo}, {hi}]")
    return value


def _num(value: Any, where: str, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(where, "expected a finite number")
    return float(value)


def _str(value: Any, where: str, max_len: int = MAX_ID_LEN, optional: bool = False) -> str:
    if optional and (value is None or value == ""):
        return ""
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise ReportError(where, f"expected a non-empty string of at most {max_len} characters")
    return value


def _dict(value: Any, where: str, optional: bool = True) -> dict:
    if value is None and optional:
        return {}  # NVML could not say: an absent value, not an error
    if not isinstance(value, dict):
        raise ReportError(where, "expected an object")
    return value


def _list(value: Any, where: str, max_len: int | None = None, optional: bool = True) -> list:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise ReportError(where, "expected an array")
    if max_len is not None and len(value) > max_len:
        raise ReportError(where, f"at most {max_len} entries")
    return value


# Free-form sub-documents (a GPU's pcie, processes and errors, an engine's endpoints and
# metrics) are stored as JSON and shown: plain JSON only, bounded.
DOC_MAX_DEPTH = 8
DOC_MAX_NODES = 4096
DOC_MAX_STR = 4096
_INT_BOUND = 2**63


def check_document(value: Any, where: str) -> Any:
    """``value`` if it is a plain JSON document (string keys; finite numbers; integers within 64
    bits; strings of at most DOC_MAX_STR characters; at most DOC_MAX_DEPTH levels and
    DOC_MAX_NODES values), else ReportError naming where it is not."""
    budget = [DOC_MAX_NODES]

    def walk(v: Any, at: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ReportError(where, f"more than {DOC_MAX_NODES} values")
        if depth > DOC_MAX_DEPTH:
            raise ReportError(at, f"nested deeper than {DOC_MAX_DEPTH} levels")
        if v is None or isinstance(v, bool):
            return
        if isinstance(v, int):
            if not -_INT_BOUND <= v < _INT_BOUND:
                raise ReportError(at, "integer outside 64 bits")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ReportError(at, "expected a finite number")
        elif isinstance(v, str):
            if len(v) > DOC_MAX_STR:
                raise ReportError(at, f"string longer than {DOC_MAX_STR} characters")
        elif isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str) or len(k) > MAX_ID_LEN * 2:
                    raise ReportError(at, "keys must be strings of at most 200 characters")
                walk(item, f"{at}.{k}" if at else k, depth + 1)
        elif isinstance(v, list):
            for i, item in enumerate(v):
                walk(item, f"{at}[{i}]", depth + 1)
        else:
            raise ReportError(at, f"{type(v).__name__} is not JSON")

    walk(value, where, 0)
    return value


GPU_INT_FIELDS = ("memory_total", "memory_used", "memory_free")


def _gpu(raw: Any, where: str) -> dict[str, Any]:
    g = _dict(raw, where, optional=False)
    out: dict[str, Any] = {
        # A GPU NVML cannot read (lost, fallen off the bus) comes without a uuid: it is matched
        # by index and marked lost.
        "uuid": _str(g.get("uuid"), f"{where}.uuid", optional=True) or None,
        "index": _int(g.get("index"), f"{where}.index", 0, 4096),
        "name": _str(g.get("name"), f"{where}.name", 200, optional=True),
    }
    for name in GPU_INT_FIELDS:
        value = g.get(name)
        nbytes = None if value is None else int(_num(value, f"{where}.{name}") or 0)
        if nbytes is not None and not 0 <= nbytes <= _MAX_BYTES:
            raise ReportError(f"{where}.{name}", f"expected bytes in [0, {_MAX_BYTES}]")
        out[name] = nbytes
    out["utilization_gpu"] = _num(g.get("utilization_gpu"), f"{where}.utilization_gpu")
    out["nvlink_peers"] = [
        _str(p, f"{where}.nvlink_peers[{i}]")
        for i, p in enumerate(_list(g.get("nvlink_peers", []), f"{where}.nvlink_peers", 64))
    ]
    out["pcie"] = check_document(_dict(g.get("pcie", {}), f"{where}.pcie"), f"{where}.pcie")
    out["processes"] = check_document(
        _list(g.get("processes", []), f"{where}.processes", 1024), f"{where}.processes"
    )
    out["errors"] = check_document(_dict(g.get("errors", {}), f"{where}.errors"), f"{where}.errors")
    out["lost"] = bool(g.get("lost", False)) or out["uuid"] is None
    return out


def _engine(raw: Any, where: str) -> dict[str, Any]:
    e = _dict(raw, where, optional=False)
    return {
        "engine_id": _str(e.get("engine_id"), f"{where}.engine_id"),
        "kind": _str(e.get("kind", "vllm"), f"{where}.kind", 16),
        "model": _str(e.get("model"), f"{where}.model", 200, optional=True),
        "block_size": _int(e.get("block_size", 16), f"{where}.block_size", 1, 1 << 20),
        "bytes_per_block": _int(e.get("bytes_per_block", 0), f"{where}.bytes_per_block"),
        "kv_capacity_blocks": _int(e.get("kv_capacity_blocks", 0), f"{where}.kv_capacity_blocks"),
        "gpu_uuids": [
            _str(u, f"{where}.gpu_uuids[{i}]")
            for i, u in enumerate(_list(e.get("gpu_uuids", []), f"{where}.gpu_uuids", 64))
        ],
        "endpoints": check_document(
            _dict(e.get("endpoints", {}), f"{where}.endpoints"), f"{where}.endpoints"
        ),
        "metrics": check_document(
            _dict(e.get("metrics", {}), f"{where}.metrics"), f"{where}.metrics"
        ),
        # What the agent learnt of the engine for the fleet doctor (controlplane/core/doctor.py)
        "doctor": check_document(_dict(e.get("doctor", {}), f"{where}.doctor"), f"{where}.doctor"),
    }


def _residency(raw: Any, where: str, budget: list[int]) -> ResidencyEntry:
    r = _dict(raw, where, optional=False)
    mode = r.get("mode", MODE_DELTA)
    if mode not in MODES:
        raise ReportError(f"{where}.mode", f"expected {' or '.join(map(repr, MODES))}")
    stored_raw = _list(r.get("stored", []), f"{where}.stored")
    removed_raw = _list(r.get("removed", []), f"{where}.removed")
    budget[0] -= len(stored_raw) + len(removed_raw)
    if budget[0] < 0:
        raise ReportError(f"{where}", "too many residency deltas in one report")
    stored, scoped = decode_stored(stored_raw, f"{where}.stored")
    removed = decode_removed(removed_raw, f"{where}.removed")
    cleared = r.get("cleared", False)
    if not isinstance(cleared, bool):
        raise ReportError(f"{where}.cleared", "expected a boolean")
    return ResidencyEntry(
        engine_id=_str(r.get("engine_id"), f"{where}.engine_id"),
        mode=mode,
        cleared=cleared,
        stored=stored,
        removed=removed,
        engine_scoped=scoped,
    )


def parse_report(raw: Any, max_deltas: int = 200_000) -> Report:
    """Validate a decoded report body; raises ReportError naming the first bad field."""
    body = _dict(raw, "", optional=False)
    report = Report(
        seq=_int(body.get("seq"), "seq", 1),
        boot_id=_str(body.get("boot_id"), "boot_id", 64),
        sent_at=_num(body.get("sent_at"), "sent_at"),
    )
    if body.get("transports") is not None:
        report.transports = [
            _str(t, f"transports[{i}]", 32)
            for i, t in enumerate(_list(body["transports"], "transports", 16))
        ]
    report.gpus = [
        _gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(body.get("gpus", []), "gpus", 64))
    ]
    report.engines = [
        _engine(e, f"engines[{i}]")
        for i, e in enumerate(_list(body.get("engines", []), "engines", 256))
    ]
    budget = [max_deltas]
    report.residency = [
        _residency(r, f"residency[{i}]", budget)
        for i, r in enumerate(_list(body.get("residency", []), "residency", 256))
    ]
    known = {e["engine_id"] for e in report.engines}
    for i, r in enumerate(report.residency):
        if r.engine_id not in known:
            raise ReportError(
                f"residency[{i}].engine_id",
                f"engine {r.engine_id!r} is not in this report's engines",
            )
    uuids = [g["uuid"] for g in report.gpus if g["uuid"]]
    if len(set(uuids)) != len(uuids):
        raise ReportError("gpus", "duplicate GPU uuid")
    ids = [e["engine_id"] for e in report.engines]
    if len(set(ids)) != len(ids):
        raise ReportError("engines", "duplicate engine_id")
    return report
