"""Plotly figures for the job report: pure functions from `selectors.job_report_data` to figure JSON.

Each function takes plain data and returns a figure (a JSON-ready dict), or None when there is
nothing to draw; `report_sections` pairs every figure with its heading and, where it is absent,
the sentence the page shows instead. The portal page ships the figures with `json_script` to
`static/js/charts.js`; the downloadable file inlines the same JSON, script and plotly.js.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from portal.plotting import figure_json, memoized

_LAYOUT: dict[str, Any] = {
    "margin": {"l": 70, "r": 20, "t": 60, "b": 50},
    "height": 420,
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
}
_SLO_COLOR = "#d92d20"
_GUIDE_COLOR = "#98a2b3"
_PALETTE = qualitative.Plotly
_MAX_LABEL = 48
# A prediction further than this from its measurement (as a share of the measurement) is flagged.
PREDICTION_MISS_SHARE = 0.5


def prediction_miss(predicted_ms: float | None, measured_ms: float | None) -> float | None:
    """How far a prediction is from the measurement, as a share of the measurement."""
    if predicted_ms is None or not measured_ms:
        return None
    return abs(predicted_ms - measured_ms) / measured_ms


def _to_json(fig: go.Figure) -> dict[str, Any]:
    return figure_json(fig)  # in the plotly_white template (attached once per process)


def _color(number: int) -> str:
    # The same trial has the same colour on every chart of the report.
    return str(_PALETTE[number % len(_PALETTE)])


def _name(trial: dict[str, Any]) -> str:
    label = trial["label"]
    short = label if len(label) <= _MAX_LABEL else label[: _MAX_LABEL - 1] + "…"
    role = " (winner)" if trial.get("is_winner") else ""
    return f"#{trial['number']} {short}{role}"


def _requests(count: int | None) -> str:
    return "requests not recorded" if count is None else f"{count:,} requests"


def _slo_vlines(fig: go.Figure, slo: dict[str, float | None]) -> None:
    for key, dash, position in (("ttft_p50_ms", "dash", "top left"), ("ttft_p95_ms", "dot", "top right")):
        limit = slo.get(key)
        if limit is not None:
            fig.add_vline(
                x=limit,
                line_dash=dash,
                line_color=_SLO_COLOR,
                annotation_text=f"SLO {key[5:8]} ≤ {limit:,.0f} ms",
                annotation_position=position,
                annotation_font_color=_SLO_COLOR,
            )


def _slo_hlines(fig: go.Figure, slo: dict[str, float | None]) -> None:
    # Labels at the right end, p50's below its line and p95's above: the load chart's target
    # line stands at the left (the first step is the target rate), and close SLOs stay apart.
    for key, dash, position in (("ttft_p50_ms", "dash", "bottom right"), ("ttft_p95_ms", "dot", "top right")):
        limit = slo.get(key)
        if limit is not None:
            fig.add_hline(
                y=limit,
                line_dash=dash,
                line_color=_SLO_COLOR,
                annotation_text=f"SLO {key[5:8]} ≤ {limit:,.0f} ms",
                annotation_position=position,
                annotation_font_color=_SLO_COLOR,
            )


@memoized
def ttft_cdf_figure(trials: list[dict[str, Any]], slo: dict[str, float | None]) -> dict[str, Any] | None:
    """Cumulative share of requests by TTFT at the target rate, one line per successful trial.

    A trial recorded before results carried a TTFT sample is drawn as its two known points
    (p50 at 0.5, p95 at 0.95) rather than left out.
    """
    fig = go.Figure()
    for trial in trials:
        if not trial.get("ok"):
            continue
        sample = trial.get("ttft_sample_ms") or []
        width = 3 if trial.get("is_winner") else 1.5
        if len(sample) >= 2:
            # The i-th of n sorted values sits at share i/(n-1): see tuning.search.trial.ttft_sample.
            share = [i / (len(sample) - 1) for i in range(len(sample))]
            fig.add_trace(
                go.Scatter(
                    x=sample,
                    y=share,
                    mode="lines",
                    name=_name(trial),
                    line={"color": _color(trial["number"]), "width": width},
                    hovertemplate="%{x:,.0f} ms: %{y:.0%} of "
                    + _requests(trial.get("num_requests"))
                    + "<extra>"
                    + _name(trial)
                    + "</extra>",
                )
            )
        elif trial.get("ttft_p50_ms") is not None and trial.get("ttft_p95_ms") is not None:
            fig.add_trace(
                go.Scatter(
                    x=[trial["ttft_p50_ms"], trial["ttft_p95_ms"]],
                    y=[0.5, 0.95],
                    mode="markers+lines",
                    line={"color": _color(trial["number"]), "width": width, "dash": "dot"},
                    name=_name(trial) + " (p50/p95 only)",
                )
            )
    if not fig.data:
        return None
    for guide in (0.5, 0.95):
        fig.add_hline(y=guide, line_dash="dot", line_color=_GUIDE_COLOR, line_width=1)
    _slo_vlines(fig, slo)
    fig.update_layout(
        title="TTFT distribution at the target load, per candidate",
        xaxis_title="time to first token (ms)",
        yaxis_title="share of requests",
        yaxis_range=[0, 1.02],
        yaxis_tickformat=".0%",
        **_LAYOUT,
    )
    return _to_json(fig)


@memoized
def latency_vs_load_figure(
    curves: list[dict[str, Any]], slo: dict[str, float | None], target_rps: float
) -> dict[str, Any] | None:
    """p50 and p95 TTFT against the offered request rate, for each curve given (the winner and
    the baseline). Each curve is `{"role", "trial": report row}`; a point that missed the SLO is
    drawn as a cross: the last one is where that configuration saturated."""
    fig = go.Figure()
    missed = False
    for curve in curves:
        trial = curve["trial"]
        points = [p for p in trial.get("load_curve") or [] if p.get("ttft_p50_ms") is not None]
        if not points:
            continue
        missed = missed or not all(p["slo_met"] for p in points)
        rates = [p["rate_rps"] for p in points]
        symbols = ["circle" if p["slo_met"] else "x" for p in points]
        who = f"{curve['role']} #{trial['number']}"
        for key, dash in (("ttft_p50_ms", "solid"), ("ttft_p95_ms", "dash")):
            fig.add_trace(
                go.Scatter(
                    x=rates,
                    y=[p[key] for p in points],
                    mode="lines+markers",
                    name=f"{who} {key[5:8]}",
                    line={"color": _color(trial["number"]), "dash": dash},
                    marker={"symbol": symbols, "size": 9},
                    # How many requests each percentile rests on.
                    customdata=[_requests(p.get("num_requests")) for p in points],
                    hovertemplate="%{x:.2f} req/s: %{y:,.0f} ms (%{customdata})<extra>"
                    + f"{who} {key[5:8]} ({trial['label']})</extra>",
                )
            )
    if not fig.data:
        return None
    _slo_hlines(fig, slo)
    fig.add_vline(
        x=target_rps,
        line_dash="dot",
        line_color=_GUIDE_COLOR,
        annotation_text=f"target {target_rps:.2f} req/s",
        annotation_position="top right",
    )
    fig.update_layout(
        # Promise crosses only when some point is drawn as one.
        title="TTFT against request rate"
        + (" (crosses missed the SLO)" if missed else ", every step within the SLO"),
        xaxis_title="request rate (req/s)",
        yaxis_title="time to first token (ms)",
        **_LAYOUT,
    )
    return _to_json(fig)


def _gates_passed(trial: dict[str, Any]) -> bool:
    verdicts = trial.get("gates") or {}
    return bool(verdicts.get("correctness_passed") and verdicts.get("reliability_passed"))


@memoized
def cost_vs_ttft_figure(trials: list[dict[str, Any]], slo: dict[str, float | None]) -> dict[str, Any] | None:
    """Cost per million tokens against p95 TTFT for every trial with a cost, the Pareto frontier
    (trials that passed the gates and no other such trial beats on both) joined by a line, trials
    a gate rejected crossed out, and the winner starred."""
    measured = [
        t
        for t in trials
        if t.get("ok") and t.get("cost_per_mtok_usd") is not None and t.get("ttft_p95_ms") is not None
    ]
    if not measured:
        return None
    fig = go.Figure()
    rejected = [t for t in measured if not _gates_passed(t)]
    off = [t for t in measured if _gates_passed(t) and not t.get("is_pareto")]
    front = sorted((t for t in measured if t.get("is_pareto")), key=lambda t: t["ttft_p95_ms"])

    def scatter(rows: list[dict[str, Any]], name: str, **style: Any) -> go.Scatter:
        return go.Scatter(
            x=[t["ttft_p95_ms"] for t in rows],
            y=[t["cost_per_mtok_usd"] for t in rows],
            text=[f"#{t['number']}" for t in rows],
            customdata=[t["label"] for t in rows],
            textposition="top center",
            name=name,
            hovertemplate="%{text} %{customdata}<br>p95 %{x:,.0f} ms, $%{y:.4f}/Mtok<extra></extra>",
            **style,
        )

    if off:
        fig.add_trace(
            scatter(off, "other trials", mode="markers+text", marker={"color": _GUIDE_COLOR, "size": 10})
        )
    if rejected:
        fig.add_trace(
            scatter(
                rejected,
                "rejected by a gate",
                mode="markers+text",
                marker={"symbol": "x", "color": _SLO_COLOR, "size": 10},
            )
        )
    if front:
        fig.add_trace(
            scatter(
                front,
                "Pareto frontier",
                mode="lines+markers+text",
                line={"color": "#1b6ef3", "shape": "hv"},
                marker={"color": "#1b6ef3", "size": 11},
            )
        )
    winners = [t for t in measured if t.get("is_winner")]
    if winners:
        fig.add_trace(
            scatter(
                winners,
                "winner",
                mode="markers",
                marker={
                    "symbol": "star",
                    "size": 20,
                    "color": "#f79009",
                    "line": {"width": 1, "color": "#1d2430"},
                },
            )
        )
    limit = slo.get("ttft_p95_ms")
    if limit is not None:
        fig.add_vline(
            x=limit,
            line_dash="dot",
            line_color=_SLO_COLOR,
            annotation_text=f"SLO p95 ≤ {limit:,.0f} ms",
            annotation_position="top right",
            annotation_font_color=_SLO_COLOR,
        )
    fig.update_layout(
        title="Cost against p95 TTFT (lower left is better)",
        xaxis_title="p95 TTFT at the target load (ms)",
        yaxis_title="cost per million tokens (USD)",
        # Neither can be negative; plotly's autorange around a single point would go below zero.
        xaxis_rangemode="tozero",
        yaxis_rangemode="tozero",
        **_LAYOUT,
    )
    return _to_json(fig)


@memoized
def predicted_vs_measured_figure(trials: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The simulator's predicted p50/p95 TTFT against what the live trial measured, for trials
    that carry a prediction; on the diagonal the prediction was exact."""
    rows = [
        t
        for t in trials
        if t.get("ok")
        and t.get("predicted")
        and t.get("ttft_p50_ms") is not None
        and t.get("ttft_p95_ms") is not None
    ]
    pairs = {
        key: [(t, t[key], t["predicted"][key]) for t in rows if t["predicted"].get(key) is not None]
        for key in ("ttft_p50_ms", "ttft_p95_ms")
    }
    if not any(pairs.values()):
        return None
    fig = go.Figure()
    top = 0.0
    flagged = 0
    for key, symbol in (("ttft_p50_ms", "circle"), ("ttft_p95_ms", "diamond")):
        points = pairs[key]
        if not points:
            continue
        top = max(top, *(max(m, p) for _, m, p in points))
        misses = [prediction_miss(p, m) or 0.0 for _, m, p in points]
        off = [miss > PREDICTION_MISS_SHARE for miss in misses]
        flagged += sum(off)
        fig.add_trace(
            go.Scatter(
                x=[m for _, m, _ in points],
                y=[p for _, _, p in points],
                mode="markers",
                name=f"{key[5:8]} TTFT",
                marker={
                    "symbol": symbol,
                    "size": 11,
                    "color": [_color(t["number"]) for t, _, _ in points],
                    # A prediction off by more than half the measurement is ringed in red.
                    "line": {"width": [3 if o else 0 for o in off], "color": _SLO_COLOR},
                },
                text=[
                    f"#{t['number']} {t['label']} ({t['predicted'].get('source', 'simulator')})"
                    + (f": off by {miss:.0%}" if o else "")
                    for (t, _, _), miss, o in zip(points, misses, off, strict=True)
                ],
                hovertemplate="%{text}<br>measured %{x:,.0f} ms, predicted %{y:,.0f} ms<extra></extra>",
            )
        )
    top *= 1.1
    fig.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            mode="lines",
            name="prediction = measurement",
            line={"color": _GUIDE_COLOR, "dash": "dash"},
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title="Simulator prediction against the live measurement"
        + (
            f" ({flagged} off by more than {PREDICTION_MISS_SHARE:.0%}, ringed in red)"
            if flagged
            else f" (all within {PREDICTION_MISS_SHARE:.0%})"
        ),
        xaxis_title="measured TTFT (ms)",
        yaxis_title="predicted TTFT (ms)",
        xaxis_range=[0, top],
        yaxis_range=[0, top],
        **_LAYOUT,
    )
    return _to_json(fig)


