"""Chart JSON keeps the plotly_white template while building it once per process, and figures
are kept by the content of their inputs, so endpoint polls within one scrape step share them
(portal/plotting.py; found by benchmarks/portal_load.py: building Plotly figures was most of
the profile, report and endpoint pages' time)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from portal.endpoints import charts as endpoint_charts
from portal.endpoints import selectors
from portal.plotting import figure_json, memoized, memoized_clear
from portal.traffic import charts as traffic_charts
from tests.factories import chart_series, deployed_endpoint, metric_snapshot


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
    ttft = endpoint_charts.ttft_figure(chart_series(), {"ttft_p50_ms": 600.0, "ttft_p95_ms": 1500.0})
    for figure in (length, ttft):
        assert figure["layout"]["template"] == white
    assert length["data"][0]["y"] == [3, 5] and length["layout"]["height"] == 320


# --- Figures kept by the content of their inputs ------------------------------------------------


@pytest.fixture(autouse=True)
def _no_kept_figures() -> None:
    # Another test in this process may have drawn an identical figure (an empty history chart).
    memoized_clear()


def test_a_memoized_builder_builds_once_per_content_and_returns_copies() -> None:
    calls: list[Any] = []

    @memoized
    def figure(series: dict[str, Any], title: str) -> dict[str, Any]:
        calls.append(series)
        return {"data": [{"y": list(series["y"])}], "layout": {"title": title}}

    first = figure({"y": [1.0, None], "at": datetime(2026, 12, 1, tzinfo=UTC)}, "TTFT")
    again = figure({"at": datetime(2026, 12, 1, tzinfo=UTC), "y": [1.0, None]}, "TTFT")
    assert len(calls) == 1 and again == first == {"data": [{"y": [1.0, None]}], "layout": {"title": "TTFT"}}
    again["data"][0]["y"].append(9.0)  # a caller's change stays in its copy
    assert figure({"y": [1.0, None], "at": datetime(2026, 12, 1, tzinfo=UTC)}, "TTFT") == first
    figure({"y": [1.0, 2.0], "at": datetime(2026, 12, 1, tzinfo=UTC)}, "TTFT")
    figure({"y": [1.0, None], "at": datetime(2026, 12, 1, 0, 0, 15, tzinfo=UTC)}, "TTFT")
    assert len(calls) == 3  # other values, another moment: built again


def test_arguments_that_are_not_data_are_never_keyed() -> None:
    calls: list[Any] = []

    class Thing:
        def __str__(self) -> str:
            return "same text"

    @memoized
    def figure(thing: Any) -> dict[str, Any]:
        calls.append(thing)
        return {"data": []}

    figure(Thing())
    figure(Thing())
    assert len(calls) == 2


def test_the_dashboard_moment_rounds_up_to_the_scrape_step() -> None:
    base = datetime(2026, 12, 1, 7, 0, 0, tzinfo=UTC)
    assert selectors.dashboard_now(base) == base
    for seconds in (0.001, 7.5, 14.999):
        assert selectors.dashboard_now(base + timedelta(seconds=seconds)) == base + timedelta(seconds=15)
    assert selectors.dashboard_now(base + timedelta(seconds=15.2)) == base + timedelta(seconds=30)


@pytest.mark.django_db
def test_polls_within_one_scrape_step_share_the_endpoint_charts(  # type: ignore[no-untyped-def]
    alice, alice_org, monkeypatch
) -> None:
    endpoint = deployed_endpoint(alice_org, alice)
    start = datetime(2026, 12, 1, 7, 0, 0, tzinfo=UTC)
    for minutes in range(1, 30):
        metric_snapshot(endpoint, start - timedelta(minutes=minutes), p50=300.0 + minutes)
    metric_snapshot(endpoint, start + timedelta(seconds=2), p50=777.0)  # the scrape just before the polls
    built: list[dict[str, Any]] = []
    real = endpoint_charts.figure_json

    def counting(fig: go.Figure) -> dict[str, Any]:
        built.append(real(fig))
        return built[-1]

    monkeypatch.setattr(endpoint_charts, "figure_json", counting)

    def poll(at: datetime) -> list[dict[str, Any]]:
        now = selectors.dashboard_now(at)
        return endpoint_charts.dashboard_figures(
            selectors.endpoint_dashboard(endpoint=endpoint, range_name="1h", now=now)
        )

    first = poll(start + timedelta(seconds=3))
    assert len(built) == 5
    p50 = next(t for t in first[0]["figure"]["data"] if t["name"] == "p50 TTFT")
    assert p50["y"][-1] == 777.0  # rounding up never leaves out the newest scrape
    assert poll(start + timedelta(seconds=11)) == first and len(built) == 5  # same step: nothing rebuilt
    metric_snapshot(endpoint, start + timedelta(seconds=17), p50=555.0)
    later = poll(start + timedelta(seconds=18))
    # The next step: the live charts (TTFT, rates, prefix cache) again; SLA and history unchanged.
    assert len(built) == 8
    assert next(t for t in later[0]["figure"]["data"] if t["name"] == "p50 TTFT")["y"][-1] == 555.0
