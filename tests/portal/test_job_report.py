"""The job report: chart content from hand-made trial results, the pages and their tenancy, the
offline HTML download, the PDF, a job with nothing to show, and the page drawn in Chromium."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from portal.jobs import charts, selectors
from portal.jobs.models import Trial, TuningJob
from tests.conftest import PASSWORD
from tests.portal.job_rows import (
    NONE,
    TARGET_RPS,
    TRIALS,
    failed_trial_result,
    report_job_with,
)
from tuning.search.trial import ttft_sample


@pytest.fixture
def report_job(alice, alice_org) -> TuningJob:  # type: ignore[no-untyped-def]
    return report_job_with(alice_org, alice, TRIALS)


def _trace(figure: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [t for t in figure["data"] if t.get("name") == name]
    assert len(matches) == 1, [t.get("name") for t in figure["data"]]
    return matches[0]


def _vlines(figure: dict[str, Any]) -> set[float]:
    return {
        s["x0"]
        for s in figure["layout"].get("shapes", [])
        if s.get("x0") == s.get("x1") and s.get("yref") != "y"
    }


def _hlines(figure: dict[str, Any]) -> set[float]:
    return {
        s["y0"]
        for s in figure["layout"].get("shapes", [])
        if s.get("y0") == s.get("y1") and s.get("xref") != "x"
    }


def _annotations(figure: dict[str, Any]) -> list[str]:
    return [a["text"] for a in figure["layout"].get("annotations", [])]


# --- The trial result's sample ----------------------------------------------------------------


def test_ttft_sample_keeps_small_runs_whole_and_quantiles_of_large_ones() -> None:
    assert ttft_sample([30.0, 10.0, 20.0]) == (10.0, 20.0, 30.0)
    values = [float(v) for v in range(10_001)]  # 0..10000
    sample = ttft_sample(values)
    assert len(sample) == 500
    assert sample[0] == 0.0 and sample[-1] == 10_000.0
    assert list(sample) == sorted(sample)
    # The i-th point is the i/(n-1) quantile: the median sits in the middle.
    assert sample[249] == pytest.approx(10_000 * 249 / 499)


# --- Charts from the selector's data -----------------------------------------------------------


@pytest.mark.django_db
def test_report_data_marks_winner_baseline_and_frontier(report_job) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    assert data["target_rps"] == pytest.approx(TARGET_RPS)
    assert data["slo"] == {"ttft_p50_ms": 600.0, "ttft_p95_ms": 1500.0, "tpot_p50_ms": None}
    assert data["winner"]["number"] == 2
    assert data["baseline"]["number"] == 1 and data["baseline_kind"] == "defaults"
    assert data["num_successful"] == 5
    assert {t["number"] for t in data["trials"] if t["is_pareto"]} == {2, 3}
    assert data["selection"]["winner_reason"].startswith("winner: lowest cost per million tokens ($1.2000)")
    by_number = {t["number"]: t for t in data["trials"]}
    assert by_number[5]["state"] == "failed" and by_number[5]["load_curve"] == []
    # Capacity steps become the latency-vs-load curve, up to the first step that broke the SLO.
    assert [(p["rate_rps"], p["slo_met"]) for p in by_number[0]["load_curve"]] == [
        (2.5, True),
        (3.75, True),
        (5.0, False),
    ]
    assert by_number[1]["gates"]["thresholds_assumed"] and not by_number[0]["gates"]["thresholds_assumed"]
    assert by_number[4]["gates"]["max_mean_kl"] == 0.05 and by_number[0]["gates"]["max_mean_kl"] is None


@pytest.mark.django_db
def test_ttft_cdf_has_one_line_per_candidate_and_the_slo_lines(report_job) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    figure = charts.ttft_cdf_figure(data["trials"], data["slo"])
    assert figure is not None
    names = [t["name"] for t in figure["data"]]
    assert names == [
        "#0 dtype=float32",
        "#1 vLLM defaults (p50/p95 only)",
        "#2 max_num_seqs=8 (winner)",
        "#3 max_num_batched_tokens=512",
        "#4 dtype=bfloat16",
    ]  # the failed trial 5 has nothing to draw
    winner = _trace(figure, "#2 max_num_seqs=8 (winner)")
    assert winner["y"][0] == 0 and winner["y"][-1] == 1 and len(winner["x"]) == len(winner["y"]) == 106
    assert winner["x"] == sorted(winner["x"])
    old = _trace(figure, "#1 vLLM defaults (p50/p95 only)")
    assert (old["x"], old["y"]) == ([550, 1450], [0.5, 0.95])
    assert figure["layout"]["xaxis"]["title"]["text"] == "time to first token (ms)"
    assert figure["layout"]["yaxis"]["title"]["text"] == "share of requests"
    assert _vlines(figure) == {600.0, 1500.0}
    assert {"SLO p50 ≤ 600 ms", "SLO p95 ≤ 1,500 ms"} <= set(_annotations(figure))


@pytest.mark.django_db
def test_latency_against_load_for_winner_and_baseline(report_job) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    sections = {s["id"]: s for s in charts.report_sections(data)}
    figure = sections["chart-latency-load"]["figure"]
    assert [t["name"] for t in figure["data"]] == [
        "winner #2 p50",
        "winner #2 p95",
        "baseline #1 p50",
        "baseline #1 p95",
    ]
    winner_p95 = _trace(figure, "winner #2 p95")
    assert winner_p95["x"] == [2.5, 3.75, 5.0]
    assert winner_p95["y"] == [900, 1350, 1800]
    baseline = _trace(figure, "baseline #1 p50")
    # The defaults held the target only; the next step is where they saturated.
    assert baseline["x"] == [2.5, 3.75] and baseline["marker"]["symbol"] == ["circle", "x"]
    assert figure["layout"]["xaxis"]["title"]["text"] == "request rate (req/s)"
    assert figure["layout"]["yaxis"]["title"]["text"] == "time to first token (ms)"
    assert _hlines(figure) == {600.0, 1500.0}
    assert _vlines(figure) == {TARGET_RPS}
    assert "target 2.50 req/s" in _annotations(figure)


@pytest.mark.django_db
def test_cost_against_p95_marks_the_pareto_frontier(report_job) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    figure = charts.cost_vs_ttft_figure(data["trials"], data["slo"])
    assert figure is not None
    front = _trace(figure, "Pareto frontier")
    assert (front["x"], front["y"], front["text"]) == ([700, 900], [1.8, 1.2], ["#3", "#2"])
    others = _trace(figure, "other trials")
    assert sorted(others["text"]) == ["#0", "#1"]
    rejected = _trace(figure, "rejected by a gate")
    assert rejected["text"] == ["#4"]
    winner = _trace(figure, "winner")
    assert (winner["x"], winner["y"], winner["marker"]["symbol"]) == ([900], [1.2], "star")
    assert figure["layout"]["xaxis"]["title"]["text"] == "p95 TTFT at the target load (ms)"
    assert figure["layout"]["yaxis"]["title"]["text"] == "cost per million tokens (USD)"
    assert _vlines(figure) == {1500.0}


@pytest.mark.django_db
def test_predicted_against_measured_only_where_predicted(report_job) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    figure = charts.predicted_vs_measured_figure(data["trials"])
    assert figure is not None
    p50 = _trace(figure, "p50 TTFT")
    assert (p50["x"], p50["y"]) == ([400, 350], [420.0, 300.0])
    p95 = _trace(figure, "p95 TTFT")
    assert (p95["x"], p95["y"]) == ([900, 700], [1000.0, 820.0])
    assert "(calibrated)" in p95["text"][0] and "(datasheet)" in p95["text"][1]
    diagonal = _trace(figure, "prediction = measurement")
    assert diagonal["x"] == diagonal["y"] and diagonal["x"][0] == 0
    assert figure["layout"]["xaxis"]["title"]["text"] == "measured TTFT (ms)"
    assert figure["layout"]["yaxis"]["title"]["text"] == "predicted TTFT (ms)"
    without = [{**t, "predicted": None} for t in data["trials"]]
    assert charts.predicted_vs_measured_figure(without) is None
    sections = {s["id"]: s for s in charts.report_sections({**data, "trials": without})}
    assert sections["chart-predicted"]["figure"] is None
    assert "No simulator prediction" in sections["chart-predicted"]["empty"]


def test_charts_promise_only_what_they_draw_and_keep_their_labels_apart() -> None:
    """The defects a first customer found: crosses promised where none were drawn, SLO labels on
    the target's, a cost axis below zero around a single trial, and silent wild predictions."""
    slo = {"ttft_p50_ms": 600.0, "ttft_p95_ms": 650.0}

    def curve(*met: bool) -> list[dict[str, Any]]:
        points = [
            {"rate_rps": 2.0 * (1 + i), "ttft_p50_ms": 100.0, "ttft_p95_ms": 200.0, "slo_met": m}
            for i, m in enumerate(met)
        ]
        return [{"role": "winner", "trial": {"number": 0, "label": "defaults", "load_curve": points}}]

    held = charts.latency_vs_load_figure(curve(True, True), slo, 2.0)
    assert held is not None and "cross" not in held["layout"]["title"]["text"]
    assert "every step within the SLO" in held["layout"]["title"]["text"]
    saturated = charts.latency_vs_load_figure(curve(True, False), slo, 2.0)
    assert saturated is not None and "crosses missed the SLO" in saturated["layout"]["title"]["text"]
    labels = {a["text"]: (a["x"], a["y"], a.get("yanchor")) for a in saturated["layout"]["annotations"]}
    assert len(set(labels.values())) == 3  # the two SLOs (50 ms apart) and the target
    assert labels["SLO p50 ≤ 600 ms"][2] == "top" and labels["SLO p95 ≤ 650 ms"][2] == "bottom"

    one = {
        "number": 0,
        "label": "defaults",
        "ok": True,
        "cost_per_mtok_usd": 0.4,
        "ttft_p95_ms": 500.0,
        "ttft_p50_ms": 300.0,
        "gates": {"correctness_passed": True, "reliability_passed": True},
        "is_pareto": True,
        "is_winner": True,
    }
    cost = charts.cost_vs_ttft_figure([one], slo)
    assert cost is not None
    assert cost["layout"]["xaxis"]["rangemode"] == cost["layout"]["yaxis"]["rangemode"] == "tozero"

    wild = {**one, "predicted": {"ttft_p50_ms": 310.0, "ttft_p95_ms": 1200.0, "source": "simulator"}}
    predicted = charts.predicted_vs_measured_figure([wild])
    assert predicted is not None and "1 off by more than 50%" in predicted["layout"]["title"]["text"]
    p50, p95 = _trace(predicted, "p50 TTFT"), _trace(predicted, "p95 TTFT")
    assert p50["marker"]["line"]["width"] == [0] and p95["marker"]["line"]["width"] == [3]
    assert p95["text"] == ["#0 defaults (simulator): off by 140%"]
    close = charts.predicted_vs_measured_figure(
        [{**wild, "predicted": {**wild["predicted"], "ttft_p95_ms": 520.0}}]
    )
    assert close is not None and "all within 50%" in close["layout"]["title"]["text"]


