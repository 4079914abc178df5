from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def figure_number(value: float | int | None) -> str:
    """A datasheet number as people write it: 4,800 / 989 / 22.8 / 0.0628 (3 significant digits
    below 100, so a measured CPU figure keeps its precision and a price no trailing zeros)."""
    if value is None:
        return ""
    number = float(value)
    if number.is_integer():
        return f"{int(number):,}"
    if abs(number) >= 100:
        return f"{number:,.1f}"
    return f"{number:.3g}"
