"""Benchmark: 1,000 workload keys forecast and backtested, and per-forecaster MASE on held-back
days of the ServeGen m-large tenants.

Keys: the 162 real tenants x 7 forecast origins, origin j at day 11 + j x 10 h (j = 0..6),
cut at 1,000 keys (key i = tenant i mod 162, origin i div 162). Each key's history is every
10-minute window before its origin (days 1-11 and, for later origins, the held-back windows
before it); its test is the next 12 h (72 windows), all inside days 12-14.

Timed: `forecast_many` with every forecaster (backtest, choice, final fit) over a process pool,
against last-value-only forecasting in the same run. Then, untimed, each forecaster is fitted at
every origin and scored at leads 10 min, 60 min, 6 h, 12 h (MASE, scaled on the key's history).

    python bench/forecast.py [--quick] [--json PATH] [--workers N]
    python bench/forecast.py --celery [--quick] [--json PATH]   # the Celery cycle, 1 vs 2 workers

``--celery`` runs the same keys through the product's forecast -> plan cycle on real Celery
worker processes (PostgreSQL + Redis, ``bench/_forecast_celery.py``), with 1 and with 2 of them.
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

from controlplane.core.forecast import FORECASTERS, forecast_many  # noqa: E402
from controlplane.core.forecast.series import mase_scale  # noqa: E402
from controlplane.core.traces import load_servegen_windows  # noqa: E402

BUCKET_S = 600
HORIZON = 72  # 12 h
FIRST_ORIGIN = 11 * 144  # end of day 11
ORIGIN_STEP = 60  # 10 h
LEADS = {"10min": 1, "60min": 6, "6h": 36, "12h": 72}


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
        bucket_seconds=BUCKET_S,
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


def score_key(key) -> dict[str, list[float]]:
    """Per forecaster: scaled absolute error at each lead, then MASE over the 12 h, then MAE."""
    history, actual, start = key
    scale = mase_scale(history)
    out = {}
    for name, forecaster in FORECASTERS.items():
        if forecaster.refusal(len(history), BUCKET_S):
            continue
        yhat = forecaster.fit(history, bucket_seconds=BUCKET_S, end=start).predict(HORIZON).yhat
        errors = np.abs(actual - yhat)
        out[name] = [errors[lead - 1] / scale for lead in LEADS.values()]
        out[name] += [float(errors.mean() / scale)] + [errors[lead - 1] for lead in LEADS.values()]
    return out


def per_forecaster(keys, workers):
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(score_key, keys, chunksize=max(1, len(keys) // (workers * 8))))
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
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 keys instead of 1,000 (< 1 min)")
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
    n_keys = 100 if args.quick else 1000
    keys, names = build_keys(n_keys, args.data)
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
    table = per_forecaster(keys, args.workers)
    eval_s = time.perf_counter() - t0

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
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
