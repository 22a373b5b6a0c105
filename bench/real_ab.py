"""Speculation measured on real engines: an A/B bench on vLLM's CPU build (`make bench-real`).

Two real vLLM engines (the ``--preset``'s model, built under ``var/realvllm/``: by default
``real-heavy``, the prefill-heavy model whose prefix miss costs many times a hit; each engine's
compute threads pinned to its own core with ``VLLM_CPU_OMP_THREADS_BIND``) behind vllm-router
(``kv_aware``: it routes on the engines' own KV events, ``RouterFront`` in
``harness/realvllm/router.py``) in front of the agents' request taps; the real
control plane (daphne, the embedded Celery worker and beat); one real ``prewarm-agent`` per
engine with its request tap and its ``warmup`` executor (prefill-only requests into the target
engine, confirmed by that engine's own KV events). The request driver is a load generator only
(streamed completions to the router); the taps post the request records, read as the control
plane took them through a pass-through in front of it (``record_tee.py``; the agents take
their jobs by long-poll through it), and every per-engine figure comes from those records.

Every run replays the same slice of the shared ServeGen trace (the busiest tenants of the
steepest demand ramp, 10 trace seconds per wall second, as token-id prompts that start with the
tenant's shared prefix of 1,056-1,600 tokens, ``real-heavy``'s 1,600-1,952 with at most 8 tokens of each
request's own). ``vllm-a`` serves from the start; ``vllm-b`` joins
as in a scale-out and serves from ``--serve-s``. The policies:

  none        cache-aware routing only: the policy's strategy is ``off``, nothing is copied
  reactive    strategy ``reactive``: a prefix is copied once the demand measured at ingest
              outruns its holders (no forecast)
  predictive  strategy ``predictive``: the planner warms the joining engine with the
              forecast-hot tenant prefixes before it serves, re-plans a burst's onset at ingest
              and keeps the reactive fallback

Every run first imports ``--history-days`` (2) of the slice's tenants' earlier demand as request
history through the product's ``POST /api/history-imports/``, as the demo's cluster does
(``harness/realvllm/history.py``): the forecasters start from days of each tenant's demand, in
every arm alike.

In every arm the joining engine is announced ``warming`` at ``--announce-s`` and serves from
``--serve-s``, as an operator's scale-out would (it is added to the router then): the arms
differ only in the policy's strategy (all hold out ``--holdout-fraction`` of their prefixes, so
that each run's scoreboard has a holdout to read).

A run counts only when its arm did what it names and a miss cost what the comparison needs
(``problems``); the summary and the paired differences are over counted runs only, the runs left
out are listed with why, and the bench exits 1 when any run was left out:

- ``arm_problems``: ``none`` sent a warm-up or planned; an arm's plans name another strategy or
  there are none; ``predictive`` sent no warm-up; warm-ups sent and none landed (``reactive``
  copying nothing is not a failure: the table says "reactive found no hot spot");
- ``cost_problems``: from the taps' records, the median TTFT of the requests served with nothing
  cached (a prefix miss) is under ``MIN_MISS_OVER_HIT`` (10) times that of those served with
  their prefix cached (a hit), or the run had no miss or no hit. Each run prints both;
- ``served_problems``: more than a tenth of the requests sent failed (a machine too busy for
  the engines to keep up).

Runs go in rounds, one run of each policy a round, the order alternating (none, reactive,
predictive; then predictive, reactive, none; ...), ``--runs`` rounds. Every run starts from reset
engines (``POST /reset_prefix_cache``, vLLM's dev-mode route; checked: a
probe prompt sent before the reset is a miss after it) and a fresh control plane (a new SQLite
database copied from a migrated template, new credentials, new agents with empty state).

Reported per policy, from the taps' records: TTFT mean / p50 / p99 over all requests and over
the requests the joining engine served in its first two minutes of serving; the prefix miss's
and hit's median TTFT; hit rate (requests with any cached token) and cached-token share;
warm-ups sent (jobs) and landed (shown by the target engine's KV events), their prompt tokens,
how many were already cached and their prefill time at this engine's measured cold cost; the
client's TTFT through the router; per run, and the paired differences round by round
(reactive - none, predictive - none, predictive - reactive) with 95% Student-t intervals and
their degrees of freedom, and, where an interval does not exclude zero, how many pairs would
(``core.stats.pairs_needed``). At the end of each run the scoreboard (``GET /api/scoreboard/``)
is read: each predictive run's holdout verdict and interval are printed beside the bench's own
paired result, with whether their directions agree. Writes ``--json`` and ``--html`` (a plotly
chart of TTFT over time per policy).

    python bench/real_ab.py [--runs 5] [--preset real-heavy] [--json PATH] [--html PATH]
    python bench/real_ab.py --quick      # one short round (warming 20-90 s, 130 s a run)

``--quick`` cannot finish in a minute: two engines take a minute or more to start and each run
needs the joining engine's announce, warm-up and serving phases in real time (so ``make bench``
leaves this bench out; ``make bench-real`` runs it). Needs ``.venv-vllm`` (``make vllm-env``),
``vllm-router``, about 6 GB of memory and the shared data (``PREWARM_SHARED_DATA`` or
``../shared/data``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import REPO, parser, write_json
from _real_ab.engines import cold_and_cached_s, reset_and_check
from _real_ab.figures import (  # noqa: F401 - paired, problems: re-exported for their tests
    JOINER_WINDOW_S,
    POLICIES,
    count_by,
    failures,
    paired,
    plan_figures,
    problems,
    run_figures,
    summarise,
    timelines,
)
from _real_ab.output import build_doc, markdown, print_table, write_html

from harness import launch
from harness.lifecycle import Lifecycles, Operator
from harness.realvllm.demo import REAL_POLICY
from harness.realvllm.driver import Gateway, Target, TraceRequest
from harness.realvllm.engine import EngineUnavailable, VllmEngine, ensure_model
from harness.realvllm.engine import vllm_python as find_vllm
from harness.realvllm.engine_agents import start_agents
from harness.realvllm.presets import REAL_PRESETS, TENANTS, RealPreset, add_preset_argument
from harness.realvllm.record_tee import RecordTee
from harness.realvllm.router import RouterFront, router_available
from harness.virtual.history import post_history
from wire.protocol import ENGINE_SERVING, JOB_LANDED, JOB_LIVE

WORK = REPO / "var" / "bench" / "real_ab"
UNSETTLED = (*JOB_LIVE, JOB_LANDED)  # jobs whose outcome is still to come
TIME_SCALE = 10.0  # trace seconds per wall second (the driver's ServeGen replay)


# -- one run ---------------------------------------------------------------------------------
def prepare_template(env: dict[str, str]) -> Path:
    """A migrated database, copied for each run (migrating afresh takes longer than a run's
    set-up should)."""
    tpl = WORK / "template"
    shutil.rmtree(tpl, ignore_errors=True)
    tpl.mkdir(parents=True)
    _manage(
        {**env, "PREWARM_DATA_DIR": str(tpl)},
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0)",
    )
    return tpl


def _manage(env: dict[str, str], code: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"control-plane set-up failed: {out.stderr.strip()[-800:]}")


def policy_fields(policy: str, holdout_fraction: float) -> dict[str, Any]:
    """The arm's live policy: the real demo's, with its strategy and the holdout fraction every
    arm shares (``none`` copies nothing either way)."""
    strategy = {"none": "off", "reactive": "reactive", "predictive": "predictive"}[policy]
    return {**REAL_POLICY, "holdout_fraction": holdout_fraction, "strategy": strategy}


def run_order(policies: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, policy) in the order the runs go: one run of each policy a round, the order
    reversed every other round (A B C, C B A, A B C, ...), so that no arm always runs first
    after the engines start or last when the machine has been busiest."""
    ordered = [p for p in POLICIES if p in policies]
    return [(r, p) for r in range(rounds) for p in (ordered if r % 2 == 0 else ordered[::-1])]


