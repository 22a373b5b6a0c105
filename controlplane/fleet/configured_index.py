"""The configured residency index of this process (in-process or Redis)."""

from __future__ import annotations

import threading

from django.conf import settings

from controlplane.core.residency_index import InProcessResidencyIndex, ResidencyIndex

_lock = threading.Lock()
_index: ResidencyIndex | None = None


def get_index() -> ResidencyIndex:
    global _index
    if _index is None:
        with _lock:
            if _index is None:
                cfg = settings.RESIDENCY_INDEX
                # What the index keeps of each engine's removals (miss reason ``evicted``).
                kept = {
                    "removal_window_s": settings.PREWARM_REMOVALS_KEEP_SECONDS,
                    "removal_cap": settings.PREWARM_REMOVALS_PER_ENGINE,
                }
                if cfg["backend"] == "redis":
                    from controlplane.core.residency_redis import RedisResidencyIndex

                    _index = RedisResidencyIndex(
                        cfg["url"], namespace=cfg.get("namespace", "pw"), **kept
                    )
                else:
                    _index = InProcessResidencyIndex(**kept)
    return _index


def reset_index() -> None:
    """Forget the cached index (tests that switch settings)."""
    global _index
    with _lock:
        _index = None
