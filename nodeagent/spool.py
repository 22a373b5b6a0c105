"""Bounded on-disk spool of reports waiting for the control plane, replayed in seq order.

One file per report (``<seq>.rep``, written to a temporary name then renamed, so a crash never
leaves half a report). Each file is framed: magic, body length and CRC-32, then the body, so a
file truncated or corrupted on disk (a full disk, a bad sector, a hand edit) is recognised. On
start every file is checked; a bad one is logged, counted in ``corrupt_reports`` and removed
(its deltas are lost, which the first report after start, a snapshot, repairs). A report read
later that fails its check is treated the same way (``read`` returns None).

The bound is on total bytes: ``append`` refuses a report that would pass it, and the caller then
drops the spool (counted) and sends a snapshot instead.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"PWS1"
_HEADER = struct.Struct(">4sII")  # magic, body length, crc32 of the body


def frame(body: bytes) -> bytes:
    return _HEADER.pack(MAGIC, len(body), zlib.crc32(body)) + body


def unframe(data: bytes) -> bytes | None:
    """The body of a framed report, or None when the frame is truncated or corrupt."""
    if len(data) < _HEADER.size:
        return None
    magic, length, crc = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != MAGIC or length != len(body) or zlib.crc32(body) != crc:
        return None
    return body


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_reports = 0
        self.corrupt_reports = 0
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()  # a write interrupted by a crash
        self._sizes: dict[int, int] = {}
        for path in sorted(self.dir.glob("*.rep")):
            self._scan(path)

    def _scan(self, path: Path) -> None:
        try:
            seq = int(path.stem)
            ok = seq > 0 and unframe(path.read_bytes()) is not None
        except (ValueError, OSError):
            ok = False
        if not ok:
            self._discard(path, "truncated, corrupt or misnamed")
            return
        self._sizes[seq] = path.stat().st_size

    def _discard(self, path: Path, why: str) -> None:
        self.corrupt_reports += 1
        log.warning(
            "spool file %s is %s: skipped (the next snapshot repairs residency)", path.name, why
        )
        path.unlink(missing_ok=True)

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:020d}.rep"

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._sizes)

    def seqs(self) -> list[int]:
        return sorted(self._sizes)

    def append(self, seq: int, body: bytes) -> bool:
        """Persist one report; False (and nothing written) if it would pass the bound."""
        data = frame(body)
        if self.total_bytes + len(data) > self.max_bytes:
            return False
        tmp = self.dir / f"{seq:020d}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(seq))
        self._sizes[seq] = len(data)
        return True

    def read(self, seq: int) -> bytes | None:
        """The report body, or None (the file is then removed and counted) if it fails its check."""
        path = self._path(seq)
        try:
            body = unframe(path.read_bytes())
        except OSError:
            body = None
        if body is None:
            self._sizes.pop(seq, None)
            self._discard(path, "unreadable or corrupt")
        return body

    def remove(self, seq: int) -> None:
        self._path(seq).unlink(missing_ok=True)
        self._sizes.pop(seq, None)

    def drop_through(self, last_seq: int) -> int:
        """Remove every report with ``seq <= last_seq`` (already applied by the server)."""
        gone = [s for s in self._sizes if s <= last_seq]
        for s in gone:
            self.remove(s)
        return len(gone)

    def drop_all(self) -> int:
        """Discard everything (bound hit); the count is kept for metrics and the next report."""
        n = len(self._sizes)
        for s in list(self._sizes):
            self.remove(s)
        self.dropped_reports += n
        return n
