"""A burst's onset, seen on arrivals rather than at the next plan round.

A prefix whose rate over the last ``ONSET_WINDOW_S`` (at least ``ONSET_MIN_ARRIVALS`` arrivals)
is ``ONSET_RATIO`` x its long-window rate and above its holders' capacity is re-planned at once
(at most every ``ONSET_REPLAN_S``), with that rate as its demand: replicas fan out while the
burst builds. The simulator checks it on each arrival; the live control plane on each ingest of
request records.
"""

from __future__ import annotations

from controlplane.core.policy.reactive import exceeds_holders

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


def replans(
    *,
    now: float,
    last_replan: float,
    seen: int,
    rate: float,
    blocks: int,
    min_blocks: int,
    holders: int,
    load: float,
    service_s: float,
) -> bool:
    """Whether a prefix at its onset (``rate`` from ``onset_rate``) is re-planned now: not
    re-planned in the last ``ONSET_REPLAN_S``, seen enough, long enough to track, and more than
    its holders can take."""
    if now - last_replan < ONSET_REPLAN_S or seen < MIN_SEEN:
        return False
    if rate <= 0 or blocks < min_blocks:
        return False
    return exceeds_holders(rate=rate, holders=holders, load=load, service_s=service_s)