def one_run(
    policy: str,
    index: int,
    round_: int,
    preset: RealPreset,
    engines: list[VllmEngine],
    template: Path,
    requests: list[TraceRequest],
    args,
    env0: dict[str, str],
    probe: list[int],
) -> dict[str, Any]:
    run_dir = WORK / f"run-{index:02d}-{policy}"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(template, run_dir)
    env = {**env0, "PREWARM_DATA_DIR": str(run_dir)}
    creds_path = run_dir / "credentials.json"
    _manage(
        env,
        "import json, sys; import django; django.setup(); "
        "from pathlib import Path; from harness import launch; "
        "from harness.realvllm.demo import set_policy; "
        f"launch.setup_control_plane(2, 'bench-only', Path({str(creds_path)!r})); "
        "set_policy(json.loads("
        f"{json.dumps(json.dumps(policy_fields(policy, args.holdout_fraction)))}))",
    )
    creds = json.loads(creds_path.read_text())
    reset_and_check(engines, probe)
    cp = f"http://127.0.0.1:{args.port}"
    children = launch.Children()
    operator = Operator(cp, creds["operator_token"])
    joiner = engines[1]
    # vllm-router in front of the agents' taps, the joiner added when it serves; the agents
    # reach the control plane through the tee, which keeps the records their taps post.
    front = RouterFront(run_dir, engines, serving=[engines[0].name])
    tee = RecordTee(cp)
    try:
        launch.wait_for_port("127.0.0.1", args.port)
        children.web("127.0.0.1", args.port, env, run_dir)
        tee.start()
        agents = start_agents(
            children,
            engines,
            run_dir,
            cp,
            creds,
            env,
            front.taps,
            report_to=tee.url,
            jobs_transport="long-poll",
            timeout_s=120,
        )
        if not agents:
            raise RuntimeError(f"the agents did not report both engines (logs in {run_dir})")
        front.router.start().wait_ready(120)
        # The trace's earlier days as request history, as the demo's cluster imports them: the
        # forecasters start from days of each tenant's demand, not from nothing.
        history = import_history(preset, args, cp, creds["operator_token"])
        # A load generator only: the router picks the engine, the taps post the records.
        gw = Gateway(
            cp,
            "",
            [Target("router", front.router.url, model=preset.model.served_name)],
            keep_records=True,
            post_records=False,
        )
        serving_at: dict[str, float] = {}

        def changed(engine_id: str, lifecycle: str) -> None:
            if lifecycle == ENGINE_SERVING and engine_id not in serving_at:
                serving_at[engine_id] = time.time()
                if engine_id == joiner.name:
                    front.join(joiner.name)  # a second or two of refused requests

        lc = Lifecycles(operator, "real A/B bench", on_change=changed)
        if not lc.find({joiner.name}):
            raise RuntimeError(f"{joiner.name} is not known to the control plane")
        lc.hold([joiner.name])
        announce = args.announce_s  # the same scale-out in every arm
        stop = threading.Event()
        sched = threading.Thread(
            target=lc.run, args=({joiner.name: (announce, args.serve_s)}, stop), daemon=True
        )
        started = time.time()
        sched.start()
        timer = threading.Timer(args.serve_s + args.serving_s, stop.set)
        timer.start()
        gw.replay(requests, speed=1.0, stop=stop, workers=4)
        stop.set()
        timer.cancel()
        gw.close()
        served = gw.stats.sent
        records = _tap_records(tee, served)
        jobs = _settled_jobs(operator, cp)
        plans = _listed(operator, f"{cp}/api/plans/?limit=200")
        block = preset.model.block_size
        fig = run_figures(
            records,
            f"cpu-{joiner.name}/{joiner.name}",
            serving_at.get(joiner.name),
            jobs,
            prefix_floor=preset.prefix_tokens[0] // block * block,
        )
        client = [r["ttft_s"] for r in gw.records or []]
        fig.update(
            policy=policy,
            run=index,
            round=round_,
            preset=preset.name,
            history=history,
            scoreboard=read_scoreboard(operator, cp),
            started_at=started,
            load_avg=os.getloadavg(),
            sent=served,
            failed=gw.stats.failed,
            tap_records=len(records),
            client_ttft=summarise(client),
            plan_figures=plan_figures(plans),
            when=timelines(plans, jobs, started),
            router_decisions=count_by(d.worker for d in front.router.decisions()),
            timeline=[(round(r["time"] - started, 3), r["ttft_s"], r["engine"]) for r in records],
            serving_at_s=(serving_at[joiner.name] - started) if joiner.name in serving_at else None,
        )
        fig["problems"] = problems(fig)
        return fig
    finally:
        operator.close()
        front.router.stop()
        children.stop()
        tee.stop()


