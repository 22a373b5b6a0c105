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


def _run(policy, sent=0, landed=0, plans=1, strategies=None, waiting=0):
    strategy = {"none": "off", "reactive": "reactive", "predictive": "predictive"}[policy]
    return {
        "policy": policy,
        "run": 0,
        "warmups": sent,
        "warmups_landed": landed,
        "warmups_by_state": {"confirmed": landed} if landed else {},
        "plan_figures": {
            "plans": plans,
            "strategies": [strategy] if strategies is None else strategies,
            "max_waiting_for_token_ids": waiting,
        },
    }


def test_an_arm_that_does_not_do_what_it_names_fails_the_bench():
    ok = [
        _run("none", plans=0, strategies=[]),
        _run("reactive"),  # evaluated, copied nothing: not a failure
        _run("predictive", sent=3, landed=2),
    ]
    assert real_ab.failures(ok) == []
    # predictive that sent nothing: the arm measured cache-aware routing, not speculation.
    (msg,) = real_ab.failures([_run("predictive", waiting=4)])
    assert "predictive sent no warm-up" in msg and "4 item(s) waited" in msg
    # warm-ups sent, none shown by the target engine's events
    (msg,) = real_ab.failures([_run("predictive", sent=3, landed=0)])
    assert "none landed" in msg
    assert "none landed" in real_ab.failures([_run("reactive", sent=1)])[0]
    # none that copied or planned anything
    assert "none sent 2 warm-up(s)" in real_ab.failures([_run("none", sent=2, plans=0)])[0]
    assert "none stored 1 plan(s)" in real_ab.failures([_run("none", strategies=[])])[0]
    # an arm never evaluated, or evaluated under another strategy
    assert "never evaluated" in real_ab.failures([_run("reactive", plans=0, strategies=[])])[0]
    assert "strategies" in real_ab.failures([_run("reactive", strategies=["predictive"])])[0]


def test_the_bench_exits_1_saying_which_arm_failed(capsys):
    ok = [_run("none", plans=0, strategies=[]), _run("predictive", sent=2, landed=1)]
    assert real_ab.verdict(ok) == 0
    assert real_ab.verdict([*ok, _run("predictive")]) == 1
    assert "run 0 (predictive): predictive sent no warm-up" in capsys.readouterr().err


def test_reactive_that_copied_nothing_says_so_in_the_table():
    from _real_ab.figures import arm_notes, report
    from _real_ab.output import markdown

    assert arm_notes(_run("reactive")) == [
        "reactive found no hot spot (it evaluated and copied nothing)"
    ]
    assert arm_notes(_run("reactive", sent=1, landed=1)) == []
    # ... and when what it planned waited for token ids that never came, it says that instead
    (note,) = arm_notes(_run("reactive", waiting=5))
    assert "planned up to 5 warm-up(s) that waited for their prefixes' token ids" in note
    runs = []
    for policy in ("none", "reactive"):
        r = real_ab.run_figures([_rec(1.0, "n/a", 0.1)], "n/b", None, [])
        r.update(_run(policy), timeline=[(1.0, 0.1, "n/a")], client_ttft={"mean": 0.1, "p99": 0.1})
        runs.append(r)
    doc = {"summary": report(runs, 0.1, 100), "runs": runs}
    assert "- reactive: reactive found no hot spot" in markdown(doc)


def test_plan_figures_name_the_strategies_and_the_items_waiting_for_token_ids():
    from _real_ab.figures import plan_figures

    plans = [
        {
            "summary": {
                "strategy": "predictive",
                "trigger": "cycle",
                "items": 0,
                "waiting_for_token_ids": 3,
            }
        },
        {"summary": {"strategy": "predictive", "trigger": "onset", "items": 2}},
    ]
    assert plan_figures(plans) == {
        "plans": 2,
        "strategies": ["predictive"],
        "by_trigger": {"cycle": 1, "onset": 1},
        "items": 2,
        "max_waiting_for_token_ids": 3,
    }
