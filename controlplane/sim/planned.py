"""``reactive``, ``predictive`` and ``clairvoyant``: the shared policy on cache-aware routing.

Every ``tick_s`` (the live plan cycle) the policy describes the cluster to the shared policy
(``core.policy.strategy``, through ``sim.adapter``: the input rules of the live plan cycle) and
executes its items as speculative copies with a TTL, or as promotions from a lower tier; and on
each arrival it re-plans the arriving prefix where the live ingest re-plan would
(``core.policy.ingest``, with its storm bound). Demand comes from the one rule both strategies
share (``core.policy.demand``):

- ``reactive`` is the strategy Prewarm ships: measured demand alone (the last minute's
  requests, held over the horizon, certain). It has no routing-time copy (the live one has
  none); the routing-time rule is ``routing-reactive`` (``policies.Reactive``).
- ``predictive`` is reactive plus foresight: the same measured demand, which no forecast
  lowers, plus what its forecast (``planned_forecast``) sees beyond it with its confidence. Its
  fallback is the live one: at the ingest re-plan, a prefix whose busiest holder queues past the
  reactive rule is re-planned through the planner (``core.policy.reactive.queue_fallback``,
  ``plans.react.fallback`` live), never copied at routing time. It leases what it plans for
  (``core.policy.retention``).
- ``clairvoyant`` feeds the planner the true arrivals of the next horizon (count, 30-second
  peak, first arrival): a reference, not a bound.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from controlplane.core.forecast.burst import BurstTracker
from controlplane.core.policy import ingest, knobs, onset, retention
from controlplane.core.policy.backoff import cluster_queue_s
from controlplane.core.policy.demand import MEASURE_WINDOW_S, combined
from controlplane.core.policy.harm_guard import GuardState
from controlplane.core.policy.ingest import INGEST_BATCH_S
from controlplane.core.policy.inputs import COLD_VALUE_S
from controlplane.core.policy.onset import ONSET_MIN_ARRIVALS, ONSET_REPLAN_S, ONSET_WINDOW_S
from controlplane.core.policy.reactive import ReactiveRule, exceeds_holders, queue_fallback
from controlplane.core.policy.strategy import (
    STRATEGY_PREDICTIVE,
    STRATEGY_REACTIVE,
    plan_moves,
    states_of,
)
from controlplane.core.policy.types import Budgets, Demand, Overrides
from controlplane.sim import adapter
from controlplane.sim.guarded import SimGuard, queue_of, serving_queues
from controlplane.sim.planned_demand import (
    MAX_CANDIDATES,
    day_forecasts,
    oracle_demand,
)
from controlplane.sim.planned_execute import execute
from controlplane.sim.planned_forecast import predicted
from controlplane.sim.policies import Reactive
from controlplane.sim.valued import SimValues
from controlplane.sim.workloads.base import BLOCK_TOKENS

# ``predictive`` without the harm guard (``prewarm-sim seeds --policies ...``): the guard's
# before/after on the same seeds in one run. Not among the default policies.
UNGUARDED = "predictive-unguarded"
# ... and the shipped strategies without the value model's correction (``sim.valued``): its
# before/after on the same seeds.
UNCORRECTED = ("reactive-uncorrected", "predictive-uncorrected")
TREND_WINDOW_S = 30.0  # short window whose rate, above the 120 s one, says demand is rising
MIN_EXPECTED_HITS = 1.6  # expected uses in the horizon: P(used) >= 0.8 for Poisson arrivals
# A burst's onset (``core.policy.onset``) re-plans its prefix on arrival, not at the next tick.
ONSET_LOOKAHEAD_S = 30.0  # clairvoyant: the true arrivals its on-arrival re-plan looks at
# The simulator's setting for the planned policies, over the policy's defaults (``core.policy
# .knobs``; its charges stay at theirs, docs/simulator.md, "What predictive's items are
# charged"): a speculative slice as large as its engines' (``ClusterConfig.spec_fraction``), a
# 2-minute horizon and a 5-minute TTL for 20-minute traces, replicas only for 1.6 expected uses,
# and no transfer budget (the largest the policy allows). ``policy_factory`` passes it in.
SIMULATED: dict[str, Any] = {
    "max_spec_vram_fraction": 0.25,
    "ttl_s": 300.0,
    "horizon_s": 120.0,
    "min_expected_hits": MIN_EXPECTED_HITS,
    "max_bytes_per_interval": float(knobs.MAX_BYTES_PER_INTERVAL.high),
}


class PlannedPolicy(Reactive):
    def __init__(
        self,
        name: str,
        budgets: Budgets,
        overrides: Overrides | None = None,
        tick_s: float = 15.0,
        reactive_rule: ReactiveRule | None = None,
        use_prophet: bool = False,
        guard: bool = True,
        ingest_bound: bool = True,
        value_correction: bool = True,
    ) -> None:
        if name not in (STRATEGY_REACTIVE, STRATEGY_PREDICTIVE, "oracle", "clairvoyant"):
            raise ValueError(name)
        super().__init__(reactive_rule)
        self.name = name
        self.tick_s = tick_s
        self.budgets = budgets
        self.overrides = overrides or Overrides()
        self.use_prophet = use_prophet
        self.forecast_log: dict[str, list] = {}
        self._lam: dict[int, float] = {}
        self._vf = None
        self.plan_items = 0
        self.skipped = 0
        # The ingest re-plan's storm bound (``core.policy.ingest``), and its counts.
        self.bound = ingest.IngestBound(enabled=ingest_bound)
        self.reasons: list[str] = []
        # The harm guard (``core.policy.harm_guard``) fed by the simulated cluster (``sim.guarded``).
        self.guard = SimGuard() if guard else None
        self._round: tuple[dict, dict, dict] = ({}, {}, {})
        # What each planned copy served against its modelled value, and the correction.
        self.values = SimValues(correct=value_correction)
        self._pid_now = -1  # the prefix of the request being served (for ``use``)
        self._one_prefill: dict[int, float] = {}

    # -- setup -----------------------------------------------------------------------------
    def setup(self, sim) -> None:
        wl = sim.workload
        # The planner's budgets never exceed the slices the engines enforce.
        cfg = sim.config
        b = self.budgets
        self.budgets = replace(
            b,
            max_spec_vram_fraction=min(b.max_spec_vram_fraction, cfg.spec_fraction),
            max_warming_fraction=min(b.max_warming_fraction, cfg.warming_spec_fraction),
        )
        self.trackers: dict[int, BurstTracker] = {}
        self.short: dict[int, BurstTracker] = {}  # the same arrivals over TREND_WINDOW_S
        self.onset: dict[int, BurstTracker] = {}  # ... and over ONSET_WINDOW_S
        self.minute: dict[int, deque] = {}  # arrivals of the last MEASURE_WINDOW_S: measured
        self._ingest: list[int] = []  # prefixes due for the next ingest re-plan
        self._ingest_at = -math.inf  # the last ingest re-plan
        self._onset_at: dict[int, float] = {}  # clairvoyant: last on-arrival re-plan per prefix
        self._replanned: dict[int, tuple[float, int]] = {}  # clairvoyant: (when, holders)
        self.seen: dict[int, int] = {}
        self.mean_suffix = float(wl.suffix_tokens.mean()) if len(wl) else 0.0
        self.day: dict[str, np.ndarray] = {}
        self.day_mase: dict[str, float | None] = {}
        if self.name == STRATEGY_PREDICTIVE and wl.history:
            self.day, self.day_mase = day_forecasts(wl, use_prophet=self.use_prophet)
        self.t_idx = wl.t
        self.pid_arr = wl.pid

    def _observe(self, sim, i, t, pid, keys) -> None:
        tr = self.trackers.get(pid)
        if tr is None:
            tr = self.trackers[pid] = BurstTracker(window_s=120.0, start=0.0)
            self.short[pid] = BurstTracker(window_s=TREND_WINDOW_S, start=0.0)
            self.onset[pid] = BurstTracker(window_s=ONSET_WINDOW_S, start=0.0)
            self.minute[pid] = deque()
        tr.observe(t)
        self.short[pid].observe(t)
        self.onset[pid].observe(t)
        self.minute[pid].append(t)
        self.seen[pid] = self.seen.get(pid, 0) + 1

    def measured(self, pid: int, t: float) -> tuple[int, float]:
        """(requests of ``pid`` in the last ``MEASURE_WINDOW_S``, their rate): the live plan
        cycle's measured demand (``replication.plans.measured``)."""
        q = self.minute.get(pid)
        if q is None:
            return 0, 0.0
        while q and q[0] <= t - MEASURE_WINDOW_S:
            q.popleft()
        return len(q), len(q) / MEASURE_WINDOW_S

    def _before(self, sim, i, t, pid, keys) -> None:
        self._pid_now = pid
        if self.name in (STRATEGY_REACTIVE, STRATEGY_PREDICTIVE):
            self._observe(sim, i, t, pid, keys)
            self._maybe_ingest(sim, t, pid, keys)
        elif self.name != "oracle" and t - self._onset_at.get(pid, -math.inf) >= ONSET_REPLAN_S:
            # clairvoyant: the arriving prefix is re-planned on its arrival (at most every
            # ONSET_REPLAN_S), with its true demand over the coming horizon, wherever its true
            # arrivals of the next ONSET_LOOKAHEAD_S are more than its holders can take.
            self._onset_at[pid] = t
            held = self._overflows(sim, t, pid, keys)
            # Re-planned when its holders changed since the last re-plan, or a tick ago.
            last = self._replanned.get(pid)
            if held is not None and (last is None or last[1] != held or t - last[0] >= self.tick_s):
                self._replanned[pid] = (t, held)
                self._plan_round(sim, t, only=(pid,))
        if self.name in (STRATEGY_REACTIVE, STRATEGY_PREDICTIVE):
            self._count(pid, t)  # no routing-time copy: the live strategies have none
        else:
            self._maybe_copy(sim, i, t, pid, keys)

    def _overflows(self, sim, t: float, pid: int, keys) -> int | None:
        """clairvoyant: its holders' count where the prefix's true arrivals over the next
        ``ONSET_LOOKAHEAD_S`` exceed what they can serve in that time, else None."""
        if len(keys) < self.rule.min_blocks:
            return None
        times = self.t_idx
        lo, hi = np.searchsorted(times, [t, t + ONSET_LOOKAHEAD_S])
        n = int(np.count_nonzero(self.pid_arr[lo:hi] == pid))
        if n < ONSET_MIN_ARRIVALS:
            return None
        service = sim.prefill_s(self.mean_suffix, len(keys) * BLOCK_TOKENS)
        holders = sum(1 for e in sim.serving if e.cache.match(keys) == len(keys))
        rate = n / ONSET_LOOKAHEAD_S
        if exceeds_holders(rate=rate, holders=holders, load=sim.load(t), service_s=service):
            return holders
        return None

    def _onset_rate(self, pid: int, t: float) -> float:
        """The prefix's rate over the last ``ONSET_WINDOW_S`` where it is a burst's onset."""
        tr = self.onset.get(pid)
        if tr is None:
            return 0.0
        return onset.onset_rate(short_rate=tr.rate(t), long_rate=self.trackers[pid].rate(t))

    def _maybe_ingest(self, sim, t, pid, keys) -> None:
        """The live ingest re-plan (``plans.react``) on this arrival: the prefix re-planned at
        once where its rate now (measured; predictive: or its burst's onset) is more than its
        holders can take, within the storm bound (``core.policy.ingest``)."""
        if len(keys) < self.rule.min_blocks:
            return
        if t - self.bound.replanned.get(str(pid), -math.inf) < ONSET_REPLAN_S:
            return  # cheap checks first: this runs on every arrival
        n, rate = self.measured(pid, t)
        predictive = self.name == STRATEGY_PREDICTIVE
        if n < ONSET_MIN_ARRIVALS and not predictive:
            return  # reactive re-plans measured demand only: no holder scan on every arrival
        if predictive:
            rate = max(rate, self._onset_rate(pid, t))
        holders = [e for e in sim.serving if e.cache.match(keys) == len(keys)]
        wanted = n >= ONSET_MIN_ARRIVALS and ingest.wants_replan(
            arrivals=n,
            rate=rate,
            blocks=len(keys),
            min_blocks=self.rule.min_blocks,
            holders=len(holders),
            load=sim.load(t),
            service_s=sim.prefill_s(self.mean_suffix, len(keys) * BLOCK_TOKENS),
        )
        if not wanted and predictive:
            wanted = self._queue_fallback(sim, t, keys, holders)
        if not wanted:
            return
        in_flight = any(k[0] == pid for k in sim.in_flight)
        if self.bound.due(str(pid), now=t, rate=rate, in_flight=in_flight):
            self._ingest.append(pid)
        if self._ingest and t - self._ingest_at >= INGEST_BATCH_S:
            # One re-plan per ingest, with every key it brought (the gateways post a second's
            # records at once): the prefixes due since the last one.
            only, self._ingest, self._ingest_at = tuple(self._ingest), [], t
            self._plan_round(sim, t, only=only, at_ingest=True)

    def _queue_fallback(self, sim, t: float, keys, holders: list) -> bool:
        """``predictive``'s fallback (``core.policy.reactive.queue_fallback``, as live): the
        busiest holder's queue against the least-queued other serving engine."""
        others = [e for e in sim.serving if e not in holders]
        if not holders or not others:
            return False
        src = max(holders, key=lambda e: e.wait(t))
        dst = min(others, key=lambda e: e.wait(t))
        nbytes = len(keys) * sim.block_bytes
        return queue_fallback(
            self.rule,
            holder_waits_s=[src.wait(t)],
            other_waits_s=[dst.wait(t)],
            copy_s=nbytes / max(1.0, sim.link_bytes_per_s(src, dst, t)),
        )

    @property
    def ingest_stats(self) -> dict:
        return self.bound.stats() if self.name in (STRATEGY_REACTIVE, STRATEGY_PREDICTIVE) else {}

    @property
    def value_stats(self) -> dict:
        return self.values.stats()

    def use(self, sim, e, chain, t):
        pid = self._pid_now
        if self.values.watching(pid, e.eid):
            keys = sim.workload.prefixes[pid]
            self.values.served(pid, e.eid, t, e.cache.match(keys) == len(keys))
        return super().use(sim, e, chain, t)

    @property
    def guard_stats(self) -> dict:
        return {} if self.guard is None else self.guard.stats()

    @property
    def on_miss(self):  # noqa: D401 - a hook the simulator calls on a request that missed
        return None if self.guard is None else self._on_miss

    def _on_miss(self, sim, e, pid: int, keys, t: float) -> None:
        """The harm guard's miss reasons (``sim.guarded``): a copy of the prefix to ``e`` in
        flight, or ``e`` removed the prefix's first block (neither: no reason it counts)."""
        assert self.guard is not None  # the hook is set only with a guard (``on_miss``)
        warming = (pid, e.eid) in sim.in_flight
        removed_at = e.cache.removed_at.get(keys[0]) if keys else None
        if warming or removed_at is not None:
            self.guard.miss(
                engine=e.name,
                prefix=pid,
                blocks=len(keys),
                t=t,
                warming=warming,
                removed_at=removed_at,
            )

    @property
    def before_route(self):  # noqa: D401 - a hook the simulator calls before routing
        return self._before

    @before_route.setter
    def before_route(self, value) -> None:
        pass

    # -- what a block is worth: the forecast where there is one, recency elsewhere -------------
    def rate_of(self, pid: int, t: float) -> float:
        lam = self._lam.get(pid)
        return lam if lam is not None else self.observed_rate(pid, t)

    # -- a planning round --------------------------------------------------------------------
    def on_tick(self, sim, t: float) -> None:
        for e in sim.engines:
            e.cache.expire(t)
            e.cache.unpin_expired(t)
        self._plan_round(sim, t)

    def _plan_round(
        self, sim, t: float, only: tuple[int, ...] | None = None, at_ingest: bool = False
    ) -> None:
        """Plan and execute: every prefix at a tick, or ``only`` these (an ingest re-plan)."""
        H = self.budgets.horizon_s
        if self.name in ("oracle", "clairvoyant"):
            demand = oracle_demand(sim, self.t_idx, self.pid_arr, t, H, only, self.forecast_log)
        else:
            demand = self._demand(sim, t, H, only)
        lam = {
            int(p): d.expected_requests / H
            + d.burst_probability * max(0.0, d.peak_rate - d.expected_requests / H)
            for p, d in demand.items()
        }
        if only is None:
            self._lam = lam
        else:
            self._lam.update(lam)
        self._vf = self.value_fn(sim, t)
        self.values.close(t)
        if not demand:
            return
        reports = adapter.engine_reports(sim, t, self._vf, cold_value_s=COLD_VALUE_S)
        engines = states_of(reports, horizon_s=H)
        if only is None:
            if self.name != STRATEGY_REACTIVE:  # the shipped reactive leases nothing
                self._retain(sim, demand, t, H, cluster_queue_s(engines))
            if self.guard is not None:
                self.guard.observe(t, engines, self.budgets)
        cands = adapter.candidates(sim, demand, self.rule.min_blocks, self.mean_suffix)
        narrowed: list | None = None if self.guard is None else []
        items = plan_moves(
            strategy=STRATEGY_REACTIVE if self.name == STRATEGY_REACTIVE else STRATEGY_PREDICTIVE,
            candidates=cands,
            demand=demand.values(),
            holdings=adapter.holdings(sim, cands, t),
            engines=engines,
            budgets=self.budgets,
            overrides=self.overrides,
            guard=GuardState() if self.guard is None else self.guard.state,
            narrowed=narrowed,  # the guard's concentration signal (core.policy.spread)
            calibration=self.values.calibration(),
        ).items
        if self.guard is not None and narrowed:
            self.guard.spread(narrowed)
        if at_ingest:
            rates = {str(p): d.measured_rate for p, d in demand.items()}
            items = self.bound.admit(items, engines=engines, now=t, rates=rates)
        self._round = ({e.engine_id: e for e in engines}, demand, serving_queues(engines))
        self._one_prefill.update((int(c.prefix_id), c.recompute_s) for c in cands)
        for it in items:
            self._execute(sim, it, t)

    def _demand(self, sim, t, H, only: tuple[int, ...] | None = None) -> dict[int, Demand]:
        """Each prefix's demand by the shared rule (``core.policy.demand``): the measured rate
        (predictive: or its onset's), plus, under predictive, its forecast's excess."""
        forecast = predicted(self, sim, t, H, only) if self.name == STRATEGY_PREDICTIVE else {}
        pids = list(self.trackers if only is None else only)
        pids += [p for p in forecast if p not in self.trackers]
        rows = []
        for pid in pids:
            _, rate = self.measured(pid, t)
            f = forecast.get(pid)
            ro = self._onset_rate(pid, t) if self.name == STRATEGY_PREDICTIVE else 0.0
            if rate <= 0 and ro <= 0 and f is None:
                continue
            d = combined(
                str(pid),
                measured_rate=rate,
                horizon_s=H,
                forecast=f,
                onset_rate=ro,
                min_confidence=self.budgets.min_confidence,
            )
            rows.append((d.expected_requests, pid, d))
        rows.sort(key=lambda x: (-x[0], x[1]))
        return {pid: d for _, pid, d in rows[:MAX_CANDIDATES] if d.expected_requests > 0}

    def _retain(self, sim, demand, t, H, queue_s: float) -> None:
        """Keep (lease) what the same ranking values on its holders until the next round
        (``core.policy.retention``)."""
        if not retention.leases_allowed(
            load=sim.load(t), cluster_queue_s=queue_s, budgets=self.budgets
        ):
            return
        until = t + 2 * self.tick_s
        for p in demand:
            keys = sim.workload.prefixes[int(p)]
            holders = [e for e in sim.serving if e.cache.match(keys) == len(keys)]
            if retention.keeps(rate=self._lam.get(int(p), 0.0), holders=len(holders), horizon_s=H):
                for e in holders:
                    e.cache.pin(keys, until)

    def _execute(self, sim, it, t) -> None:
        execute(self, sim, it, t)

    def _copied(self, sim, pid: int, src, dst, t: float, land: float | None) -> None:
        """A routing-time (fallback) copy started: the harm guard watches it as it watches the
        planner's (its target's queue now, and every serving engine's)."""
        if self.guard is None or land is None:
            return
        queues = {e.name: queue_of(e, t) for e in sim.serving}
        wkeys = sim.workload.prefix_wkey
        self.guard.record(
            target=dst.name,
            queue_before_s=queues.get(dst.name),
            group=wkeys[pid] if 0 <= pid < len(wkeys) else str(pid),
            prefix=pid,
            queues_at_plan=queues,
            planned_at=t,
            lands_at=land,
        )
