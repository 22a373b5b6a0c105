"""ServeGen per-tenant window tables (`chunk-N-trace.csv`), parsed into numpy arrays.

ServeGen (Xiang et al., arXiv 2505.09999; alibaba/ServeGen, Apache-2.0) publishes, per tenant
("client"), one row per fixed window (10 minutes in `m-large`) with no header:

    window_start_s, rate_req_per_s, interarrival_cv, pattern, shape, scale

`pattern` is `Gamma` or `Weibull` (scipy `gamma(a=shape, scale=scale)` / `weibull_min(c=shape,
scale=scale)` inter-arrival times in seconds) and empty for a window without traffic (then rate,
cv, shape and scale are 0). This module only parses and validates the table; turning windows into
arrivals belongs to the simulator's workload loaders, forecasting uses `expected_counts()`.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controlplane.core.traces.paths import shared_data_dir

#: The bundled m-large tenants, relative to the shared data folder.
SERVEGEN_M_LARGE = Path("traces/servegen-m-large")

PATTERNS = ("Gamma", "Weibull")
_CHUNK_NUMBER = re.compile(r"(\d+)")


class ServegenFormatError(ValueError):
    """A ServeGen window table that does not have the documented shape."""


@dataclass(frozen=True)
class ServegenTenant:
    """One tenant's windows, oldest first; all arrays have one entry per window."""

    name: str
    window_start_s: np.ndarray  # float64, strictly increasing
    rate: np.ndarray  # requests per second over the window
    cv: np.ndarray  # coefficient of variation of inter-arrival times in the window
    pattern: np.ndarray  # "Gamma" | "Weibull" | "" (no traffic)
    shape: np.ndarray  # Gamma `a` or Weibull `c`
    scale: np.ndarray  # seconds
    window_s: float

    def __len__(self) -> int:
        return len(self.window_start_s)

    def expected_counts(self) -> np.ndarray:
        """Requests per window (rate x window length): the demand series forecasters work on."""
        return self.rate * self.window_s


def load_servegen_windows(path: str | Path | None = None) -> dict[str, ServegenTenant]:
    """Parse one `chunk-N-trace.csv` file or a folder of them into `{tenant name: windows}`.

    `path=None` reads the bundled m-large tenants from the shared data folder. Tenants are named
    after their file (`chunk-7`) and returned in numeric order. Raises `ServegenFormatError`
    naming the file and line for any malformed row, and `FileNotFoundError` for a missing path or
    a folder without trace files.
    """
    path = Path(path) if path is not None else shared_data_dir() / SERVEGEN_M_LARGE
    if not path.exists():
        raise FileNotFoundError(f"ServeGen trace path does not exist: {path}")
    if path.is_dir():
        files = sorted(path.glob("*-trace.csv"), key=_numeric_key)
        if not files:
            raise FileNotFoundError(f"no *-trace.csv files in {path}")
    else:
        files = [path]
    tenants = [_load_file(f) for f in files]
    return {t.name: t for t in tenants}


def _numeric_key(p: Path) -> tuple[int, str]:
    m = _CHUNK_NUMBER.search(p.name)
    return (int(m.group(1)) if m else -1, p.name)


def _load_file(path: Path) -> ServegenTenant:
    starts, rates, cvs, patterns, shapes, scales = [], [], [], [], [], []
    with path.open(newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            if len(row) != 6:
                raise ServegenFormatError(f"{path}:{lineno}: expected 6 columns, got {len(row)}")
            try:
                start, rate, cv, shape, scale = (float(row[i]) for i in (0, 1, 2, 4, 5))
            except ValueError as exc:
                raise ServegenFormatError(f"{path}:{lineno}: non-numeric field ({exc})") from None
            pattern = row[3].strip()
            _check_row(path, lineno, rate, cv, pattern, shape, scale)
            starts.append(start)
            rates.append(rate)
            cvs.append(cv)
            patterns.append(pattern)
            shapes.append(shape)
            scales.append(scale)
    if not starts:
        raise ServegenFormatError(f"{path}: no windows")
    start_arr = np.asarray(starts, dtype=np.float64)
    gaps = np.diff(start_arr)
    if (gaps <= 0).any():
        bad = int(np.argmax(gaps <= 0)) + 2
        raise ServegenFormatError(f"{path}:{bad}: window starts must strictly increase")
    # The window length is the common spacing; a single-window file gets ServeGen's 10 minutes.
    window_s = float(np.median(gaps)) if len(gaps) else 600.0
    name = path.name.removesuffix(".csv").removesuffix("-trace")
    return ServegenTenant(
        name=name,
        window_start_s=start_arr,
        rate=np.asarray(rates, dtype=np.float64),
        cv=np.asarray(cvs, dtype=np.float64),
        pattern=np.asarray(patterns, dtype=object),
        shape=np.asarray(shapes, dtype=np.float64),
        scale=np.asarray(scales, dtype=np.float64),
        window_s=window_s,
    )


def _check_row(
    path: Path, lineno: int, rate: float, cv: float, pattern: str, shape: float, scale: float
) -> None:
    where = f"{path}:{lineno}"
    if not all(math.isfinite(v) for v in (rate, cv, shape, scale)):
        raise ServegenFormatError(f"{where}: non-finite value")
    if rate < 0 or cv < 0:
        raise ServegenFormatError(f"{where}: negative rate or cv")
    if pattern == "":
        if rate != 0:
            raise ServegenFormatError(f"{where}: empty pattern but rate {rate} > 0")
        return
    if pattern not in PATTERNS:
        raise ServegenFormatError(f"{where}: unknown pattern {pattern!r}, expected {PATTERNS}")
    if shape <= 0 or scale <= 0:
        raise ServegenFormatError(f"{where}: {pattern} needs shape > 0 and scale > 0")