def import_history(preset: RealPreset, args, cp: str, token: str) -> dict[str, Any] | None:
    """``--history-days`` of the replayed slice's tenants before it, ending now, through the
    product's ``POST /api/history-imports/`` (``harness/realvllm/history.py``); the import's
    summary (None with 0 days)."""
    if args.history_days <= 0:
        return None
    if not hasattr(args, "history_rows"):  # drawn once (seconds of CPU), then moved in time
        args.history_rows = preset.history(
            args.history_days,
            0.0,
            tenants=args.tenants,
            duration_s=(args.serve_s + args.serving_s) * TIME_SCALE,
            rate=args.rate,
        )
    now = time.time()
    rows = [{**r, "time": round(r["time"] + now, 3)} for r in args.history_rows]
    summary = post_history(cp, token, rows, "real-ab")
    print(
        f"imported {args.history_days:g} days of history: {summary['requests']} requests in "
        f"{summary['rows']} rows, {summary['workload_keys']} keys, {summary['post_seconds']} s",
        flush=True,
    )
    return {
        k: summary.get(k)
        for k in ("requests", "rows", "workload_keys", "buckets_created", "post_seconds")
    }


def read_scoreboard(operator: Operator, cp: str) -> dict[str, Any]:
    """The scoreboard's verdict and holdout at the end of a run (its database is the run's
    own): verdict, whether firm, its basis, the holdout's per-request TTFT difference treated
    minus held out with its t interval, and the verdict's text."""
    resp = operator.client.get(f"{cp}/api/scoreboard/")
    resp.raise_for_status()
    doc = resp.json()
    rec, ho = doc["recommendation"], doc["holdout"]
    return {
        "verdict": rec["verdict"],
        "firm": rec["firm"],
        "basis": rec.get("basis"),
        "holdout_assignments": rec.get("holdout_assignments"),
        "ttft_diff_s": ho.get("ttft_diff_s"),
        "more_assignments_needed": ho.get("more_assignments_needed"),
        "text": rec.get("text"),
    }


