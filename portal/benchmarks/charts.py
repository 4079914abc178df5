"""Plotly figures for a benchmark report: pure functions from `selectors.benchmark_report_view`.

Every figure takes the view's `targets` and `levels` (plain dicts and numbers) and returns figure
JSON; the page ships them with `json_script` and `static/js/charts.js` draws them with the
plotly.js of the installed `plotly` package (no CDN). Each target keeps one colour throughout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from portal.benchmarks.measure import CDF_POINTS, ERROR_KINDS
from portal.benchmarks.measure import level_label as measure_level_label
from portal.plotting import figure_json

_LAYOUT: dict[str, Any] = {
    "margin": {"l": 70, "r": 20, "t": 60, "b": 60},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.22},
}
COLOURS = ("#1b6ef3", "#f79009", "#067647", "#b42318")
_CDF_LEVELS = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
_METRICS = {
    "ttft": ("TTFT", "time to first token (ms)"),
    "tpot": ("TPOT", "time per output token after the first (ms)"),
}

View = Mapping[str, Any]


def _to_json(fig: go.Figure) -> dict[str, Any]:
    return figure_json(fig)  # in the plotly_white template (attached once per process)


def colour(position: int) -> str:
    return COLOURS[position % len(COLOURS)]


def level_label(level: Mapping[str, Any]) -> str:
    return measure_level_label(level["multiplier"], level["rate_rps"])


def _nothing_note(fig: go.Figure, names: Sequence[str], what: str) -> None:
    if names:
        fig.add_annotation(
            text=f"{what}: {', '.join(names)}",
            xref="paper",
            yref="paper",
            x=0,
            y=1.0,
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            font={"color": "#b42318"},
        )


def cdf_figure(view: View, level_index: int, metric: str) -> dict[str, Any]:
    """The `metric` ("ttft" or "tpot") CDF of every target at one load level."""
    short, axis = _METRICS[metric]
    level = view["levels"][level_index]
    fig = go.Figure()
    missing = []
    for position, row in enumerate(level["rows"]):
        target, cell = row["target"], row["cell"]
        points = (cell or {}).get(f"{metric}_cdf_ms") or []
        if not points:
            missing.append(target["name"])
            continue
        fig.add_trace(
            go.Scatter(
                x=points,
                y=_CDF_LEVELS,
                mode="lines",
                name=target["name"],
                line={"color": colour(position)},
                hovertemplate=f"%{{x:.0f}} ms: %{{y:.0%}} of requests<extra>{target['name']}</extra>",
            )
        )
    _nothing_note(fig, missing, "No successful requests")
    fig.update_layout(
        title=f"{short} CDF at {level_label(level)}",
        xaxis_title=axis,
        yaxis_title="share of successful requests ≤ x",
        yaxis_range=[0, 1],
        yaxis_tickformat=".0%",
        **_LAYOUT,
    )
    return _to_json(fig)


def _ci_bars(values: list[float | None], intervals: list[Any]) -> dict[str, Any]:
    plus: list[float | None] = []
    minus: list[float | None] = []
    for value, ci in zip(values, intervals, strict=True):
        if value is None or not ci:
            plus.append(None)
            minus.append(None)
        else:
            plus.append(max(0.0, ci[1] - value))
            minus.append(max(0.0, value - ci[0]))
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "visible": True}


def latency_vs_load_figure(view: View) -> dict[str, Any]:
    """p50 and p95 TTFT of every target against the offered rate, with bootstrap 95 % CIs."""
    rates = [level["rate_rps"] for level in view["levels"]]
    fig = go.Figure()
    for position, target in enumerate(view["targets"]):
        cells = [level["rows"][position]["cell"] or {} for level in view["levels"]]
        for pct, dash, symbol in (("p50", "solid", "circle"), ("p95", "dash", "diamond")):
            values = [(c.get("ttft_ms") or {}).get(pct) for c in cells]
            if all(v is None for v in values):
                continue
            fig.add_trace(
                go.Scatter(
                    x=rates,
                    y=values,
                    mode="lines+markers",
                    name=f"{target['name']} {pct}",
                    line={"color": colour(position), "dash": dash},
                    marker={"symbol": symbol, "size": 8},
                    error_y=_ci_bars(values, [c.get(f"ttft_{pct}_ci_ms") for c in cells]),
                    hovertemplate=f"%{{x:.2f}} req/s: %{{y:.0f}} ms<extra>{target['name']} {pct}</extra>",
                )
            )
    fig.update_layout(
        title="TTFT vs offered load (p50 solid, p95 dashed; bars: 95% bootstrap CI)",
        xaxis_title="offered load (requests/s)",
        yaxis_title="TTFT (ms)",
        yaxis_rangemode="tozero",
        **_LAYOUT,
    )
    return _to_json(fig)


def throughput_figure(view: View) -> dict[str, Any]:
    """Output tokens per second each target delivered at each offered rate."""
    rates = [level["rate_rps"] for level in view["levels"]]
    fig = go.Figure()
    for position, target in enumerate(view["targets"]):
        cells = [level["rows"][position]["cell"] or {} for level in view["levels"]]
        fig.add_trace(
            go.Scatter(
                x=rates,
                y=[c.get("output_throughput_tps") for c in cells],
                customdata=[c.get("request_throughput_rps") for c in cells],
                mode="lines+markers",
                name=target["name"],
                line={"color": colour(position)},
                hovertemplate=(
                    "%{x:.2f} req/s offered: %{y:.0f} output tok/s, %{customdata:.2f} req/s completed"
                    f"<extra>{target['name']}</extra>"
                ),
            )
        )
    fig.update_layout(
        title="Throughput vs offered load",
        xaxis_title="offered load (requests/s)",
        yaxis_title="output tokens / s",
        yaxis_rangemode="tozero",
        **_LAYOUT,
    )
    return _to_json(fig)


def _bars(view: View, key: str) -> tuple[go.Figure, list[str]]:
    labels = [level_label(level) for level in view["levels"]]
    fig = go.Figure()
    without = []
    for position, target in enumerate(view["targets"]):
        cells = [level["rows"][position]["cell"] or {} for level in view["levels"]]
        values = [c.get(key) for c in cells]
        if all(v is None for v in values):
            without.append(target["name"])
        fig.add_trace(go.Bar(x=labels, y=values, name=target["name"], marker_color=colour(position)))
    fig.update_layout(barmode="group", **_LAYOUT)
    return fig, without


def cost_figure(view: View) -> dict[str, Any]:
    """USD per million tokens (prompt + output) of every target at each load level."""
    fig, without = _bars(view, "cost_per_mtok_usd")
    for trace in fig.data:
        # Labels only on bars that exist (a text template would print $0 for a missing one).
        trace.text = ["" if y is None else f"${y:,.3f}" for y in trace.y]
        trace.textposition = "outside"
    _nothing_note(fig, without, "No tokens served, so no cost")
    fig.update_layout(
        title="Cost per million tokens (prompt + output)",
        xaxis_title="load level",
        yaxis_title="USD per 1M tokens",
        yaxis_tickprefix="$",
    )
    return _to_json(fig)


def error_rate_figure(view: View) -> dict[str, Any]:
    """Share of requests that failed, per target and level; the hover names the kinds."""
    fig, _ = _bars(view, "error_rate")
    for trace, (position, _target) in zip(fig.data, enumerate(view["targets"]), strict=True):
        cells = [level["rows"][position]["cell"] or {} for level in view["levels"]]
        trace.hovertext = [
            ", ".join(f"{n} {ERROR_KINDS.get(k, k)}" for k, n in (c.get("errors") or {}).items()) or "none"
            for c in cells
        ]
        trace.hovertemplate = "%{y:.0%} failed: %{hovertext}<extra>%{fullData.name}</extra>"
    fig.update_layout(
        title="Failed requests",
        xaxis_title="load level",
        yaxis_title="share of requests",
        yaxis_range=[0, 1],
        yaxis_tickformat=".0%",
    )
    return _to_json(fig)


def report_figures(view: View) -> list[dict[str, Any]]:
    """`{"id": element id, "figure": figure}` in page order (empty before any result)."""
    if not view["levels"] or not any(row["cell"] for level in view["levels"] for row in level["rows"]):
        return []
    figures = [
        ("chart-latency-load", latency_vs_load_figure(view)),
        ("chart-throughput", throughput_figure(view)),
        ("chart-cost", cost_figure(view)),
        ("chart-errors", error_rate_figure(view)),
    ]
    for index in range(len(view["levels"])):
        figures.append((f"chart-ttft-cdf-{index}", cdf_figure(view, index, "ttft")))
        figures.append((f"chart-tpot-cdf-{index}", cdf_figure(view, index, "tpot")))
    return [{"id": element_id, "figure": figure} for element_id, figure in figures]
