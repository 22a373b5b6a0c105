"""Benchmark: 1,000 workload keys forecast and backtested, and per-forecaster MASE on held-back
days of the ServeGen m-large tenants.

Keys: the 162 real tenants x 7 forecast origins, origin j at day 11 + j x 10 h (j = 0..6),
cut at 1,000 keys (key i = tenant i mod 162, origin i div 162). Each key's history is every
10-minute window before its origin (days 1-11 and, for later origins, the held-back windows
before it); its test is the next 12 h (72 windows), all inside days 12-14.

Timed: `forecast_many` with every forecaster (backtest, choice, final fit) over a process pool,
against last-value-only forecasting in the same run. Then, untimed, each forecaster is fitted at
every origin and scored at leads 10 min, 60 min, 6 h, 12 h (MASE, scaled on the key's history).

The forecast tick (``--keys N``, default 10,000; 1,000 with ``--quick``): N keys built the same
way but with origins every 30 min from day 11 (62 origins x 162 tenants), each key's last
``TICK_DAYS`` of history as the tick's right-aligned window. Timed on one process: the array path
(``core.forecast.arrays``: baselines, 3-fold backtest, choice, intervals, burst risk for every
key), against, in the same run, plain numpy over the same arrays (one pass of lag-1 differences
and sums) and the per-key path on a sample of keys (baselines only), extrapolated to N. Prophet
refits (backtest fold + final fit, as ``fit_slow_model`` does) are timed on a sample, giving the
refits an hour two worker processes afford. Burst detection: per forecaster, whether the
forecast says a bucket of the next 12 h exceeds 2x the tenant's usual rate (``bench/burst_risk.py``'s
definition), precision and recall against what happened, from the per-key path on the whole
history ("before") and from the array path on the tick window ("after").

    python bench/forecast.py [--quick] [--json PATH] [--workers N] [--keys N]
    python bench/forecast.py --celery [--quick] [--json PATH]   # the Celery cycle, 1 vs 2 workers
    python bench/forecast.py --tick [--keys N] [--json PATH]    # the tick on PostgreSQL

``--celery`` runs the same keys through the product's forecast -> plan cycle on real Celery
worker processes (PostgreSQL + Redis, ``bench/_forecast_celery.py``), with 1 and with 2 of them.
``--tick`` runs ``forecasting.services.forecast_tick`` on N keys in PostgreSQL, cold and then
incremental (``bench/_forecast_tick.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.core.demand import BURST_FACTOR  # noqa: E402
from controlplane.core.forecast.arrays import (  # noqa: E402
    ARRAY_MODELS,
    burst_risk_arrays,
    forecast_arrays,
    right_aligned,
)
from controlplane.core.forecast.select import FORECASTERS, forecast_counts, forecast_many  # noqa: E402
from controlplane.core.forecast.series import mase_scale  # noqa: E402
from controlplane.core.traces.servegen import load_servegen_windows  # noqa: E402
from harness.processes import DatabaseUnavailable  # noqa: E402

BUCKET_S = 600
HORIZON = 72  # 12 h
FIRST_ORIGIN = 11 * 144  # end of day 11
ORIGIN_STEP = 60  # 10 h
LEADS = {"10min": 1, "60min": 6, "6h": 36, "12h": 72}
TICK_DAYS = 3
TICK_ORIGIN_STEP = 3  # 30 min: 62 origins x 162 tenants >= 10,000 keys
TICK_TARGET_S = 5.0


def usual_count(y: np.ndarray) -> float:
    """A tenant's usual requests per window (``bench/burst_risk.py``: median, or mean if idle)."""
    med = float(np.median(y))
    return med if med > 0 else float(y.mean())


