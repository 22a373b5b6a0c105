"""The live-vs-sim study's pure parts (``experiments/live_vs_sim``): a pass's TTFT figures, the
pairing of passes by seed, the direction and its agreement, copy timing and what it reads from
a pass's control-plane database; and that the ``headline`` preset is the grid's cell."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from experiments.live_vs_sim.evidence import engine_index, live_evidence
from experiments.live_vs_sim.figures import (
    AHEAD,
    BEHIND,
    UNRESOLVED,
    agreement,
    compare,
    copy_timing,
    paired_gain,
    pass_figures,
    read_served,
)
from experiments.live_vs_sim.run import order_of, tenants_for


def test_pass_figures_leave_out_the_warmup_and_take_numpys_p99():
    served = [(t, 100.0) for t in range(0, 300)]  # the cold start: left out
    served += [(300.0 + i, float(i)) for i in range(101)]  # 0..100 s
    fig = pass_figures(served, warmup_s=300.0)
    assert fig["requests"] == 101
    assert fig["ttft_mean_s"] == pytest.approx(50.0)
    assert fig["ttft_p99_s"] == pytest.approx(np.percentile(np.arange(101.0), 99))
    with pytest.raises(ValueError, match="no request after the 300 s warm-up"):
        pass_figures([(10.0, 1.0)], warmup_s=300.0)


def test_read_served_wants_the_served_log(tmp_path):
    good = tmp_path / "served.csv"
    good.write_text("t_s,ttft_s,engine,cached_tokens,prompt_tokens\n1.5,0.25,0,16,32\n")
    assert read_served(good) == [(1.5, 0.25)]
    bad = tmp_path / "other.csv"
    bad.write_text("time,latency\n1,2\n")
    with pytest.raises(ValueError, match="not a served log"):
        read_served(bad)


def test_paired_gain_direction_needs_the_interval_to_exclude_zero():
    ahead = paired_gain([2.0, 2.2, 1.9], [1.0, 1.1, 1.0])
    assert ahead["diff_s"] == pytest.approx([1.0, 1.1, 0.9])
    assert ahead["diff_ci95_s"][0] > 0
    assert ahead["direction"] == AHEAD
    assert ahead["gain_mean"] == pytest.approx((0.5 + 0.5 + 0.9 / 1.9) / 3)
    assert paired_gain([1.0, 1.1, 1.0], [2.0, 2.2, 1.9])["direction"] == BEHIND
    assert paired_gain([2.0, 1.0, 1.5], [1.0, 2.0, 1.4])["direction"] == UNRESOLVED
    # One seed's tail ten times the others': the seconds' interval spans zero, the gains' not.
    tail = paired_gain([10.0, 1.0, 1.0], [1.0, 0.5, 0.5])
    assert tail["diff_ci95_s"][0] < 0 < tail["gain_ci95"][0]
    assert tail["direction"] == AHEAD
    one = paired_gain([2.0], [1.0])
    assert one["diff_ci95_s"] is None and one["direction"] == AHEAD + " (one pair, no interval)"
    with pytest.raises(ValueError):
        paired_gain([1.0, 2.0], [1.0])


def _pass(seed, strategy, p99):
    return {"seed": seed, "strategy": strategy, "figures": {"ttft_p99_s": p99}}


def test_compare_pairs_passes_by_seed_and_leaves_out_an_unpaired_seed():
    passes = [
        _pass(1, "reactive", 3.0),
        _pass(0, "predictive", 1.0),
        _pass(0, "reactive", 2.0),
        _pass(1, "predictive", 2.5),
        _pass(2, "reactive", 9.0),  # its predictive pass never ran
    ]
    c = compare(passes)
    assert c["seeds"] == [0, 1]
    assert c["diff_s"] == pytest.approx([1.0, 0.5])
    with pytest.raises(ValueError, match="two reactive passes"):
        compare(passes + [_pass(0, "reactive", 2.0)])
    with pytest.raises(ValueError, match="want reactive or predictive"):
        compare([_pass(0, "off", 1.0)])
    with pytest.raises(ValueError, match="no seed with both"):
        compare([_pass(0, "reactive", 1.0)])


def test_agreement_of_live_and_simulated_directions():
    assert agreement(AHEAD, AHEAD) == "same"
    assert agreement(BEHIND, AHEAD) == "opposite"
    assert agreement(UNRESOLVED, AHEAD) == "live unresolved"
    assert agreement(AHEAD + " (one pair, no interval)", AHEAD) == "same"
    assert agreement(AHEAD, UNRESOLVED) == "simulator unresolved"


def test_passes_alternate_which_strategy_goes_first():
    assert [order_of(k)[0] for k in range(4)] == [
        "predictive",
        "reactive",
        "predictive",
        "reactive",
    ]


def test_a_scaled_fleet_keeps_the_headlines_tenants_per_engine():
    assert tenants_for(16) == 30
    assert tenants_for(4) == 8  # 7.5 rounded
    assert tenants_for(8) == 15


def test_copy_timing_counts_copies_on_joining_engines_before_they_serve():
    joins = {2: 500.0, 3: 700.0}
    landed = [(0, 50.0), (2, 450.0), (2, 520.0), (3, 690.0), (3, 800.0)]
    t = copy_timing(landed, joins)
    assert t == {
        "landed": 5,
        "first_landed_s": 50.0,
        "on_joining_engines": 4,
        "on_joining_before_serving": 2,
    }
    assert copy_timing([], joins)["first_landed_s"] is None


def _db(path):
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE replication_replicationplan (id INTEGER PRIMARY KEY, summary TEXT);
        CREATE TABLE replication_planitem (id INTEGER PRIMARY KEY, plan_id INTEGER);
        CREATE TABLE fleet_engine (id INTEGER PRIMARY KEY, engine_id TEXT);
        CREATE TABLE replication_replicationjob (
            id TEXT PRIMARY KEY, state TEXT, action TEXT, target_id INTEGER);
        CREATE TABLE replication_jobtransition (
            id INTEGER PRIMARY KEY, job_id TEXT, to_state TEXT, at TEXT);
        INSERT INTO replication_replicationplan VALUES
            (1, '{"trigger": "cycle"}'), (2, '{"trigger": "ingest"}'), (3, '{"trigger": "cycle"}');
        INSERT INTO replication_planitem VALUES (1, 1), (2, 1), (3, 2);
        INSERT INTO fleet_engine VALUES (10, 'vc-e0'), (11, 'vc-e3');
        INSERT INTO replication_replicationjob VALUES
            ('a', 'confirmed', 'replicate', 11), ('b', 'failed', 'replicate', 10),
            ('c', 'succeeded', 'evict', 10);
        INSERT INTO replication_jobtransition VALUES
            (1, 'a', 'running', '2026-01-01 00:00:05'),
            (2, 'a', 'landed', '2026-01-01 00:00:10.500000'),
            (3, 'a', 'landed', '2026-01-01 00:00:20');
        """
    )
    con.commit()
    con.close()