@pytest.mark.django_db
def test_the_report_flags_a_prediction_far_from_its_measurement(report_job, alice_client) -> None:  # type: ignore[no-untyped-def]
    url = reverse("jobs:report", args=[report_job.id])
    html = alice_client.get(url).content.decode()
    assert "<th>Off by (p50 / p95)</th>" in html and "5% / 11%" in html and "prediction off" not in html
    trial = Trial.objects.get(job=report_job, number=3)
    trial.result = {**trial.result, "predicted": {**trial.result["predicted"], "ttft_p95_ms": 2100.0}}
    trial.save(update_fields=["result"])
    html = alice_client.get(url).content.decode()
    assert '<tr class="prediction-off"><td>3</td>' in html and "14% / 200%" in html
    assert '<strong class="flag">prediction off</strong>' in html
    assert "sensitive to the calibration" not in html
    # A forecast at saturation, where an error in the tenant's correction multiplies, says so.
    why = "at saturation: the step-time scale x1.62 from earlier trials moved the forecast p50 TTFT 2.9 times"
    trial.result = {**trial.result, "predicted": {**trial.result["predicted"], "saturation_sensitive": why}}
    trial.save(update_fields=["result"])
    html = alice_client.get(url).content.decode()
    assert "(at saturation: sensitive to the calibration)" in html and f'title="{why}"' in html


