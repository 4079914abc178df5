"""Plotly figures for the endpoint page: pure functions from `selectors.endpoint_dashboard` data to
figure JSON.

Every function returns a figure, an empty one included (it says why in the middle): the page
keeps its chart elements across the 15-second htmx refresh and `static/js/live_charts.js`
updates them in place, so an element must always have something to draw. Missing measurements
are `None` with `connectgaps` off: a gap is a break in the line, never a fall to zero.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from portal.plotting import figure_json, memoized

_LAYOUT: dict[str, Any] = {
    "margin": {"l": 70, "r": 70, "t": 60, "b": 50},
    "height": 340,
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
    # Kept across refreshes: a user's zoom survives Plotly.react with new data.
    "uirevision": "endpoint-dashboard",
}
_SLO_COLOR = "#d92d20"
_GAP_COLOR = "#98a2b3"
_P50_COLOR = "#1b6ef3"
_P95_COLOR = "#7a5af8"
_MET_COLOR = "#12b76a"
_BREACHED_COLOR = "#f79009"
_MAX_NOTE = 60


def _to_json(fig: go.Figure) -> dict[str, Any]:
    return figure_json(fig)  # in the plotly_white template (attached once per process)


def _short(text: str, limit: int = _MAX_NOTE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _empty_note(fig: go.Figure, text: str) -> None:
    fig.add_annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
        showarrow=False,
        font={"color": _GAP_COLOR, "size": 14},
    )


def _has_values(*columns: list[float | None]) -> bool:
    return any(v is not None for column in columns for v in column)


def _time_axis(fig: go.Figure, series: dict[str, Any]) -> None:
    fig.update_xaxes(type="date", range=[series["start"], series["end"]], title_text="time (UTC)")


def _line(series: dict[str, Any], key: str, name: str, **style: Any) -> go.Scatter:
    return go.Scatter(
        x=series["taken_at"],
        y=series[key],
        mode="lines+markers",
        name=name,
        connectgaps=False,
        marker={"size": 4},
        **style,
    )


def requests_text(count: float | None) -> str:
    """What a percentile rests on, as its hover and tables say it."""
    if count is None:
        return "requests not counted"
    return f"{count:,.0f} request{'' if round(count) == 1 else 's'}"


def _resolution(series: dict[str, Any]) -> str:
    bucket = series.get("bucket_s")
    if not bucket:
        return "each scrape"
    return f"{bucket / 60:g}-min buckets"


def _shade_gaps(fig: go.Figure, series: dict[str, Any]) -> None:
    # All at once: plotly's add_vrect re-validates every shape on each call (quadratic).
    shading = [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": span["start"],
            "x1": span["end"],
            "y0": 0,
            "y1": 1,
            "fillcolor": _GAP_COLOR,
            "opacity": 0.18,
            "line": {"width": 0},
            "layer": "below",
        }
        for span in series.get("gaps") or []
    ]
    if shading:
        fig.update_layout(shapes=[*fig.layout.shapes, *shading])


@memoized
def ttft_figure(series: dict[str, Any], slo: dict[str, Any]) -> dict[str, Any]:
    """Live p50 and p95 TTFT over time with the SLO's targets as horizontal lines."""
    fig = go.Figure()
    # Every point's percentiles state the requests they rest on (those finished in its interval).
    behind = [requests_text(n) for n in series.get("num_requests") or [None] * len(series["taken_at"])]
    for key, name, line in (
        ("ttft_p50_ms", "p50 TTFT", {"color": _P50_COLOR}),
        ("ttft_p95_ms", "p95 TTFT", {"color": _P95_COLOR, "dash": "dash"}),
    ):
        fig.add_trace(
            _line(
                series,
                key,
                name,
                line=line,
                customdata=behind,
                hovertemplate=f"%{{x}}: {name} %{{y:,.0f}} ms over %{{customdata}}<extra></extra>",
            )
        )
    for key, dash, label in (("ttft_p50_ms", "dash", "p50"), ("ttft_p95_ms", "dot", "p95")):
        limit = slo.get(key)
        if limit is not None:
            fig.add_hline(
                y=limit,
                line_dash=dash,
                line_color=_SLO_COLOR,
                annotation_text=f"SLO {label} ≤ {limit:,.0f} ms",
                annotation_position="top left",
                annotation_font_color=_SLO_COLOR,
            )
    _shade_gaps(fig, series)
    if not _has_values(series["ttft_p50_ms"], series["ttft_p95_ms"]):
        _empty_note(fig, f"No TTFT measured in the {series['range_label']}")
    bucketed = " (p50: median, p95: worst interval per bucket)" if series.get("bucket_s") else ""
    total = series.get("total_requests")
    over = f", over {requests_text(total)}" if total is not None else ""
    fig.update_layout(
        title=f"Time to first token, {series['range_label']}{over} ({_resolution(series)}{bucketed}; grey: no data)",
        yaxis_title="time to first token (ms)",
        yaxis_rangemode="tozero",
        **_LAYOUT,
    )
    _time_axis(fig, series)
    return _to_json(fig)


