"""A burst's onset, seen on arrivals rather than at the next plan round.

A prefix whose rate over the last ``ONSET_WINDOW_S`` (at least ``ONSET_MIN_ARRIVALS`` arrivals)
is ``ONSET_RATIO`` x its long-window rate is at a burst's onset: under ``predictive`` that rate is
its rate now, what the ingest re-plan (``core.policy.ingest``, at most every ``ONSET_REPLAN_S``
per prefix) plans it for, so replicas fan out while the burst builds.
"""

from __future__ import annotations

ONSET_WINDOW_S = 5.0
ONSET_MIN_ARRIVALS = 8
ONSET_RATIO = 2.0
ONSET_REPLAN_S = 2.0
LONG_WINDOW_S = 120.0  # the window the onset's rate is compared with
MIN_SEEN = 3  # arrivals before a prefix has any signal (the reactive rule covers it until then)


def onset_rate(*, short_rate: float, long_rate: float) -> float:
    """The rate over the last ``ONSET_WINDOW_S`` where it is a burst's onset, else 0."""
    if short_rate * ONSET_WINDOW_S < ONSET_MIN_ARRIVALS or short_rate < ONSET_RATIO * long_rate:
        return 0.0
    return short_rate