@pytest.mark.django_db
def test_the_report_states_the_requests_behind_each_percentile(report_job, alice_client) -> None:  # type: ignore[no-untyped-def]
    data = selectors.job_report_data(job=report_job)
    winner = next(t for t in data["trials"] if t["is_winner"])
    assert winner["num_requests"] == 100  # two repeats of 50 at the target rate
    sections = {s["id"]: s for s in charts.report_sections(data)}
    load = _trace(sections["chart-latency-load"]["figure"], "winner #2 p95")
    assert load["customdata"] == ["100 requests", "50 requests", "50 requests"]
    cdf = _trace(sections["chart-ttft-cdf"]["figure"], "#2 max_num_seqs=8 (winner)")
    assert "of 100 requests" in cdf["hovertemplate"]
    html = alice_client.get(reverse("jobs:report", args=[report_job.id])).content.decode()
    assert "ms, over 100 requests), sustains" in html and "<td>100</td>" in html


# --- Pages ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_report_page_for_members_only(report_job, alice_client, bob_client, charlie_client) -> None:  # type: ignore[no-untyped-def]
    url = reverse("jobs:report", args=[report_job.id])
    for name in ("jobs:report", "jobs:report_html", "jobs:report_pdf"):
        assert charlie_client.get(reverse(name, args=[report_job.id])).status_code == 404
    page = alice_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    for chart in ("chart-ttft-cdf", "chart-latency-load", "chart-cost", "chart-predicted"):
        assert f'<div class="chart" id="{chart}">' in html
    assert 'id="plotly-figures"' in html
    assert "Trial 2: <strong>max_num_seqs=8</strong>" in html
    assert "winner: lowest cost per million tokens ($1.2000)" in html
    assert "top-1 agreement 0.810 &lt; 0.9" in html  # the gate's own numbers
    assert "(≥ 0.95)" in html and "(≤ 0.05)" in html and "(not used: lossless)" in html
    assert "engine did not start: out of memory" in html
    # A viewer reads it too, and the job page links to it.
    assert bob_client.get(url).status_code == 200
    assert bob_client.get(reverse("jobs:report_html", args=[report_job.id])).status_code == 200
    assert f'href="{url}"' in alice_client.get(reverse("jobs:detail", args=[report_job.id])).content.decode()