def _tap_records(tee: RecordTee, served: int, timeout_s: float = 30.0) -> list[dict]:
    """The taps' records of the run, once they number what the router served (the agents post
    every second; a deadline, then what came)."""
    deadline = time.monotonic() + timeout_s
    while len(tee.records()) < served and time.monotonic() < deadline:
        time.sleep(0.2)
    return sorted(tee.records(), key=lambda r: r["time"])


def _settled_jobs(operator: Operator, cp: str, timeout_s: float = 30.0) -> list[dict]:
    """The run's jobs once none is still moving or waiting for the target engine's events to
    show it (a deadline, then as they are): a warm-up sent near the end is counted as it ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = _listed(operator, f"{cp}/api/replication-jobs/?limit=500")
        if time.monotonic() > deadline or not any(j["state"] in UNSETTLED for j in jobs):
            return jobs
        time.sleep(1.0)


def _listed(operator: Operator, first: str) -> list[dict]:
    """Every row of a paginated list endpoint."""
    out: list[dict] = []
    url: str | None = first
    while url:
        resp = operator.client.get(url)
        resp.raise_for_status()
        page = resp.json()
        out += page["results"]
        url = page.get("next")
    return out


# -- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="rounds: runs per policy (default 5)")
    p.add_argument("--policies", default=",".join(POLICIES))
    add_preset_argument(
        p, "real-heavy", "the engines' model and prompts (harness/realvllm/presets.py)"
    )
    p.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.5,
        help="the share of prefixes every arm's policy holds out (the scoreboard's holdout)",
    )
    p.add_argument(
        "--history-days",
        type=float,
        default=2.0,
        help="days of the trace before the slice imported as request history at the start of "
        "every run, as the demo does (0: none)",
    )
    p.add_argument("--announce-s", type=float, default=30.0, help="the joiner is warming from")
    p.add_argument("--serve-s", type=float, default=90.0, help="the joining engine serves from")
    p.add_argument("--tenants", type=int, default=TENANTS, help="ServeGen tenants (the busiest)")
    p.add_argument(
        "--serving-s", type=float, default=JOINER_WINDOW_S, help="run on after it serves"
    )
    p.add_argument(
        "--rate", type=float, default=None, help="mean requests per wall second (the preset's)"
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8104")))
    p.add_argument("--html", type=Path, help="write the TTFT-over-time chart here")
    p.add_argument(
        "--html-cdn", action="store_true", help="a small chart that loads plotly.js from its CDN"
    )
    p.add_argument(
        "--resume",
        type=Path,
        help="keep the runs of a JSON this bench wrote (those where the joining engine served) "
        "and run only the rest",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        help="no runs: the markdown table (and --html) from a JSON this bench wrote",
    )
    args = p.parse_args(argv)
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        print(markdown(doc))
        if args.html:
            n = max((s["runs"] for s in doc["summary"]["policies"].values()), default=0)
            write_html(
                args.html,
                doc["runs"],
                chart_title(doc.get("preset", "real"), n),
                cdn=args.html_cdn,
            )
        return 0
    if args.quick:
        # The warming window is the full runs' 60 s and more: the taps send a prefix's token
        # ids once a minute, and a warm-up waits for them (a shorter window warms nothing).
        args.runs, args.announce_s, args.serve_s, args.serving_s = 1, 20.0, 90.0, 40.0
    policies = [x for x in args.policies.split(",") if x]
    if not policies or any(x not in POLICIES for x in policies) or "none" not in policies:
        p.error(f"--policies: a subset of {','.join(POLICIES)} that includes none")
    if not 0 <= args.announce_s <= args.serve_s or args.runs < 1:
        p.error("need 0 <= --announce-s <= --serve-s and --runs >= 1")
    if not 0.0 <= args.holdout_fraction < 1.0:
        p.error("--holdout-fraction: from 0 to under 1")
    preset = REAL_PRESETS[args.preset]
    if args.rate is None:
        args.rate = preset.rate
    try:
        python = find_vllm()
        ensure_model(preset.model, python=python)
        router_available()
    except EngineUnavailable as exc:
        print(f"real_ab: {exc}", file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # the run's clean-up stops its agents, web and engines

    signal.signal(signal.SIGTERM, interrupted)
    requests = preset.requests(
        tenants=args.tenants,
        duration_s=(args.serve_s + args.serving_s) * TIME_SCALE,
        rate=args.rate,
    )
    env0 = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PYTHONUNBUFFERED": "1",
        **launch.SETTINGS,
    }
    # The publishers bind: vllm-router and the agents both connect to them.
    engines = preset.engines(WORK)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    runs: list[dict] = []
    try:
        template = prepare_template(env0)
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready()
        print(f"engines ready in {time.monotonic() - t0:.0f} s", flush=True)
        longest = max(requests, key=lambda r: len(r.token_ids))
        cold_s, cached_s = cold_and_cached_s(engines[0], longest.token_ids)
        probe_figures = {
            "prompt_tokens": len(longest.token_ids),
            "cold_ttft_s": cold_s,
            "cached_ttft_s": cached_s,
            "ratio": cold_s / cached_s,
        }
        print(
            f"a {len(longest.token_ids)}-token prompt: cold {1000 * cold_s:.1f} ms, "
            f"cached {1000 * cached_s:.1f} ms ({cold_s / cached_s:.2f}x)",
            flush=True,
        )
        # The reset check's probe: three blocks of a prompt (a miss of the whole prompt on the
        # heavy model is tens of seconds on a busy machine; three blocks show the reset as well).
        probe = requests[0].token_ids[: 3 * preset.model.block_size]
        order = run_order(policies, args.runs)
        kept: list[dict] = []
        if args.resume:
            kept = [
                r
                for r in json.loads(args.resume.read_text())["runs"]
                if r["policy"] in policies
                and r["joiner_first_2min"]["n"] > 0
                and r.get("preset") == preset.name  # measured on this preset, with its checks
            ]
        for n, (rnd, pol) in enumerate(order):
            old = next((r for r in kept if r["policy"] == pol and r["round"] == rnd), None)
            if old is not None:
                kept.remove(old)
                runs.append(old)
                print(f"run {n + 1}/{len(order)} {pol}: kept from {args.resume}", flush=True)
                continue
            fig = one_run(pol, n, rnd, preset, engines, template, requests, args, env0, probe)
            runs.append(fig)
            # Written after every run: a bench cut short keeps what it measured.
            write_json(args.json, build_doc(runs, args, requests, probe_figures, load_before, t0))
            costs = fig["prefix_costs"]
            print(
                f"run {n + 1}/{len(order)} {pol}: {fig['requests']} requests, TTFT mean "
                f"{1000 * fig['ttft']['mean']:.1f} ms p99 {1000 * fig['ttft']['p99']:.1f} ms, "
                f"joiner first 2 min {1000 * fig['joiner_first_2min']['mean']:.1f} ms "
                f"({fig['joiner_first_2min']['n']} requests), cached share "
                f"{fig['cached_token_share']:.3f}, warm-ups {fig['warmups']} "
                f"{fig['warmups_by_state']} ({fig['warmups_landed']} landed), tap records "
                f"{fig['tap_records']} of {fig['sent']} served ({fig['failed']} failed), "
                f"plans {fig['plan_figures']}, load {fig['load_avg'][0]:.1f}; from the taps' "
                f"records a prefix miss {_ms(costs['miss'])} and a hit {_ms(costs['hit'])}: "
                f"{_x(costs['miss_over_hit'])}; scoreboard {fig['scoreboard']['verdict']} "
                f"({fig['scoreboard']['basis']})",
                flush=True,
            )
            for problem in fig["problems"]:
                print(f"run {n + 1}/{len(order)} {pol}: FAILED CHECK: {problem}", flush=True)
    finally:
        for e in engines:
            e.stop()
    doc = build_doc(runs, args, requests, probe_figures, load_before, t0)
    print(print_table(doc["summary"]))
    print(markdown(doc))
    write_json(args.json, doc)
    if args.html:
        write_html(args.html, runs, chart_title(preset.name, args.runs), cdn=args.html_cdn)
    uptime = doc["uptime_after"]
    print(f"uptime after: {uptime}")
    return verdict(runs)


def chart_title(preset: str, runs: int) -> str:
    model = REAL_PRESETS[preset].model.recipe if preset in REAL_PRESETS else preset
    return f"Real vLLM A/B (CPU, {model} model): TTFT per request, {runs} run(s) per policy"


def _ms(s: dict) -> str:
    return f"{1000 * s['p50']:.1f} ms (median of {s['n']})" if s["n"] else "(none)"


def _x(ratio: float | None) -> str:
    return f"{ratio:.1f}x" if ratio is not None else "no ratio"


def verdict(runs: list[dict]) -> int:
    """The bench's exit status: 1, saying why, when any run does not count (its arm did not do
    what it names, a prefix miss cost too little against a hit, or most requests failed)."""
    if problems := failures(runs):
        print(
            "real_ab: these runs do not count (the summary leaves them out):\n  "
            + "\n  ".join(problems),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
