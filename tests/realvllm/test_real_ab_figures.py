"""bench/real_ab.py's figures without engines: the paired differences and their 95% intervals,
the joining engine's first two minutes, and what the warm-up jobs cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(REPO / "bench"))
import real_ab  # noqa: E402


def test_paired_differences_pair_runs_in_order_with_a_student_t_interval():
    d = real_ab.paired([1.0, 2.0, 3.0], [1.5, 2.0, 4.0])
    assert d["diffs"] == [0.5, 0.0, 1.0] and d["mean"] == pytest.approx(0.5)
    # stdev 0.5, n 3, t(2) = 4.303: 4.303 * 0.5 / sqrt(3)
    assert d["ci95"] == pytest.approx(4.303 * 0.5 / 3**0.5, rel=1e-3)
    assert real_ab.paired([1.0], [2.0])["ci95"] is None  # one pair: no interval


def _rec(t, engine, ttft, prompt=100, cached=0):
    return {
        "time": t,
        "engine": engine,
        "ttft_s": ttft,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
    }


def test_run_figures_count_the_joiners_first_two_minutes_and_the_warmups_cost():
    records = [
        _rec(10.0, "n/a", 0.05, cached=96),
        _rec(99.0, "n/b", 0.9),  # before it serves: not in its window
        _rec(100.0, "n/b", 0.2),
        _rec(219.9, "n/b", 0.1, cached=64),
        _rec(220.0, "n/b", 0.3),  # two minutes after: out
    ]
    jobs = [
        {
            "transport": "warmup",
            "state": "confirmed",
            "results": {"target": {"prompt_tokens": 1600, "cached_tokens": 0}},
        },
        {"transport": "warmup", "state": "failed", "results": {}},
        {"transport": "tcp", "state": "confirmed", "results": {}},
    ]
    fig = real_ab.run_figures(records, "n/b", 100.0, jobs)
    assert fig["joiner_first_2min"]["n"] == 2
    assert fig["joiner_first_2min"]["mean"] == pytest.approx(0.15)
    assert fig["ttft"]["n"] == 5 and fig["joiner_requests"] == 4
    assert fig["hit_rate"] == pytest.approx(2 / 5)
    assert fig["cached_token_share"] == pytest.approx(160 / 500)
    assert fig["warmups"] == 2 and fig["warmups_by_state"] == {"confirmed": 1, "failed": 1}
    assert fig["warmup_prompt_tokens"] == 1600 and fig["warmup_tokens_computed"] == 1600
    # The joining engine never served: no window, no figure.
    assert real_ab.run_figures(records, "n/b", None, [])["joiner_first_2min"]["n"] == 0


def test_the_arms_are_live_policies_that_differ_only_in_their_strategy(db):
    from controlplane.replication.api.serializers import PolicySerializer

    arms = {arm: real_ab.policy_fields(arm) for arm in ("none", "reactive", "predictive")}
    assert {arm: f["strategy"] for arm, f in arms.items()} == {
        "none": "off",
        "reactive": "reactive",
        "predictive": "predictive",
    }
    for arm, fields in arms.items():
        ser = PolicySerializer(data={**fields, "name": arm})
        assert ser.is_valid(), ser.errors  # what ensure_policy will accept
        rest = {k: v for k, v in fields.items() if k != "strategy"}
        assert rest == {k: v for k, v in arms["none"].items() if k != "strategy"}
