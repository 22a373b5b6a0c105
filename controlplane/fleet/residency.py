"""The configured residency index of this process (in-process or Redis)."""

from __future__ import annotations

import threading

from django.conf import settings

from controlplane.core.residency import InProcessResidencyIndex, ResidencyIndex

_lock = threading.Lock()
_index: ResidencyIndex | None = None


def get_index() -> ResidencyIndex:
    global _index
    if _index is None:
        with _lock:
            if _index is None:
                cfg = settings.RESIDENCY_INDEX
                if cfg["backend"] == "redis":
                    from controlplane.core.residency_redis import RedisResidencyIndex

                    _index = RedisResidencyIndex(cfg["url"], namespace=cfg.get("namespace", "pw"))
                else:
                    _index = InProcessResidencyIndex()
    return _index


def reset_index() -> None:
    """Forget the cached index (tests that switch settings)."""
    global _index
    with _lock:
        _index = None