def test_live_evidence_reads_plans_jobs_and_landings_from_a_pass_database(tmp_path):
    from datetime import UTC, datetime

    db = tmp_path / "prewarm.sqlite3"
    _db(db)
    started = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    ev = live_evidence(db, started, time_scale=10.0, joins={3: 200.0})
    assert ev["plans_with_items"] == {"cycle": 1, "ingest": 1}  # plan 3 had no items
    assert ev["plan_items"] == 3
    assert ev["jobs"] == {"confirmed": 1, "failed": 1}  # the evict job is not a copy
    assert ev["landed"] == 1
    assert ev["first_landed_s"] == pytest.approx(105.0)  # 10.5 wall s at 10x, first landing
    assert ev["on_joining_before_serving"] == 1
    with pytest.raises(ValueError, match="no control-plane database"):
        live_evidence(tmp_path / "none.sqlite3", started, 10.0, {})
    with pytest.raises(ValueError, match="not a virtual cluster engine"):
        engine_index("gpu-0")


def test_the_headline_preset_is_the_grids_scaleout_cell():
    from controlplane.sim.grid import settings_of
    from controlplane.sim.scenarios import build
    from harness.virtual.presets import build_preset

    setup, preset = build_preset("headline", engines=4, tenants=8, seed=3)
    assert (preset.model, preset.scenario, preset.time_scale) == ("llama3-70b", "scaleout", 10.0)
    assert settings_of("servegen") == {}  # the grid's cell runs build's defaults below
    grid = build(
        workload="servegen",
        scenario="scaleout",
        model="llama3-70b",
        engines=4,
        tenants=8,
        duration=1200.0,
        load=0.55,
        seed=3,
    )
    assert np.array_equal(setup.workload.t, grid.workload.t)
    assert np.array_equal(setup.workload.pid, grid.workload.pid)
    assert setup.config.changes == grid.config.changes