@memoized
def rates_figure(series: dict[str, Any]) -> dict[str, Any]:
    """Finished requests per second (left axis) and prompt/generation tokens per second (right)."""
    fig = go.Figure()
    fig.add_trace(_line(series, "requests_per_s", "requests/s", line={"color": "#1d2430"}))
    fig.add_trace(
        _line(series, "prompt_tokens_per_s", "prompt tokens/s", line={"color": _P50_COLOR}, yaxis="y2")
    )
    fig.add_trace(
        _line(
            series,
            "generation_tokens_per_s",
            "generation tokens/s",
            line={"color": _MET_COLOR},
            yaxis="y2",
        )
    )
    _shade_gaps(fig, series)
    if not _has_values(
        series["requests_per_s"], series["prompt_tokens_per_s"], series["generation_tokens_per_s"]
    ):
        _empty_note(fig, f"No traffic measured in the {series['range_label']}")
    fig.update_layout(
        title=f"Request and token rates, {series['range_label']} ({_resolution(series)})",
        yaxis={"title": {"text": "requests / s"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "tokens / s"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        **_LAYOUT,
    )
    _time_axis(fig, series)
    return _to_json(fig)


@memoized
def prefix_cache_figure(series: dict[str, Any]) -> dict[str, Any]:
    """The share of prompt tokens the engine found in its prefix cache, over time."""
    fig = go.Figure(
        _line(series, "prefix_cache_hit_rate", "prefix-cache hit rate", line={"color": _P95_COLOR})
    )
    _shade_gaps(fig, series)
    if not _has_values(series["prefix_cache_hit_rate"]):
        _empty_note(fig, f"No prefix-cache lookups in the {series['range_label']}")
    fig.update_layout(
        title=f"Prefix-cache hit rate, {series['range_label']} ({_resolution(series)})",
        yaxis_title="share of prompt tokens",
        yaxis_range=[0, 1.02],
        yaxis_tickformat=".0%",
        **_LAYOUT,
    )
    _time_axis(fig, series)
    return _to_json(fig)


@memoized
def sla_figure(compliance: dict[str, Any]) -> dict[str, Any]:
    """Compliance per window as bars (met in green, breached in orange), with the commitment
    (the compliance below which credits are owed) as a horizontal line where there is one."""
    windows = compliance["windows"]
    fig = go.Figure()
    measured = [w for w in windows if w["compliance_pct"] is not None]
    if measured:
        fig.add_trace(
            go.Bar(
                x=[w["label"] for w in windows],
                y=[w["compliance_pct"] for w in windows],
                name="compliance",
                marker={"color": [_MET_COLOR if w["status"] == "met" else _BREACHED_COLOR for w in windows]},
                text=[
                    "no data" if w["compliance_pct"] is None else f"{w['compliance_pct']:.1f}%"
                    for w in windows
                ],
                textposition="outside",
                cliponaxis=False,
                customdata=[
                    [w["status"], w["coverage_pct"] if w["coverage_pct"] is not None else 0.0]
                    for w in windows
                ],
                hovertemplate="%{x}: %{y:.2f}% (%{customdata[0]}), coverage %{customdata[1]:.0f}%<extra></extra>",
            )
        )
    else:
        _empty_note(fig, "No measured window yet" if compliance["source"] != "none" else "No target to judge")
    commitment = compliance.get("commitment_pct")
    if commitment is not None:
        fig.add_hline(
            y=commitment,
            line_dash="dash",
            line_color=_SLO_COLOR,
            annotation_text=f"commitment {commitment:g}%",
            annotation_position="bottom right",
            annotation_font_color=_SLO_COLOR,
        )
    target = compliance.get("target_ms")
    if compliance["source"] == "sla_terms":
        title = f"SLA compliance per month ({compliance['metric'][5:8]} TTFT ≤ {target:,.0f} ms)"
    elif compliance["source"] == "slo":
        title = f"SLO compliance per hour (p95 TTFT ≤ {target:,.0f} ms; no SLA terms set)"
    else:
        title = "SLA compliance (no target set)"
    fig.update_layout(
        title=title,
        xaxis_title="window (UTC)",
        xaxis_type="category",
        yaxis_title="share of measured time at target (%)",
        yaxis_range=[0, 110],
        bargap=0.3,
        **_LAYOUT,
    )
    return _to_json(fig)


def _why(row: dict[str, Any]) -> str:
    if row.get("trigger"):
        return f"loop iteration {row['iteration']}: {row['trigger']}"
    return str(row["reason"])


@memoized
def history_figure(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Each generation's measured tokens per second at the target load (bars, left axis) and p50
    TTFT (line, right axis), each annotated with what triggered it; the title is the sequence."""
    fig = go.Figure()
    labels = [f"gen {row['generation']}" for row in history]
    tokens = [row["tokens_per_s"] for row in history]
    p50 = [row["ttft_p50_ms"] for row in history]
    whys = [_why(row) for row in history]
    behind = [requests_text(row.get("num_requests")) for row in history]
    if history:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=tokens,
                name="tokens/s at the target load",
                marker={"color": [_P50_COLOR if row["serving"] else "#b2ccff" for row in history]},
                text=["not measured" if t is None else f"{t:,.0f} tok/s" for t in tokens],
                textposition="outside",
                cliponaxis=False,
                customdata=whys,
                hovertemplate="%{x}: %{y:,.0f} tok/s<br>%{customdata}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=p50,
                mode="lines+markers",
                name="p50 TTFT (ms)",
                yaxis="y2",
                connectgaps=False,
                line={"color": _P95_COLOR},
                marker={"size": 9},
                customdata=list(zip(whys, behind, strict=True)),
                hovertemplate="%{x}: p50 %{y:,.0f} ms over %{customdata[1]}<br>%{customdata[0]}<extra></extra>",
            )
        )
        for label, why in zip(labels, whys, strict=True):
            fig.add_annotation(
                x=label,
                y=0,
                yref="paper",
                yanchor="bottom",
                text=_short(why, 40),
                showarrow=False,
                textangle=0,
                font={"size": 10, "color": "#475467"},
                bgcolor="rgba(255,255,255,0.8)",
            )
    else:
        _empty_note(fig, "No generation deployed yet")
    measured = [f"{t:,.0f}" for t in tokens if t is not None]
    sequence = " → ".join(measured) + " tok/s" if len(measured) >= 2 else ""
    fig.update_layout(
        title="Optimization history" + (f": {sequence}" if sequence else " (measured by each tuning job)"),
        xaxis_title="generation (highlighted: serving now)",
        xaxis_type="category",
        yaxis={"title": {"text": "tokens / s at the target load"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "p50 TTFT (ms)"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        **_LAYOUT,
    )
    return _to_json(fig)


def dashboard_figures(data: dict[str, Any]) -> list[dict[str, Any]]:
    """`{"id": element id, "figure": figure}` in page order, what `static/js/charts.js` reads."""
    series = data["series"]
    figures = [
        ("chart-ttft", ttft_figure(series, data["slo"])),
        ("chart-rates", rates_figure(series)),
        ("chart-prefix", prefix_cache_figure(series)),
        ("chart-sla", sla_figure(data["sla"])),
        ("chart-history", history_figure(data["history"])),
    ]
    return [{"id": element_id, "figure": figure} for element_id, figure in figures]
