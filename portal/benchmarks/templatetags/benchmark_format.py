"""Number formatting for benchmark reports: units always written, a dash where nothing was measured."""

from __future__ import annotations

import math
from typing import Any

from django import template

register = template.Library()
_NONE = "\u2013"  # an en dash


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@register.filter
def ms(value: Any) -> str:
    number = _number(value)
    if number is None:
        return _NONE
    return f"{number:,.1f} ms" if number < 10 else f"{number:,.0f} ms"


@register.filter
def ci_ms(interval: Any) -> str:
    """'(lo to hi)' of a bootstrap interval, or '' when there were too few requests for one."""
    if not interval or len(interval) != 2:
        return ""
    low, high = _number(interval[0]), _number(interval[1])
    if low is None or high is None:
        return ""
    return f"({low:,.0f}\u2013{high:,.0f})"


@register.filter
def pct(value: Any) -> str:
    number = _number(value)
    return _NONE if number is None else f"{100 * number:.1f}%"


@register.filter
def rate(value: Any, digits: int = 2) -> str:
    number = _number(value)
    return _NONE if number is None else f"{number:,.{digits}f}"


@register.filter
def usd(value: Any) -> str:
    number = _number(value)
    if number is None:
        return _NONE
    return f"${number:,.4f}" if number < 1 else f"${number:,.2f}"
