"""The simulator's feed to the value model's correction (``controlplane.core.policy.value``):
what each planned copy actually served, against what the planner modelled.

Each copy or promotion the planner's items start is watched from its landing to the end of the
horizon its value was modelled over (a joining engine's: from when it starts serving). A request
of its prefix that its target serves with the whole prefix cached in that window is a hit. When
the window closes the copy's outcome is its hits and the credit the scoreboard gives a used
replica (one prefill of the prefix, the creditable maximum: without the copy its engine would
have computed the prefix once and served the rest from its own cache). The outcomes feed a
rolling ledger whose correction the next plan rounds apply, as the control plane's plan cycle
applies the one its scored replicas call for (``replication.plans.value``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.core.policy import value
from controlplane.core.policy.value import Calibration, Ledger, Outcome, ValueTerms


@dataclass
class Watched:
    terms: ValueTerms
    lands_at: float
    ends_at: float
    one_prefill_s: float
    hits: int = 0


@dataclass
class SimValues:
    """Planned copies watched until their window closes; ``correct`` False: the ratios are
    kept but the planner is given no correction (the before/after on the same seeds)."""

    correct: bool = True
    ledger: Ledger = field(default_factory=Ledger)
    closed: list[Outcome] = field(default_factory=list)  # every outcome, for the report
    _open: dict[tuple[int, int], list[Watched]] = field(default_factory=dict)

    def record(
        self,
        *,
        terms: ValueTerms | None,
        prefix: int,
        engine: int,
        lands_at: float | None,
        ends_at: float,
        one_prefill_s: float,
    ) -> None:
        """A planned copy (or promotion) of ``prefix`` to ``engine`` started; None: it did
        not (no room, nothing missing), and has no outcome."""
        if terms is None or lands_at is None:
            return
        w = Watched(terms, lands_at, max(ends_at, lands_at), one_prefill_s)
        self._open.setdefault((prefix, engine), []).append(w)

    def watching(self, prefix: int, engine: int) -> bool:
        return (prefix, engine) in self._open

    def served(self, prefix: int, engine: int, t: float, whole: bool) -> None:
        """A request of ``prefix`` served on ``engine`` at ``t``; ``whole``: with all of the
        prefix cached."""
        if not whole:
            return
        for w in self._open.get((prefix, engine), ()):
            if w.lands_at <= t < w.ends_at:
                w.hits += 1

    def close(self, t: float) -> None:
        """Outcomes of the copies whose window ended by ``t``."""
        for k in [k for k, ws in self._open.items() if any(w.ends_at <= t for w in ws)]:
            keep = []
            for w in self._open[k]:
                if w.ends_at > t:
                    keep.append(w)
                    continue
                o = Outcome(w.terms, w.hits, w.one_prefill_s if w.hits else 0.0)
                self.ledger.add(o)
                self.closed.append(o)
            if keep:
                self._open[k] = keep
            else:
                del self._open[k]

    def calibration(self) -> Calibration | None:
        return self.ledger.calibration() if self.correct else None

    def stats(self) -> dict:
        """For the run's summary: per kind and term, modelled against measured over every
        closed window (``value.rows``), the factors in use at the end, and the value's ratio
        over every kind."""
        stats = value.tally(self.closed)
        cal = self.ledger.calibration() if self.correct else value.NONE
        modelled = sum(o.terms.value for o in self.closed)
        measured = sum(o.saved_s for o in self.closed)
        return {
            "corrected": self.correct,
            "copies": len(self.closed),
            "ratio": round(measured / modelled, 4) if modelled > 0 else None,
            "terms": value.rows(stats, cal),
        }