@pytest.mark.django_db
def test_downloaded_html_is_self_contained(report_job, alice_client) -> None:  # type: ignore[no-untyped-def]
    response = alice_client.get(reverse("jobs:report_html", args=[report_job.id]))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert re.fullmatch(
        r'attachment; filename="tailguard-report-voice-agent-tuning-[0-9a-f]{8}\.html"',
        response["Content-Disposition"],
    )
    html = response.content.decode()
    # The vendored plotly.js bundle and the initialiser, inline.
    assert "plotly.js (basic - minified) v" in html and "Plotly.newPlot" in html
    assert not re.search(r"<script[^>]*\bsrc=", html, re.I)
    assert not re.search(r"<link[^>]*\bhref=[\"']?https?:", html, re.I)
    assert '<div class="chart" id="chart-cost">' in html and 'id="plotly-figures"' in html
    assert "Trial 2: <strong>max_num_seqs=8</strong>" in html


@pytest.mark.django_db
def test_pdf_without_chromium_says_so(report_job, alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.REPORT_CHROMIUM = "/nonexistent/chromium"
    response = alice_client.get(reverse("jobs:report_pdf", args=[report_job.id]), follow=True)
    assert response.redirect_chain == [(reverse("jobs:report", args=[report_job.id]), 302)]
    assert "PDF export needs headless Chromium, and &#x27;/nonexistent/chromium&#x27; was not found" in (
        response.content.decode()
    )


@pytest.mark.django_db
def test_a_job_without_a_successful_trial_says_so(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    failed = report_job_with(
        alice_org, alice, {0: (NONE, "dtype=float32", failed_trial_result("engine did not start: bad flag"))}
    )
    for name in ("jobs:report", "jobs:report_html"):
        html = alice_client.get(reverse(name, args=[failed.id])).content.decode()
        assert "No trial of this job finished successfully" in html
        assert "engine did not start: bad flag" in html
        assert 'class="chart"' not in html and 'id="plotly-figures"' not in html
    empty = report_job_with(alice_org, alice, {})
    page = alice_client.get(reverse("jobs:report", args=[empty.id]))
    assert page.status_code == 200
    assert "No trials have run for this job yet" in page.content.decode()


# --- In a real browser (headless Chromium) -------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_pdf_export_prints_the_report(report_job, alice_client) -> None:  # type: ignore[no-untyped-def]
    response = alice_client.get(reverse("jobs:report_pdf", args=[report_job.id]))
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"].startswith('attachment; filename="tailguard-report-')
    assert response.content.startswith(b"%PDF")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_report_draws_in_chromium_online_and_offline(  # type: ignore[no-untyped-def]
    live_server,
    page_factory,
    report_job,
    alice_client,
    tmp_path: Path,
) -> None:
    charts_ids = ("chart-ttft-cdf", "chart-latency-load", "chart-cost", "chart-predicted")
    page = page_factory()
    errors: list[str] = []

    def console(msg) -> None:  # type: ignore[no-untyped-def]
        # The browser's own favicon request is no part of the report (the site has no icon).
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            errors.append(f"{msg.text} ({msg.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", "alice@acme.test")
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/dashboard/$"))
    page.goto(live_server.url + reverse("jobs:detail", args=[report_job.id]))
    page.click("#job-report-link")
    for chart in charts_ids:
        page.wait_for_selector(f"#{chart}.js-plotly-plot[data-rendered='true'] svg.main-svg")
    assert page.locator(".js-plotly-plot").count() == len(charts_ids)
    assert errors == []

    # The downloaded file draws with every network request refused.
    download = tmp_path / "report.html"
    download.write_bytes(alice_client.get(reverse("jobs:report_html", args=[report_job.id])).content)
    offline = page_factory()
    requested: list[str] = []

    def refuse(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    offline.route("**/*", refuse)
    offline.on("console", console)
    offline.on("pageerror", lambda exc: errors.append(str(exc)))
    offline.goto(download.as_uri())
    for chart in charts_ids:
        offline.wait_for_selector(f"#{chart}.js-plotly-plot[data-rendered='true'] svg.main-svg")
    assert requested == [] and errors == []


@pytest.mark.django_db
def test_the_report_shows_where_ttft_went_predicted_and_measured(report_job, alice_client) -> None:  # type: ignore[no-untyped-def]
    url = reverse("jobs:report", args=[report_job.id])
    assert 'id="ttft-split"' not in alice_client.get(url).content.decode()  # recorded before the split
    trial = Trial.objects.get(job=report_job, number=3)
    trial.result = {
        **trial.result,
        "predicted": {
            **trial.result["predicted"],
            "ttft_split_ms": {"outside_engine": 12.0, "queueing": 250.0, "prefill": 180.5, "preemption": 0.0},
        },
        "ttft_mean_ms": 480.0,
        "engine_ttft_mean_ms": 452.5,
        "engine_queue_mean_ms": 261.25,
        "engine_prefill_mean_ms": None,  # an engine without the prefill histogram
    }
    trial.save(update_fields=["result"])
    split = next(t for t in selectors.job_report_data(job=report_job)["trials"] if t["number"] == 3)[
        "ttft_split"
    ]
    assert split == {
        "queueing": {"predicted": 250.0, "measured": 261.25},
        "prefill": {"predicted": 180.5, "measured": None},
        "outside_engine": {"predicted": 12.0, "measured": 27.5},  # the client's mean minus the engine's
    }
    html = alice_client.get(url).content.decode()
    assert 'id="ttft-split"' in html
    assert "<td>250.0 / 261.3</td><td>180.5 / \u2013</td><td>12.0 / 27.5</td>" in html  # a dash: none
