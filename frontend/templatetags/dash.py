"""Formatting filters for the dashboard: bytes, percentages, seconds."""

from django import template

register = template.Library()

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@register.filter
def nbytes(value) -> str:
    if value is None or value == "":
        return "–"
    size = float(value)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


@register.filter
def pct(value) -> str:
    return "–" if value in (None, "") else f"{float(value) * 100:.0f}%"


@register.filter
def secs(value) -> str:
    if value in (None, ""):
        return "–"
    value = float(value)
    if abs(value) >= 3600:
        return f"{value / 3600:.1f} h"
    return f"{value:.1f} s" if abs(value) >= 1 else f"{value * 1000:.0f} ms"


@register.filter
def creditable(item) -> float:
    """The most the scoreboard can credit a plan item (one prefill of its prefix)."""
    from controlplane.replication.scoreboard.aggregation import creditable_s

    return creditable_s(item)


@register.filter
def fraction(part, whole) -> float:
    """part/whole as a percentage for bar widths (0 when unknown)."""
    try:
        return max(0.0, min(100.0, 100.0 * float(part) / float(whole)))
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0


@register.filter
def shortkey(keys) -> str:
    """The first and last block of a prefix chain, for tables."""
    if not keys:
        return "–"
    return keys[0][:8] if len(keys) == 1 else f"{keys[0][:8]}…{keys[-1][:6]} ({len(keys)})"
