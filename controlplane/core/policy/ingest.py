"""The ingest re-plan: a prefix seen in request records as they arrive (live: each ingest of
records; simulated: each arrival) is planned at once rather than at the next plan cycle, under
either strategy, and the bound that keeps it from storming.

**Which prefixes** (``wants_replan``): at least ``onset.ONSET_MIN_ARRIVALS`` requests in the
last ``demand.MEASURE_WINDOW_S``, long enough to track, and a rate now (measured; under
``predictive`` a burst's onset where one shows) above what its holders can take
(``reactive.exceeds_holders``). Their demand is the shared rule's (``core.policy.demand``).

**The bound** (``IngestBound``), per prefix and per target, so a burst that keeps arriving
cannot copy its prefix again and again:

- *minimum interval*: a prefix is re-planned at ingest at most every ``onset.ONSET_REPLAN_S``;
  once an ingest re-plan copied it, not again for ``MIN_INTERVAL_S`` (the plan cycle's tick
  plans it from then) ...
- *hysteresis*: ... unless its rate has reached ``HYSTERESIS`` x the rate those copies were
  planned for (a burst still building);
- *bytes in flight*: not while a copy of it is on its way (that copy is not a holder yet, so the
  re-plan would send another for the same demand), and an item lands on a target only while the
  copies on the target's link (``EngineState.link_queue_s``, and the items admitted before it)
  cross in under ``MAX_LINK_QUEUE_S``.

Its counts (``stats``): the ingest re-plans, the copies they made, the re-plans and items the
bound held back. The simulator reports them per run; the live plan summary per plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from controlplane.core.policy.onset import ONSET_MIN_ARRIVALS, ONSET_REPLAN_S
from controlplane.core.policy.reactive import exceeds_holders
from controlplane.core.policy.types import EngineState, PlannedMove

# Gateways post their records once a second: one ingest re-plan covers a second's keys (the
# simulator batches its arrivals so).
INGEST_BATCH_S = 1.0
MIN_INTERVAL_S = 15.0
HYSTERESIS = 1.5
MAX_LINK_QUEUE_S = 10.0


def wants_replan(
    *,
    arrivals: float,
    rate: float,
    blocks: int,
    min_blocks: int,
    holders: int,
    load: float,
    service_s: float,
) -> bool:
    """Whether an arriving prefix calls for an ingest re-plan (module doc): ``arrivals`` in the
    last minute, ``rate`` its rate now."""
    if arrivals < ONSET_MIN_ARRIVALS or rate <= 0 or blocks < min_blocks:
        return False
    return exceeds_holders(rate=rate, holders=holders, load=load, service_s=service_s)


@dataclass
class IngestBound:
    """The storm bound (module doc). ``enabled=False`` keeps only the re-plan interval."""

    enabled: bool = True
    replanned: dict[str, float] = field(default_factory=dict)  # prefix -> last re-plan
    copied: dict[str, tuple[float, float]] = field(default_factory=dict)  # -> (when, rate)
    replans: int = 0
    copies: int = 0
    held_back_replans: int = 0
    held_back_items: int = 0

    def reset(self) -> None:
        self.replanned.clear()
        self.copied.clear()
        self.replans = self.copies = self.held_back_replans = self.held_back_items = 0

    def due(self, prefix: str, *, now: float, rate: float, in_flight: bool) -> bool:
        """Whether ``prefix`` may be re-planned now (``rate``: its rate now; ``in_flight``: a
        copy of it is on its way). Counts a re-plan the bound holds back."""
        if now - self.replanned.get(prefix, -math.inf) < ONSET_REPLAN_S:
            return False
        if self.enabled:
            last = self.copied.get(prefix)
            recent = last is not None and now - last[0] < MIN_INTERVAL_S
            if in_flight or (last is not None and recent and rate < HYSTERESIS * last[1]):
                self.held_back_replans += 1
                return False
        self.replanned[prefix] = now
        self.replans += 1
        return True

    def admit(
        self,
        items: Iterable[PlannedMove],
        *,
        engines: Sequence[EngineState],
        now: float,
        rates: dict[str, float],
    ) -> list[PlannedMove]:
        """The items of an ingest re-plan the targets' links let through; the prefixes they
        copy are marked (``rates``: each prefix's rate now, which the hysteresis compares)."""
        by_id = {e.engine_id: e for e in engines}
        queued: dict[str, float] = {}
        out = []
        for it in items:
            e = by_id.get(it.target)
            link = max(1.0, e.link_bytes_per_s) if e is not None else 1.0
            waits = (e.link_queue_s if e is not None else 0.0) + queued.get(it.target, 0.0)
            if self.enabled and e is not None and waits > MAX_LINK_QUEUE_S:
                self.held_back_items += 1
                continue
            queued[it.target] = queued.get(it.target, 0.0) + it.nbytes / link
            out.append(it)
        for it in out:
            self.copied[it.prefix_id] = (now, rates.get(it.prefix_id, 0.0))
        self.copies += len(out)
        return out

    def stats(self) -> dict:
        return {
            "replans": self.replans,
            "copies": self.copies,
            "held_back_replans": self.held_back_replans,
            "held_back_items": self.held_back_items,
            "bound": self.enabled,
        }