def tick_keys(n_keys: int, path: str | None) -> list:
    tenants = load_servegen_windows(path)
    series = [t.expected_counts() for t in tenants.values()]
    keys = []
    for i in range(n_keys):
        tenant, j = i % len(series), i // len(series)
        origin = FIRST_ORIGIN + j * TICK_ORIGIN_STEP
        y = series[tenant]
        if origin + HORIZON > len(y):
            raise SystemExit(f"not enough windows for tick key {i}")
        keys.append((y[:origin], y[origin : origin + HORIZON], float(origin * BUCKET_S)))
    return keys


def tick_timing(keys, sample: int, horizon: int = 1) -> dict:
    """The array path over every key's tick window, against plain numpy over the same arrays and
    the per-key path on ``sample`` keys (baselines only) extrapolated."""
    width = TICK_DAYS * 86400 // BUCKET_S
    y, lengths = right_aligned([h for h, _a, _s in keys], width)
    t0 = time.perf_counter()
    d = np.abs(np.diff(y, axis=1))
    _ = d.sum(axis=1) + (d * d).sum(axis=1) + y.sum(axis=1)
    numpy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = forecast_arrays(y, lengths, bucket_s=BUCKET_S, horizon=horizon)
    arrays_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    burst_risk_arrays(y, lengths, BUCKET_S, horizon * BUCKET_S)
    risk_s = time.perf_counter() - t0
    step = max(1, len(keys) // sample)
    picked = list(range(0, len(keys), step))[:sample]
    t0 = time.perf_counter()
    for i in picked:
        h = y[i, width - lengths[i] :]
        forecast_counts(h, start=0.0, bucket_s=BUCKET_S, horizon=horizon, models=ARRAY_MODELS)
    per_key_s = (time.perf_counter() - t0) * len(keys) / len(picked)
    return {
        "keys": len(keys),
        "window_buckets": int(width),
        "horizon_buckets": horizon,
        "arrays_seconds": round(arrays_s, 3),
        "burst_risk_seconds": round(risk_s, 3),
        "plain_numpy_seconds": round(numpy_s, 3),
        "arrays_vs_plain_numpy": round((arrays_s + risk_s) / numpy_s, 1),
        "per_key_path_seconds_extrapolated": round(per_key_s, 1),
        "per_key_sample": len(picked),
        "speedup_vs_per_key": round(per_key_s / (arrays_s + risk_s), 1),
        "chosen": {m: int((res.model == j).sum()) for j, m in enumerate(res.models)},
    }


def prophet_refit_s(keys, sample: int) -> dict:
    """What one ``fit_slow_model`` costs (Prophet's backtest fold against the baselines, then
    its expected counts for the stored span), on ``sample`` keys."""
    times = []
    step = max(1, len(keys) // sample)
    for h, _a, start in keys[::step][:sample]:
        t0 = time.perf_counter()
        r = forecast_counts(h, start=start, bucket_s=BUCKET_S, horizon=HORIZON)
        if r.model == "prophet" and r.fitted is not None:
            r.fitted.fit_values(26)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
    per = float(np.median(times))
    return {
        "sample": len(times),
        "refit_seconds_median": round(per, 2),
        "refit_seconds_p90": round(float(np.percentile(times, 90)), 2),
        "refits_per_hour_two_workers": int(2 * 3600 / per),
    }


def detection(pred: np.ndarray, actual: np.ndarray, usual: np.ndarray) -> dict:
    """Precision / recall of 'a bucket above BURST_FACTOR x usual' over keys x leads."""
    thr = BURST_FACTOR * usual[:, None]
    p, a = pred > thr, actual > thr
    tp = int((p & a).sum())
    return {
        "precision": round(tp / max(int(p.sum()), 1), 3),
        "recall": round(tp / max(int(a.sum()), 1), 3),
        "bursts": int(a.sum()),
    }


def burst_detection(keys, yhat_before: dict) -> dict:
    """Per forecaster, before (per-key path, whole history) and after (array path, tick window)."""
    full = [k[0] for k in keys]
    usual = np.array([usual_count(np.concatenate([full[i], keys[i][1]])) for i in range(len(keys))])
    actual = np.array([a for _h, a, _s in keys])
    width = TICK_DAYS * 86400 // BUCKET_S
    y, lengths = right_aligned(full, width)
    res = forecast_arrays(y, lengths, bucket_s=BUCKET_S, horizon=HORIZON)
    out = {}
    for name in FORECASTERS:
        row = {}
        if name in yhat_before:
            row["before"] = detection(yhat_before[name], actual, usual)
        if name in res.predictions:
            row["after"] = detection(res.predictions[name], actual, usual)
        elif name == "prophet" and "before" in row:
            row["after"] = row["before"]  # the same fit, read from its stored state
        out[name] = row
    if "selected" in yhat_before:
        out["selected"] = {
            "before": detection(yhat_before["selected"], actual, usual),
            "after": detection(res.yhat, actual, usual),
        }
    return out


def build_keys(n_keys: int, path: str | None) -> tuple[list, list[str]]:
    tenants = load_servegen_windows(path)
    series = [t.expected_counts() for t in tenants.values()]
    names = list(tenants)
    keys = []
    for i in range(n_keys):
        tenant, j = i % len(series), i // len(series)
        origin = FIRST_ORIGIN + j * ORIGIN_STEP
        y = series[tenant]
        if origin + HORIZON > len(y):
            raise SystemExit(f"not enough windows for key {i}: {len(y)} < {origin + HORIZON}")
        keys.append((y[:origin], y[origin : origin + HORIZON], float(origin * BUCKET_S)))
    return keys, names


def timed_run(keys, models, workers):
    t0 = time.perf_counter()
    results = forecast_many(
        [(h, start) for h, _, start in keys],
        bucket_s=BUCKET_S,
        horizon=HORIZON,
        models=models,
        workers=workers,
    )
    elapsed = time.perf_counter() - t0
    heldout = [
        np.mean(np.abs(a - r.yhat)) / mase_scale(h)
        for (h, a, _), r in zip(keys, results, strict=True)
    ]
    return elapsed, results, float(np.mean(heldout))


def score_key(key) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Per forecaster: scaled absolute error at each lead, then MASE over the 12 h, then MAE;
    and its forecast."""
    history, actual, start = key
    scale = mase_scale(history)
    out, yhats = {}, {}
    for name, forecaster in FORECASTERS.items():
        if forecaster.refusal(len(history), BUCKET_S):
            continue
        yhat = forecaster.fit(history, bucket_s=BUCKET_S, end=start).predict(HORIZON).yhat
        yhats[name] = yhat
        errors = np.abs(actual - yhat)
        out[name] = [errors[lead - 1] / scale for lead in LEADS.values()]
        out[name] += [float(errors.mean() / scale)] + [errors[lead - 1] for lead in LEADS.values()]
    return out, yhats


def per_forecaster(keys, workers):
    with ProcessPoolExecutor(max_workers=workers) as pool:
        both = list(pool.map(score_key, keys, chunksize=max(1, len(keys) // (workers * 8))))
    rows = [b[0] for b in both]
    yhats = {
        name: np.array([b[1][name] for b in both])
        for name in FORECASTERS
        if all(name in b[1] for b in both)
    }
    table = {}
    for name in FORECASTERS:
        m = np.array([r[name] for r in rows if name in r])
        k = len(LEADS)
        table[name] = {
            "keys": len(m),
            "mase_0_12h": float(m[:, k].mean()),
            "median_mase_0_12h": float(np.median(m[:, k])),
            "mase_at_lead": {lead: float(m[:, i].mean()) for i, lead in enumerate(LEADS)},
            "median_mase_at_lead": {
                lead: float(np.median(m[:, i])) for i, lead in enumerate(LEADS)
            },
            "mae_at_lead": {lead: float(m[:, k + 1 + i].mean()) for i, lead in enumerate(LEADS)},
        }
    # MAE summed over keys relative to last value: volume-weighted, as the issue compares them.
    for t in table.values():
        t["mae_vs_last_value_at_lead"] = {
            lead: t["mae_at_lead"][lead] / table["last_value"]["mae_at_lead"][lead]
            for lead in LEADS
        }
    return table, yhats


def main() -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 keys instead of 1,000 (< 1 min)")
    ap.add_argument("--keys", type=int, help="keys for the tick timing (10,000; --quick 1,000)")
    ap.add_argument("--tick", action="store_true", help="the tick on PostgreSQL, cold and warm")
    ap.add_argument("--skip-accuracy", action="store_true", help="the tick timing only")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--data", help="ServeGen folder (default: the bundled m-large tenants)")
    ap.add_argument(
        "--celery",
        action="store_true",
        help="time the Celery forecast -> plan cycle with 1 and 2 worker processes",
    )
    ap.add_argument(
        "--celery-workers",
        default="1,2",
        help="--celery: worker process counts to run, in this order",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=10,
        help="--celery: the worker processes' nice value (0 for a measurement)",
    )
    args = ap.parse_args()
    try:
        return _main(args)
    except DatabaseUnavailable as exc:  # --tick and --celery run on PostgreSQL
        raise SystemExit(f"bench/forecast.py: {exc} (PREWARM_BENCH_PG_URL)") from None


def _main(args) -> int | None:
    n_keys = 100 if args.quick else 1000
    n_tick = args.keys or (1000 if args.quick else 10_000)
    if args.tick:
        from _forecast_tick import run as run_tick

        out = run_tick(tick_keys(n_tick, args.data))
        for phase in ("cold", "incremental"):
            r = out[phase]
            print(
                f"tick on PostgreSQL, {phase}: {r['seconds']} s for {r['forecast']} forecasts "
                f"({r['window']} window read) stages ms {r.get('ms')}; target <= {TICK_TARGET_S} s"
            )
        print(
            "baseline, same run: a bare COPY of the rows read, cold "
            f"{out['baseline_bare_copy_cold_read_ms']} ms, incremental "
            f"{out['baseline_bare_copy_incremental_read_ms']} ms; read stage / bare COPY: cold "
            f"{out['cold']['ms']['read'] / out['baseline_bare_copy_cold_read_ms']:.1f}x, "
            f"incremental "
            f"{out['incremental']['ms']['read'] / out['baseline_bare_copy_incremental_read_ms']:.1f}x"
        )
        print(f"load average (1 min): {out['load_avg_1m']}")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        return
    tick = tick_timing(tick_keys(n_tick, args.data), sample=100 if args.quick else 300)
    tick["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(
        f"tick arrays, {tick['keys']} keys x {tick['window_buckets']} buckets: forecasts "
        f"{tick['arrays_seconds']} s + burst risk {tick['burst_risk_seconds']} s "
        f"(target <= {TICK_TARGET_S} s for the whole tick); plain numpy over the same arrays "
        f"{tick['plain_numpy_seconds']} s (ratio {tick['arrays_vs_plain_numpy']}); per-key path "
        f"{tick['per_key_path_seconds_extrapolated']} s extrapolated from {tick['per_key_sample']} "
        f"keys ({tick['speedup_vs_per_key']}x); load {tick['load_avg_1m']}"
    )
    if args.skip_accuracy:
        if args.json:
            Path(args.json).write_text(json.dumps({"tick": tick}, indent=2))
        return
    keys, names = build_keys(n_keys, args.data)
    refit = prophet_refit_s(keys, 10 if args.quick else 30)
    print(
        f"Prophet refit (backtest fold + final fit): median {refit['refit_seconds_median']} s, "
        f"p90 {refit['refit_seconds_p90']} s -> {refit['refits_per_hour_two_workers']:,} refits "
        f"an hour on two worker processes"
    )
    if args.celery:
        from _forecast_celery import run

        out = run(keys, [int(n) for n in args.celery_workers.split(",")], nice=args.nice)
        print(
            f"Celery cycle, {n_keys} keys: "
            + ", ".join(
                f"{r['worker_processes']} worker(s) {r['cycle_seconds']} s ({r['cores_used']} cores used, "
                f"load {r['load_avg_1m']})"
                for r in out["runs"]
            )
            + f"; speedup {out.get('speedup_2_vs_1')}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        return

    full_s, results, full_mase = timed_run(keys, None, args.workers)
    lv_s, _, lv_mase = timed_run(keys, ["last_value"], args.workers)
    chosen = {m: sum(r.model == m for r in results) for m in FORECASTERS}
    t0 = time.perf_counter()
    table, yhats = per_forecaster(keys, args.workers)
    eval_s = time.perf_counter() - t0
    yhats["selected"] = np.array([r.yhat for r in results])
    bursts = burst_detection(keys, yhats)

    per_1000 = full_s * 1000 / n_keys
    out = {
        "keys": n_keys,
        "workers": args.workers,
        "key_construction": (
            f"{len(names)} ServeGen m-large tenants x 7 origins (day 11 + j x 10 h), first "
            f"{n_keys} keys; 10-min buckets; history = all windows before the origin; "
            f"horizon 12 h; backtest 3 folds (Prophet 1)"
        ),
        "seconds_for_1000_keys": per_1000 if not args.quick else None,
        "seconds_per_1000_keys_extrapolated": per_1000,
        "seconds_measured": full_s,
        "baseline_last_value_only_seconds": lv_s,
        "heldout_mase_selected": full_mase,
        "heldout_mase_last_value_only": lv_mase,
        "chosen_models": chosen,
        "mase_by_forecaster": {m: t["mase_0_12h"] for m, t in table.items()},
        "per_forecaster": table,
        "per_forecaster_eval_seconds": eval_s,
        "tick": tick,
        "prophet_refit": refit,
        "burst_detection": bursts,
    }
    print(f"forecast benchmark: {out['key_construction']}; {args.workers} workers")
    print(f"{'run':<34}{'seconds':>10}{'s/1000 keys':>13}{'held-out MASE':>15}")
    print(
        f"{'all forecasters, backtest + choice':<34}{full_s:>10.1f}{per_1000:>13.1f}"
        f"{full_mase:>15.3f}"
    )
    print(
        f"{'baseline: last_value only':<34}{lv_s:>10.1f}{lv_s * 1000 / n_keys:>13.1f}"
        f"{lv_mase:>15.3f}"
    )
    print("chosen:", ", ".join(f"{m} {c}" for m, c in chosen.items()))
    print("\nper forecaster, mean / median MASE over keys; MAE relative to last_value")
    head = "".join(f"{'@' + lead:>20}" for lead in LEADS)
    print(f"{'forecaster':<16}{'keys':>6}{'0-12h':>14}{head}")
    for name, t in table.items():
        leads = "".join(
            f"{t['mase_at_lead'][lead]:>7.2f}/{t['median_mase_at_lead'][lead]:<5.2f}"
            f"x{t['mae_vs_last_value_at_lead'][lead]:<6.2f}"
            for lead in LEADS
        )
        print(
            f"{name:<16}{t['keys']:>6}{t['mase_0_12h']:>7.2f}/{t['median_mase_0_12h']:<6.2f}{leads}"
        )
    print("\nburst detection (a bucket of the next 12 h > 2x usual), precision / recall")
    print(f"{'forecaster':<16}{'before':>16}{'after':>16}")
    for name, row in bursts.items():
        cells = [
            f"{row[k]['precision']:.3f}/{row[k]['recall']:.3f}" if k in row else "-"
            for k in ("before", "after")
        ]
        print(f"{name:<16}{cells[0]:>16}{cells[1]:>16}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
