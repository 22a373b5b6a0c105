"""The room a replica may take: speculation stays within the speculative slice; a replica the
measured demand alone asks for goes there too where the slice has room, and where it has none
may take free and cold room outside it, as ordinary cache."""

from controlplane.core.policy.planner import plan
from controlplane.core.policy.types import Candidate, Demand, EngineState, Holding
from tests.planner_settings import uncharged

GB = 1e9
H = 60.0


def _engines(n=4, free=100 * GB):
    return [EngineState(f"e{i}", f"n{i}", 100 * GB, free, 0.0, 12.5e9, 0.2) for i in range(n)]


def _prefix(nbytes=5 * GB):
    # one holder takes 0.8 spare / 0.2 s x 0.8 target utilisation = 3.2 requests/s of it
    return Candidate("p", (1, 2, 3), 16384, int(nbytes), "t", service_s=0.2, recompute_s=3.0)


def _demand(rate, measured):
    return Demand("p", rate * H, 0.0, rate, 1.0, measured_rate=measured, forecast_rate=rate)


def _plan(demand, slice_=0.04, engines=None):  # 4 GB of a 100 GB engine: 5 GB never fits
    b = uncharged(max_spec_vram_fraction=slice_, horizon_s=H)
    return plan([_prefix()], [demand], [Holding("p", "e0")], engines or _engines(), b)


def test_a_measured_overflow_is_replicated_outside_the_slice_a_forecast_one_is_not():
    items = _plan(_demand(10.0, measured=10.0))
    assert items and all(i.measured and i.target != "e0" for i in items)
    assert all("measured demand" in i.reason for i in items)
    assert _plan(_demand(10.0, measured=0.0)) == []  # the forecast's part: speculation


def test_only_the_measured_part_of_the_overflow_leaves_the_slice():
    # measured 4/s overflows the holder (3.2/s) by 0.8/s: one replica covers it; the forecast's
    # further 16/s would need speculative room, which a 5 GB prefix never has in a 4 GB slice
    items = _plan(_demand(20.0, measured=4.0))
    assert [i.measured for i in items] == [True]
    # with a slice it fits, every replica is in the slice, the measured one too
    roomy = _plan(_demand(20.0, measured=4.0), slice_=0.25)
    assert len(roomy) > 1 and not any(i.measured for i in roomy)


def test_measured_room_is_still_free_and_cold_room_only():
    tight = [
        EngineState(f"e{i}", f"n{i}", 100 * GB, 1 * GB, 0.0, 12.5e9, 0.2, demand_room_bytes=3 * GB)
        for i in range(4)
    ]
    assert _plan(_demand(10.0, measured=10.0), engines=tight) == []  # 5 GB fits nowhere
