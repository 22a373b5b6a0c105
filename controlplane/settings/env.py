"""One typed reader for settings from the environment (PostHog's get_from_env)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_MISSING = object()


def str_to_bool(value: str) -> bool:
    low = value.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected a boolean (true/false), got {value!r}")


def str_to_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def get_from_env(
    key: str,
    default: Any = _MISSING,
    *,
    type_cast: Callable[[str], Any] | None = None,
    optional: bool = False,
) -> Any:
    """Read ``key`` from the environment, cast it, or fail start-up with one clear line."""
    raw = os.environ.get(key)
    if raw is None or raw == "":
        if default is not _MISSING:
            return default
        if optional:
            return None
        raise ImproperlyConfigured(f"environment variable {key} is required but not set")
    if type_cast is None:
        return raw
    try:
        return type_cast(raw)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"environment variable {key} is malformed: {exc}") from None
