"""ServeGen client halves (`--clients tune|holdout`): a fixed split by client name, and every
runner builds its workload from the half it is asked for."""

import json
import random
import shutil
from pathlib import Path

import pytest

from controlplane.core.traces.paths import shared_data_dir
from controlplane.core.traces.servegen import SERVEGEN_M_LARGE
from controlplane.sim.cli import main, parser
from controlplane.sim.grid import _key, job_for
from controlplane.sim.scenarios import build, offered_load
from controlplane.sim.seeds import setup_of
from controlplane.sim.workloads.servegen import client_halves

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "servegen"
START = 86400 * 2 + 7200  # both fixture tenants have traffic from here on
# m-large's tune half, as experiments/client-halves/README.md lists it (chunk numbers).
M_LARGE_TUNE = (
    *(1, 7, 8, 10, 11, 12, 15, 17, 18, 20, 23, 25, 27, 28, 29, 30, 31, 33, 34, 35, 37, 38, 41),
    *(42, 46, 47, 49, 50, 52, 54, 58, 59, 61, 63, 65, 66, 67, 70, 71, 75, 76, 77, 79, 80, 81),
    *(86, 87, 89, 90, 91, 92, 94, 98, 101, 103, 104, 107, 109, 110, 111, 113, 116, 118, 119),
    *(122, 123, 127, 134, 135, 140, 142, 144, 146, 148, 151, 154, 155, 156, 157, 158, 159),
)


def _numbers(names) -> list[int]:
    return sorted(int(n.split("-")[1]) for n in names)


def test_m_large_halves_are_fixed_disjoint_balanced_and_independent_of_order():
    names = [
        p.name.removesuffix("-trace.csv")
        for p in (shared_data_dir() / SERVEGEN_M_LARGE).glob("*-trace.csv")
    ]
    halves = client_halves(names)
    tune, holdout = set(halves["tune"]), set(halves["holdout"])
    assert len(names) == 162 and len(tune) == len(holdout) == 81
    assert not tune & holdout and tune | holdout == set(names)
    assert _numbers(tune) == sorted(M_LARGE_TUNE)  # the same split on every run and machine
    shuffled = names[:]
    random.Random(7).shuffle(shuffled)
    assert client_halves(shuffled) == halves  # by name, not by file order


@pytest.fixture
def six_clients(tmp_path: Path) -> Path:
    """chunk-0..chunk-5, each a copy of one fixture tenant: tune 0, 1, 2; holdout 3, 4, 5."""
    for i in range(6):
        src = FIX / ("chunk-1-trace.csv" if i % 2 else "chunk-7-trace.csv")
        shutil.copy(src, tmp_path / f"chunk-{i}-trace.csv")
    assert client_halves([f"chunk-{i}" for i in range(6)]) == {
        "tune": ("chunk-1", "chunk-0", "chunk-2"),
        "holdout": ("chunk-5", "chunk-3", "chunk-4"),
    }
    return tmp_path


def _build(folder: Path, clients: str):
    return build(
        trace_dir=str(folder),
        clients=clients,
        scenario="steady",
        model="llama3-8b",
        engines=4,
        start=START,
        duration=1800,
        seed=0,
    )


def test_the_workload_holds_only_its_half_at_the_same_target_load(six_clients):
    got = {c: _build(six_clients, c) for c in ("all", "tune", "holdout")}
    keys = {c: set(s.workload.prefix_wkey) for c, s in got.items()}
    assert keys["tune"] == {"chunk-0", "chunk-1", "chunk-2"}
    assert keys["holdout"] == {"chunk-3", "chunk-4", "chunk-5"}
    assert keys["all"] == keys["tune"] | keys["holdout"]
    assert "tune half" in got["tune"].assumptions["clients"]
    for s in got.values():  # each half scaled to the target (0.55) on its own
        assert offered_load(s.config, s.workload)["peak_5min"] == pytest.approx(0.55, rel=0.25)


def test_the_flag_reaches_grid_seeds_and_run(six_clients, tmp_path):
    args = parser().parse_args(["grid", "--clients", "holdout", "--trace-dir", str(six_clients)])
    job = job_for(("servegen", "llama3-8b", "steady"), 0, args)
    assert job["clients"] == "holdout"
    setup = setup_of({**job, "duration": 1800})
    assert set(setup.workload.prefix_wkey) == {"chunk-3", "chunk-4", "chunk-5"}
    # A half's runs never stand in for the other half's or for all clients' when resuming;
    # a job of all clients keeps the key the runs before the halves were written under.
    keys = {_key({**job, "clients": c}) for c in ("all", "tune", "holdout")}
    assert len(keys) == 3 and _key({**job, "clients": "all"}) == "servegen:llama3-8b:steady#0#" + (
        ",".join(job["policies"])
    )
    assert parser().parse_args(["seeds", "--clients", "tune"]).clients == "tune"
    out = tmp_path / "run.json"
    argv = ["run", "--trace-dir", str(six_clients), "--clients", "tune", "--policies"]
    argv += ["cache-aware", "--model", "llama3-8b", "--engines", "4", "--start", str(START)]
    argv += ["--duration", "600", "--warmup", "0", "--json", str(out)]
    assert main(argv) == 0
    assert "tune half" in json.loads(out.read_text())["assumptions"]["clients"]


def test_halves_of_a_trace_without_clients_are_refused():
    with pytest.raises(ValueError, match="ServeGen"):
        build(workload="mooncake", clients="tune", duration=60)
