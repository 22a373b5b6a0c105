"""What a virtual cluster's run counted (``Stats``): requests, tokens, TTFTs, copies, warm-ups,
lifecycle changes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TTFT_KEPT = 100_000


@dataclass
class Stats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # The newest requests' TTFTs (the summary's mean and p99): a looping demo serves ~6,500
    # requests a minute for as long as it is left running.
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=TTFT_KEPT))
    copies_in_blocks: int = 0
    copies_in_bytes: int = 0
    copies_rejected: int = 0
    replicas_placed: int = 0
    warmups: int = 0
    lifecycle_changes: list[tuple[str, str]] = field(default_factory=list)
    rejoins: int = 0  # engines taken out and joining again on a looped pass
