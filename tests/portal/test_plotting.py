"""Chart JSON keeps the plotly_white template while building it once per process
(portal/plotting.py; the load benchmark found the per-figure template copy was most of a
chart's cost)."""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from portal.endpoints import charts as endpoint_charts
from portal.plotting import figure_json
from portal.traffic import charts as traffic_charts
from tests.portal.test_endpoint_dashboard import _series


def _named_template_json(fig: go.Figure) -> dict[str, Any]:
    """The figure serialised the old way, with the template named in its layout."""
    named = go.Figure(fig)
    named.update_layout(template="plotly_white")
    result: dict[str, Any] = json.loads(pio.to_json(named, validate=True))
    return result


def test_figure_json_is_what_naming_the_template_gives() -> None:
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[4.0, None, 6.0], mode="lines", name="p50"))
    fig.add_hline(y=5.0, line_dash="dash", annotation_text="SLO")
    fig.update_layout(title="TTFT", height=320, yaxis_title="ms")
    assert figure_json(fig) == _named_template_json(fig)
    white = _named_template_json(go.Figure())["layout"]["template"]
    # The real template, not an empty one: plotly_white's white plot background.
    assert white["layout"]["plot_bgcolor"] == "white"


def test_each_figure_gets_its_own_copy_of_the_template() -> None:
    first = figure_json(go.Figure(go.Bar(x=[1], y=[2])))
    first["layout"]["template"]["layout"]["plot_bgcolor"] = "black"
    second = figure_json(go.Figure(go.Bar(x=[1], y=[2])))
    assert second["layout"]["template"]["layout"]["plot_bgcolor"] == "white"


def test_the_apps_charts_are_drawn_in_plotly_white() -> None:
    white = _named_template_json(go.Figure())["layout"]["template"]
    length = traffic_charts.length_figure({"bin_edges": [0.0, 64.0, 128.0], "counts": [3, 5]}, "input")
    ttft = endpoint_charts.ttft_figure(_series(), {"ttft_p50_ms": 600.0, "ttft_p95_ms": 1500.0})
    for figure in (length, ttft):
        assert figure["layout"]["template"] == white
    assert length["data"][0]["y"] == [3, 5] and length["layout"]["height"] == 320
