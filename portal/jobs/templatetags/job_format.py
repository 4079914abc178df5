from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def duration_words(seconds: float | None) -> str:
    """A duration as a person reads it: "45 s", "4 min 12 s", "1 h 5 min"."""
    if seconds is None:
        return ""
    total = round(max(float(seconds), 0.0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"
