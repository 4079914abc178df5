"""Figure JSON for the pages' Plotly charts, shared by every app's `charts.py`.

Every figure is drawn in the `plotly_white` template. Naming the template in each figure's
layout made plotly copy and validate the whole template on every `update_layout`, which was
most of a figure's build time (measured with benchmarks/portal_load.py: ~80% of a chart, and
the profile, report and endpoint pages draw four to six each on every request). The template
is serialised once per process instead and attached to each figure's JSON: the output is
the same.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "plotly_white"


@functools.cache
def _template_json(name: str) -> str:
    figure: dict[str, Any] = json.loads(pio.to_json(go.Figure(layout={"template": name}), validate=True))
    return json.dumps(figure["layout"]["template"])


def figure_json(fig: go.Figure, *, template: str = TEMPLATE) -> dict[str, Any]:
    """The figure as plotly.js reads it, in `template` (do not set a template on `fig`)."""
    result: dict[str, Any] = json.loads(pio.to_json(fig, validate=True))
    # A fresh copy per figure: callers may adjust a figure's layout after building it.
    result.setdefault("layout", {})["template"] = json.loads(_template_json(template))
    return result
