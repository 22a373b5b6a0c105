"""ServeGen window-table parser: the bundled tenants and malformed files."""

from pathlib import Path

import numpy as np
import pytest

from controlplane.core.traces.paths import shared_data_dir
from controlplane.core.traces.servegen import (
    SERVEGEN_M_LARGE,
    ServegenFormatError,
    load_servegen_windows,
)

M_LARGE = shared_data_dir() / SERVEGEN_M_LARGE


def test_bundled_m_large_has_162_tenants_of_14_days():
    tenants = load_servegen_windows()
    assert len(tenants) == 162
    assert list(tenants)[:3] == ["chunk-0", "chunk-1", "chunk-2"]
    t0 = tenants["chunk-0"]
    assert len(t0) == 14 * 144 and t0.window_s == 600.0
    # First row of chunk-0-trace.csv, read by hand.
    assert t0.window_start_s[0] == 0 and t0.pattern[0] == "Weibull"
    assert t0.rate[0] == pytest.approx(1.3316666666666668)
    assert t0.shape[0] == pytest.approx(0.3753486140101707)
    assert t0.pattern[1] == "" and t0.rate[1] == 0
    assert t0.expected_counts()[0] == pytest.approx(1.3316666666666668 * 600)
    # The data README: summed over clients the mean rate is ~196 req/s.
    total = sum(t.rate.mean() for t in tenants.values())
    assert 190 < total < 200


def test_single_file_and_numeric_order(tmp_path: Path):
    for n in (10, 2):
        (tmp_path / f"chunk-{n}-trace.csv").write_text("0,1.0,1.0,Gamma,1.0,1.0\n60,0,0,,0,0\n")
    tenants = load_servegen_windows(tmp_path)
    assert list(tenants) == ["chunk-2", "chunk-10"]
    one = load_servegen_windows(tmp_path / "chunk-2-trace.csv")
    assert one["chunk-2"].window_s == 60.0
    np.testing.assert_array_equal(one["chunk-2"].expected_counts(), [60.0, 0.0])


@pytest.mark.parametrize(
    "body, message",
    [
        ("0,1.0,1.0,Gamma,1.0\n", "expected 6 columns"),
        ("0,x,1.0,Gamma,1.0,1.0\n", "non-numeric"),
        ("0,1.0,1.0,Poisson,1.0,1.0\n", "unknown pattern"),
        ("0,1.0,1.0,,0,0\n", "empty pattern"),
        ("0,-1,1.0,Gamma,1.0,1.0\n", "negative"),
        ("0,1.0,1.0,Weibull,0,1.0\n", "shape > 0"),
        ("600,1,1,Gamma,1,1\n0,1,1,Gamma,1,1\n", "strictly increase"),
        ("", "no windows"),
    ],
)
def test_malformed_rows_are_refused_with_file_and_line(tmp_path: Path, body: str, message: str):
    f = tmp_path / "chunk-0-trace.csv"
    f.write_text(body)
    with pytest.raises(ServegenFormatError, match=message):
        load_servegen_windows(f)


def test_missing_path_and_empty_folder(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        load_servegen_windows(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no"):
        load_servegen_windows(tmp_path)