def report_sections(data: dict[str, Any], *, priced: bool = True) -> list[dict[str, Any]]:
    """The report's charts in page order: `{"id", "title", "figure", "empty"}`, where `figure`
    is None and `empty` says why when there is nothing to draw. On hardware that is not priced
    every cost is 0: no cost chart."""
    trials = data["trials"]
    slo = data["slo"]
    curves = []
    primary = data.get("winner") or data.get("best_achievable")
    if primary is not None:
        curves.append({"role": "winner" if primary.get("is_winner") else "closest", "trial": primary})
    baseline = data.get("baseline")
    if baseline is not None and (primary is None or baseline["number"] != primary["number"]):
        curves.append({"role": "baseline", "trial": baseline})
    sections = [
        (
            "chart-ttft-cdf",
            "TTFT distribution per candidate",
            ttft_cdf_figure(trials, slo),
            "No trial measured any TTFT.",
        ),
        (
            "chart-latency-load",
            "Latency against load: winner and baseline",
            latency_vs_load_figure(curves, slo, data["target_rps"]),
            "No winner or baseline trial measured a latency curve.",
        ),
        (
            "chart-cost",
            "Cost per million tokens against p95 TTFT",
            cost_vs_ttft_figure(trials, slo) if priced else None,
            "No trial has a cost: a cost is measured only for trials that met the SLO."
            if priced
            else "The hardware is not priced (an admin may set a price in the catalog), so no trial has a cost.",
        ),
        (
            "chart-predicted",
            "Predicted against measured TTFT",
            predicted_vs_measured_figure(trials),
            "No simulator prediction was recorded for these trials.",
        ),
    ]
    return [
        {"id": element_id, "title": title, "figure": figure, "empty": None if figure else empty}
        for element_id, title, figure, empty in sections
    ]


def plotly_payload(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `static/js/charts.js` reads: only the charts that have a figure."""
    return [{"id": s["id"], "figure": s["figure"]} for s in sections if s["figure"] is not None]
