"""The value model's terms, what each turned out to be worth, and the correction both use.

A plan item's modelled TTFT saving (``planner``) is a product of terms:

    value = requests x saving per request x discount

- **requests**: requests expected to use the copy in the horizon (a replica: the overflow
  spilled to it; a warm-up: the joining engine's share of the prefix's requests; a promotion:
  the requests expected to reach the lower tier);
- **saving**: seconds of TTFT each such request saves (a replica: the recompute less the
  target's queue; a warm-up: the first request's recompute, spread over the requests expected
  there; a promotion: the promotion time a request would wait, at most one request's);
- **discount**: the demand's confidence (a replica: times the share of the horizon left after
  it lands). It is not measured apart: it stays in the value's ratio.

Each copy's outcome (``Outcome``) says what it did: the requests that used it (hits) and the
TTFT credited to it (live: the scoreboard's credit, at most one prefill of the placed tokens per
used replica, from measured TTFT where records carry it; simulated: the same rule on what the
copy served). Per kind of item and term, ``tally`` sums modelled against measured:

- requests: hits against the modelled requests, over every copy;
- saving: the credit against hits x the modelled saving per request, over copies that were used;
- value: the credit against the modelled value, over every copy.

``calibrate`` turns the ratios into a correction per term (``Calibration``): the ratio measured
/ modelled, shrunk towards 1 with a prior of ``PRIOR_WEIGHT`` copies (little evidence moves it
little) and bounded to ``[MIN_FACTOR, MAX_FACTOR]``. The planner multiplies each item's requests
and saving terms by theirs before weighing it against its cost, so the simulator and the control
plane correct the model alike. Ratios are always of the uncorrected model (``PlannedMove.terms``),
so a correction that works does not wash out its own evidence.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

REPLICA, WARM_UP, PROMOTION = "replica", "warm-up", "promotion"
KINDS = (REPLICA, WARM_UP, PROMOTION)
REQUESTS, SAVING, VALUE = "requests", "saving", "value"
TERMS = (REQUESTS, SAVING, VALUE)
CORRECTED = (REQUESTS, SAVING)  # the terms a correction applies to (value is their product)

PRIOR_WEIGHT = 20.0  # copies' worth of evidence that the model is right (ratio 1)
MIN_FACTOR = 0.02  # no term is cut below this share of what the model says ...
MAX_FACTOR = 2.0  # ... nor raised above this multiple
WINDOW = 400  # copies per kind a rolling ledger keeps (the simulator's)


@dataclass(frozen=True)
class ValueTerms:
    """One item's modelled saving, term by term (uncorrected)."""

    kind: str
    requests: float
    saving_s: float  # per request
    discount: float = 1.0

    @property
    def value(self) -> float:
        return self.requests * self.saving_s * self.discount

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "requests": self.requests,
            "saving_s": self.saving_s,
            "discount": self.discount,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> ValueTerms | None:
        """The terms stored with an item; None where it stored none (or a malformed row)."""
        try:
            t = cls(
                str(d["kind"]), float(d["requests"]), float(d["saving_s"]), float(d["discount"])
            )
        except (KeyError, TypeError, ValueError):
            return None
        ok = t.kind in KINDS and all(math.isfinite(x) for x in (t.requests, t.saving_s))
        return t if ok else None


@dataclass(frozen=True)
class Outcome:
    """What one copy turned out to do: requests that used it and the TTFT credited to it."""

    terms: ValueTerms
    hits: float
    saved_s: float


@dataclass
class TermStats:
    modelled: float = 0.0
    measured: float = 0.0
    n: int = 0  # copies that gave evidence on the term

    @property
    def ratio(self) -> float | None:
        """Measured / modelled (None: no evidence, or nothing modelled)."""
        return self.measured / self.modelled if self.n and self.modelled > 0 else None

    def add(self, modelled: float, measured: float) -> None:
        self.modelled += max(0.0, modelled)
        self.measured += max(0.0, measured)
        self.n += 1


def tally(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], TermStats]:
    """Modelled against measured per (kind, term) over ``outcomes`` (module doc)."""
    out: dict[tuple[str, str], TermStats] = {}

    def at(kind: str, term: str) -> TermStats:
        return out.setdefault((kind, term), TermStats())

    for o in outcomes:
        t = o.terms
        at(t.kind, REQUESTS).add(t.requests, o.hits)
        if o.hits > 0:
            at(t.kind, SAVING).add(o.hits * t.saving_s, o.saved_s)
        at(t.kind, VALUE).add(t.value, o.saved_s)
    return out


def shrunk(s: TermStats, prior_weight: float = PRIOR_WEIGHT) -> float:
    """The correction for one term: its ratio, shrunk towards 1 by ``prior_weight`` copies of
    evidence that the model is right, bounded to [MIN_FACTOR, MAX_FACTOR]."""
    r = s.ratio
    if r is None:
        return 1.0
    f = (s.n * r + prior_weight) / (s.n + prior_weight)
    return min(MAX_FACTOR, max(MIN_FACTOR, f))


@dataclass(frozen=True)
class Calibration:
    """Factors per (kind, term) the planner multiplies the model's terms by (1 where none)."""

    factors: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def factor(self, kind: str, term: str) -> float:
        return self.factors.get((kind, term), 1.0)

    def value(self, t: ValueTerms) -> float:
        """The corrected value of ``t``: its requests and saving terms times their factors."""
        return t.value * self.factor(t.kind, REQUESTS) * self.factor(t.kind, SAVING)


NONE = Calibration()


def calibrate(
    stats: Mapping[tuple[str, str], TermStats], prior_weight: float = PRIOR_WEIGHT
) -> Calibration:
    """The correction the tallies call for (``shrunk``, per corrected term)."""
    return Calibration(
        {k: shrunk(s, prior_weight) for k, s in stats.items() if k[1] in CORRECTED and s.n}
    )


def rows(stats: Mapping[tuple[str, str], TermStats], calibration: Calibration) -> list[dict]:
    """Per kind and term, for the scoreboard, its API and the simulator's report: modelled,
    measured, the copies counted, the ratio and the factor applied (value: their product)."""
    out = []
    for kind in KINDS:
        for term in TERMS:
            s = stats.get((kind, term))
            if s is None or not s.n:
                continue
            f = (
                calibration.factor(kind, REQUESTS) * calibration.factor(kind, SAVING)
                if term == VALUE
                else calibration.factor(kind, term)
            )
            r = s.ratio
            out.append(
                {
                    "kind": kind,
                    "term": term,
                    "modelled": round(s.modelled, 4),
                    "measured": round(s.measured, 4),
                    "copies": s.n,
                    "ratio": None if r is None else round(r, 4),
                    "factor": round(f, 4),
                }
            )
    return out


@dataclass
class Ledger:
    """A rolling record of outcomes (the last ``window`` per kind): the simulator's, which
    calibrates each plan round on the copies whose outcome is known by then."""

    window: int = WINDOW
    prior_weight: float = PRIOR_WEIGHT
    _by_kind: dict[str, deque] = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        self._by_kind.setdefault(o.terms.kind, deque(maxlen=self.window)).append(o)

    def outcomes(self) -> list[Outcome]:
        return [o for kind in KINDS for o in self._by_kind.get(kind, ())]

    def stats(self) -> dict[tuple[str, str], TermStats]:
        return tally(self.outcomes())

    def calibration(self) -> Calibration:
        return calibrate(self.stats(), self.prior_weight)
