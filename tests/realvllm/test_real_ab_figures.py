"""bench/real_ab.py's figures without engines: the paired differences and their 95% intervals,
the joining engine's first two minutes, what the warm-up jobs cost, and which runs count (an arm
that did not act, a prefix miss that costs too little against a hit)."""

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

    arms = {arm: real_ab.policy_fields(arm, 0.5) for arm in ("none", "reactive", "predictive")}
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


def _costs(miss_s=1.0, hit_s=0.05):
    from _real_ab.figures import prefix_costs

    records = [_rec(1.0, "n/a", miss_s, prompt=1100)] + [
        _rec(2.0, "n/a", hit_s, prompt=1100, cached=1088)
    ]
    return prefix_costs(records, 1056)


def _run(policy, sent=0, landed=0, plans=1, strategies=None, waiting=0):
    strategy = {"none": "off", "reactive": "reactive", "predictive": "predictive"}[policy]
    return {
        "policy": policy,
        "run": 0,
        "prefix_costs": _costs(),
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
        records = [_rec(1.0, "n/a", 1.0), _rec(2.0, "n/a", 0.05, prompt=1100, cached=1088)]
        r = real_ab.run_figures(records, "n/b", None, [], prefix_floor=1056)
        r.update(
            {k: v for k, v in _run(policy).items() if k != "prefix_costs"},
            timeline=[(1.0, 0.1, "n/a")],
            client_ttft={"mean": 0.1, "p99": 0.1},
        )
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


# -- which runs count ----------------------------------------------------------------------------
def _full_run(policy, rnd, ttft, *, miss_s=1.0, hit_s=0.05, sent=None, landed=None):
    """A whole run's figures as the bench builds them: requests on both engines (one prefix miss
    and hits on the first, the joiner's from t=100), the arm's warm-ups and plans."""
    records = [_rec(0.0, "n/a", miss_s, prompt=1100)]
    records += [_rec(1.0 + i, "n/a", hit_s, prompt=1100, cached=1088) for i in range(5)]
    records += [_rec(100.0 + i, "n/b", ttft, prompt=1100, cached=1088) for i in range(4)]
    acts = policy != "none"
    sent = (2 if acts else 0) if sent is None else sent
    landed = sent if landed is None else landed
    jobs = [
        {"transport": "warmup", "state": "confirmed" if i < landed else "failed", "results": {}}
        for i in range(sent)
    ]
    fig = real_ab.run_figures(records, "n/b", 100.0, jobs, prefix_floor=1056)
    strategy = {"none": "off", "reactive": "reactive", "predictive": "predictive"}[policy]
    fig.update(
        policy=policy,
        run=3 * rnd + ("none", "reactive", "predictive").index(policy),
        round=rnd,
        plan_figures={"plans": int(acts), "strategies": [strategy] if acts else []},
        timeline=[(r["time"], r["ttft_s"], r["engine"]) for r in records],
        client_ttft={"mean": ttft, "p99": ttft},
    )
    return fig


def _rounds(n=3, predictive=None):
    runs = []
    for rnd in range(n):
        runs += [
            _full_run("none", rnd, 0.9 + 0.01 * rnd),
            _full_run("reactive", rnd, 0.5 + 0.02 * rnd),
            _full_run("predictive", rnd, 0.1 + 0.01 * rnd, **(predictive or {}).get(rnd, {})),
        ]
    return runs


def test_the_bench_prints_a_prefix_miss_and_a_hit_from_the_taps_records():
    fig = _full_run("none", 0, 0.9, miss_s=1.2, hit_s=0.04)
    costs = fig["prefix_costs"]
    # the miss: nothing cached; the hits: the tenant's prefix (>= 1056 tokens) cached; a
    # request with only part of its prefix cached is neither
    assert costs["miss"]["n"] == 1 and costs["miss"]["p50"] == pytest.approx(1.2)
    assert costs["hit"]["n"] == 9 and costs["hit"]["p50"] == pytest.approx(0.04)
    assert costs["miss_over_hit"] == pytest.approx(30.0)
    part = real_ab.run_figures([_rec(1.0, "n/a", 0.5, prompt=1100, cached=512)], "n/b", None, [])
    assert part["prefix_costs"]["miss"]["n"] == part["prefix_costs"]["hit"]["n"] == 0


def test_a_run_whose_prefix_miss_is_cheap_does_not_count(capsys):
    from _real_ab.figures import report

    runs = _rounds()
    assert real_ab.failures(runs) == [] and real_ab.verdict(runs) == 0
    # round 1's predictive run: a miss only 4x a hit (a model whose prefill is almost free)
    cheap = _rounds(predictive={1: {"miss_s": 0.2}})
    (msg,) = real_ab.failures(cheap)
    assert "run 5 (predictive)" in msg and "4.0x, under the 10x" in msg
    assert real_ab.verdict(cheap) == 1 and "do not count" in capsys.readouterr().err
    sm = report(cheap, 1.0, 1100)
    assert sm["policies"]["predictive"]["runs"] == 2
    assert [x["run"] for x in sm["left_out"]] == [5]
    # ... nor do its pairs: round 1 is out of every comparison with predictive
    assert sm["paired_vs_none"]["predictive"]["ttft.mean"]["n"] == 2
    assert sm["paired_vs_none"]["reactive"]["ttft.mean"]["n"] == 3
    # a run with no miss at all (or no hit) cannot show the ratio either
    nomiss = _full_run("none", 0, 0.9)
    nomiss["prefix_costs"] = real_ab.run_figures(
        [_rec(1.0, "n/a", 0.05, prompt=1100, cached=1088)], "n/b", None, []
    )["prefix_costs"]
    assert "0 prefix miss(es) and 1 hit(s)" in real_ab.problems(nomiss)[0]


def test_a_run_whose_arm_did_not_act_does_not_count():
    from _real_ab.figures import report

    # round 2's predictive run sent no warm-up; round 0's sent two and none landed
    runs = _rounds(predictive={2: {"sent": 0}, 0: {"landed": 0}})
    assert len(real_ab.failures(runs)) == 2
    sm = report(runs, 1.0, 1100)
    assert sm["policies"]["predictive"]["runs"] == 1
    assert {x["run"]: x["problems"][0] for x in sm["left_out"]} == {
        2: "predictive sent 2 warm-up(s) and none landed (by state: {'failed': 2})",
        8: "predictive sent no warm-up",
    }
    pair = sm["paired_vs_none"]["predictive"]["joiner_first_2min.mean"]
    assert pair["n"] == 1 and pair["diffs"] == [pytest.approx(0.11 - 0.91)]
    assert sm["policies"]["predictive"]["warmups"] == 2.0  # the counted run's only


def test_runs_alternate_their_order_round_by_round():
    assert real_ab.run_order(["none", "reactive", "predictive"], 3) == [
        (0, "none"),
        (0, "reactive"),
        (0, "predictive"),
        (1, "predictive"),
        (1, "reactive"),
        (1, "none"),
        (2, "none"),
        (2, "reactive"),
        (2, "predictive"),
    ]
    assert real_ab.run_order(["predictive", "none"], 2) == [
        (0, "none"),
        (0, "predictive"),
        (1, "predictive"),
        (1, "none"),
    ]


def test_paired_intervals_give_their_degrees_of_freedom_and_the_pairs_an_unresolved_one_needs():
    from _real_ab.output import print_table

    from controlplane.core import stats

    d = real_ab.paired([1.0, 1.0, 1.0, 1.0, 1.0], [1.1, 0.8, 1.3, 1.05, 0.95])
    assert d["n"] == 5 and d["df"] == 4 and not d["resolved"]
    # t(4) = 2.776, not the normal 1.96
    sd = stats.statistics.stdev(d["diffs"])
    assert d["high"] - d["mean"] == pytest.approx(2.776 * sd / 5**0.5, rel=1e-3)
    need = d["pairs_needed"]
    assert need == stats.required_n(d["mean"], sd, 0.0) and need > 5
    assert stats.power(d["mean"], sd, 0.0, need) >= 0.8 > stats.power(d["mean"], sd, 0.0, need - 1)
    resolved = real_ab.paired([1.0, 1.0, 1.0], [0.5, 0.45, 0.55])
    assert resolved["resolved"] and "pairs_needed" not in resolved
    from _real_ab.figures import report

    text = print_table(report(_rounds(), 1.0, 1100))
    assert "joiner_first_2min.mean: -800.0 [" in text and "(t, df 2, n = 3)" in text


def test_the_scoreboard_holdout_is_recorded_beside_the_benchs_paired_result():
    from _real_ab.figures import report
    from _real_ab.output import markdown

    runs = _rounds()
    pays = {"diff": -0.3, "low": -0.5, "high": -0.1, "se": 0.1, "df": 6.2}
    unsure = {"diff": -0.1, "low": -0.4, "high": 0.2, "se": 0.15, "df": 5.0}
    for r in runs:
        if r["policy"] == "predictive":
            ho = pays if r["round"] != 1 else unsure
            verdict = "speculation_pays" if ho is pays else "insufficient_data"
            r["scoreboard"] = {
                "verdict": verdict,
                "firm": ho is pays,
                "basis": "holdout",
                "holdout_assignments": 4,
                "ttft_diff_s": ho,
            }
    sm = report(runs, 1.0, 1100)
    hb = sm["holdout_beside_bench"]
    assert hb["bench_direction"] == "faster"  # predictive - none: about -0.8 s every round
    assert [(x["round"], x["verdict"], x["agrees"]) for x in hb["runs"]] == [
        (0, "speculation_pays", True),
        (1, "insufficient_data", False),
        (2, "speculation_pays", True),
    ]
    assert hb["runs"][0]["bench_round_ttft_mean_diff_s"] == pytest.approx(
        runs[2]["ttft"]["mean"] - runs[0]["ttft"]["mean"]
    )
    assert "verdict insufficient_data" in markdown({"summary": sm, "runs": runs})
    assert "DISAGREES" in markdown({"summary": sm, "runs": runs})


def test_a_run_where_most_requests_failed_does_not_count():
    # a busy machine: the router refused or dropped 136 of 139 requests
    run = _full_run("none", 0, 0.9)
    run.update(sent=3, failed=136)
    assert real_ab.problems(run) == ["136 of 139 requests failed: the engines did not keep up"]
    run.update(sent=170, failed=9)  # the router's restart as the joiner is added: a few
    assert real_ab.problems(run) == []
