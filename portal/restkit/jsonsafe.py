"""Selector data as the API sends it: JSON has no NaN or infinity, so a non-finite number that
reaches a response (a ratio over nothing, an interval without requests) is null, never a 500."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deeply nested, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
