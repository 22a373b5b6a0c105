"""Bounded on-disk spool of reports waiting for the control plane, replayed in seq order.

One file per report (``<seq>.rep``, written to a temporary name then renamed, so a crash never
leaves half a report). The bound is on total bytes: ``append`` refuses a report that would pass
it, and the caller then drops the spool (counted) and sends a snapshot instead.
"""

from __future__ import annotations

import os
from pathlib import Path


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()  # a write interrupted by a crash
        self._sizes = {int(p.stem): p.stat().st_size for p in self.dir.glob("*.rep")}
        self.dropped_reports = 0

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
        if self.total_bytes + len(body) > self.max_bytes:
            return False
        tmp = self.dir / f"{seq:020d}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(seq))
        self._sizes[seq] = len(body)
        return True

    def read(self, seq: int) -> bytes:
        return self._path(seq).read_bytes()

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
