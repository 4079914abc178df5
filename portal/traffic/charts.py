"""Plotly figures for the profile page: pure functions from stored chart data to figure JSON.

The page ships each figure with `json_script` and `static/js/charts.js` draws it with the
plotly.js that comes with the installed `plotly` package (no CDN).
"""

from __future__ import annotations

import itertools
from typing import Any

import plotly.graph_objects as go

from portal.plotting import figure_json, memoized

_LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "height": 320,
}


def _to_json(fig: go.Figure) -> dict[str, Any]:
    return figure_json(fig)  # in the plotly_white template (attached once per process)


def _centers(edges: list[float]) -> list[float]:
    return [(a + b) / 2 for a, b in itertools.pairwise(edges)]


@memoized
def arrival_rate_figure(series: dict[str, Any]) -> dict[str, Any]:
    fig = go.Figure(
        go.Scatter(
            x=series["bin_start_s"], y=series["rate_rps"], mode="lines", name="arrival rate", line_shape="hv"
        )
    )
    fig.add_vrect(
        x0=series["peak_window_start_s"],
        x1=series["peak_window_end_s"],
        fillcolor="#f79009",
        opacity=0.25,
        line_width=0,
        annotation_text=f"peak 60 s: {series['peak_rps_60s']:.2f} req/s",
        annotation_position="top left",
    )
    fig.update_layout(
        title=f"Arrival rate ({series['bin_s']:g} s bins)",
        xaxis_title="seconds since first request",
        yaxis_title="requests / s",
        **_LAYOUT,
    )
    return _to_json(fig)


@memoized
def length_figure(histogram: dict[str, Any], what: str) -> dict[str, Any]:
    edges = list(histogram["bin_edges"])
    widths = [b - a for a, b in itertools.pairwise(edges)]
    fig = go.Figure(go.Bar(x=_centers(edges), y=histogram["counts"], width=widths, name=what))
    fig.update_layout(
        title=f"{what.capitalize()} length", xaxis_title="tokens", yaxis_title="requests", **_LAYOUT
    )
    return _to_json(fig)


@memoized
def interarrival_figure(dist: dict[str, Any]) -> dict[str, Any]:
    hist = dist["positive_gaps_s"]
    edges = list(hist["bin_edges"])
    # Log-spaced bins: bars have no sensible width on a log axis, so draw the distribution as a
    # step line through each bin's geometric centre.
    centers = [(a * b) ** 0.5 if a > 0 else b for a, b in itertools.pairwise(edges)]
    fig = go.Figure(
        go.Scatter(
            x=centers, y=hist["counts"], mode="lines+markers", line_shape="hvh", fill="tozeroy", name="gaps"
        )
    )
    fig.update_layout(
        title=f"Inter-arrival gaps ({dist['num_zero_gaps']:,} simultaneous arrivals not shown)",
        xaxis_title="seconds (log)",
        xaxis_type="log",
        yaxis_title="gaps",
        **_LAYOUT,
    )
    return _to_json(fig)


@memoized
def reuse_curve_figure(curve: dict[str, Any]) -> dict[str, Any]:
    block = curve["block_size_tokens"]
    x = [n * block for n in curve["cache_size_blocks"]]
    fig = go.Figure(go.Scatter(x=x, y=curve["hit_ratio"], mode="lines+markers", name="hit ratio"))
    covered = (
        ""
        if curve["num_requests_used"] >= curve["num_requests_total"]
        else f" (first {curve['num_requests_used']:,} of {curve['num_requests_total']:,} requests)"
    )
    fig.update_layout(
        title=f"Prefix-cache hit ratio vs LRU cache size{covered}",
        xaxis_title="cache size (tokens, log)",
        xaxis_type="log",
        yaxis_title="share of prompt tokens",
        yaxis_range=[0, 1],
        **_LAYOUT,
    )
    return _to_json(fig)


@memoized
def concurrency_figure(series: dict[str, Any]) -> dict[str, Any]:
    fig = go.Figure(
        go.Scatter(
            x=series["bin_start_s"],
            y=series["max_in_flight"],
            mode="lines",
            line_shape="hv",
            name="in flight",
        )
    )
    fig.update_layout(
        title=(
            "Estimated concurrency (assuming "
            f"{series['prefill_tokens_per_s']:,.0f} prefill tok/s, "
            f"{1000 * series['decode_s_per_token']:.0f} ms/output token)"
        ),
        xaxis_title="seconds since first request",
        yaxis_title="requests in flight",
        **_LAYOUT,
    )
    return _to_json(fig)


def profile_figures(charts: dict[str, Any]) -> list[dict[str, Any]]:
    """`{"id": element id, "figure": figure}` in page order; the reuse curve only where known."""
    figures = [
        ("chart-arrival", arrival_rate_figure(charts["arrival_rate"])),
        ("chart-input", length_figure(charts["input_tokens"], "input")),
        ("chart-output", length_figure(charts["output_tokens"], "output")),
        ("chart-interarrival", interarrival_figure(charts["interarrival"])),
    ]
    if charts.get("reuse_curve"):
        figures.append(("chart-reuse", reuse_curve_figure(charts["reuse_curve"])))
    figures.append(("chart-concurrency", concurrency_figure(charts["concurrency"])))
    return [{"id": element_id, "figure": figure} for element_id, figure in figures]
