"""Figure JSON for the pages' Plotly charts, shared by every app's `charts.py`.

Every figure is drawn in the `plotly_white` template. Naming the template in each figure's
layout made plotly copy and validate the whole template on every `update_layout`, which was
most of a figure's build time (measured with benchmarks/portal_load.py: ~80% of a chart, and
the profile, report and endpoint pages draw four to six each on every request). The template
is serialised once per process instead and attached to each figure's JSON: the output is
the same.

The figures are pure functions of their inputs, and the inputs mostly repeat: a traffic
profile or a finished job's report never changes, an endpoint's SLA and history charts change
when a window closes or a configuration is promoted, and its live charts change once per scrape
(15 s) while everyone watching it polls. `memoized` keeps each process's recent figures by the
content of their arguments, so a repeated request serialises instead of rebuilding.

Pages draw the figures with plotly.js's official "basic" bundle (static/vendor/plotly: scatter,
bar and pie traces; a quarter of the full bundle's size), so a figure with any other trace type
is refused here: the bundle would leave its chart blank in the browser, with only a console
error to say why.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any, ParamSpec, TypeVar

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "plotly_white"
# The static file every chart page loads, and the trace types that bundle registers.
PLOTLY_JS = "vendor/plotly/plotly-basic.min.js"
BUNDLE_TRACE_TYPES = frozenset({"bar", "pie", "scatter"})


@functools.cache
def _template_json(name: str) -> str:
    figure: dict[str, Any] = json.loads(pio.to_json(go.Figure(layout={"template": name}), validate=True))
    return json.dumps(figure["layout"]["template"])


def figure_json(fig: go.Figure, *, template: str = TEMPLATE) -> dict[str, Any]:
    """The figure as plotly.js reads it, in `template` (do not set a template on `fig`)."""
    result: dict[str, Any] = json.loads(pio.to_json(fig, validate=True))
    unknown = {trace.get("type", "scatter") for trace in result.get("data", [])} - BUNDLE_TRACE_TYPES
    if unknown:
        raise ValueError(
            f"trace type(s) {sorted(unknown)} are not in the plotly.js bundle the pages load "
            f"({PLOTLY_JS}: {sorted(BUNDLE_TRACE_TYPES)}); see static/vendor/plotly/README.md"
        )
    # A fresh copy per figure: callers may adjust a figure's layout after building it.
    result.setdefault("layout", {})["template"] = json.loads(_template_json(template))
    return result


P = ParamSpec("P")
R = TypeVar("R")

CACHE_FIGURES = 256  # per process; a figure's JSON is 5-40 kB
_figures: OrderedDict[str, str] = OrderedDict()
_figures_lock = threading.Lock()  # gunicorn's threaded workers share the cache


def _plain(value: Any) -> str:
    # Values whose text is their identity; anything else (a model instance, say) is not keyed.
    if isinstance(value, datetime | date | Decimal | uuid.UUID):
        return f"{type(value).__name__}:{value.isoformat() if isinstance(value, datetime | date) else value}"
    raise TypeError(type(value).__name__)


def _key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    try:
        text = json.dumps([name, args, kwargs], sort_keys=True, default=_plain)
    except (TypeError, ValueError):
        return None  # arguments that do not serialise as data: build, do not keep
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def memoized(builder: Callable[P, R]) -> Callable[P, R]:
    """`builder`, a pure function from JSON-like data to figure JSON (or None), with its
    results kept by the content of its arguments. Each call returns a fresh copy."""
    name = f"{builder.__module__}.{builder.__qualname__}"

    @functools.wraps(builder)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        key = _key(name, args, kwargs)
        if key is None:
            return builder(*args, **kwargs)
        with _figures_lock:
            text = _figures.get(key)
            if text is not None:
                _figures.move_to_end(key)
        if text is None:
            text = json.dumps(builder(*args, **kwargs))
            with _figures_lock:
                _figures[key] = text
                while len(_figures) > CACHE_FIGURES:
                    _figures.popitem(last=False)
        result: R = json.loads(text)
        return result

    return wrapper


def memoized_clear() -> None:
    """Forget every kept figure (tests that count builds start from nothing)."""
    with _figures_lock:
        _figures.clear()
