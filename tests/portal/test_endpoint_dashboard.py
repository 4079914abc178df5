"""The endpoint dashboard: series and chart content from hand-made snapshots (gaps stay gaps),
SLA compliance by window, the optimization history and its gains, the loop's iterations, the
re-tuning policy (roles, validation, audit), and the page drawn in Chromium.

Endpoints here are rows only (status healthy, a port nobody listens on): no engine runs.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse
from django.utils import timezone

from compliance.models import AuditEvent
from portal.endpoints import charts, policy, selectors
from portal.endpoints.models import Endpoint, LoopIteration
from portal.sla import services as sla_services
from portal.sla.services import sla_windows_close
from tests.conftest import PASSWORD
from tests.factories import deployed_endpoint, finished_job, metric_snapshot
from tests.portal.dashboard import NOW, POLICY_URL, SLO, gap_snapshot, loop_iteration, revision_history

# --- Series: gaps are gaps ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_last_hour_keeps_every_scrape_and_its_gaps_as_none(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    start = NOW - timedelta(minutes=30)
    metric_snapshot(endpoint, start, p50=310.0, p95=950.0)
    metric_snapshot(endpoint, start + timedelta(seconds=15), p50=320.0, p95=960.0)
    gap_snapshot(endpoint, start + timedelta(seconds=30))
    metric_snapshot(endpoint, start + timedelta(seconds=45), p50=None, p95=None, requests_per_s=0.0)  # idle
    metric_snapshot(endpoint, start + timedelta(seconds=60), p50=330.0, p95=970.0)
    # Ten silent minutes (the scraper was away), then scrapes again.
    metric_snapshot(endpoint, start + timedelta(minutes=11), p50=340.0, p95=980.0)
    metric_snapshot(endpoint, NOW - timedelta(hours=2))  # outside the range

    series = selectors.snapshot_series(endpoint=endpoint, range_name="1h", now=NOW)

    assert series["num_snapshots"] == 6 and series["num_gaps"] == 1
    assert series["ttft_p50_ms"] == [310.0, 320.0, None, None, 330.0, None, 340.0]
    assert series["ttft_p95_ms"] == [950.0, 960.0, None, None, 970.0, None, 980.0]
    # The gap snapshot carries no numbers at all; the idle one keeps its measured zero rate.
    assert series["requests_per_s"] == [2.0, 2.0, None, 0.0, 2.0, None, 2.0]
    assert 0.0 not in series["ttft_p50_ms"]
    # The inserted break sits between the two scrapes around the silence.
    assert series["taken_at"][5] == (start + timedelta(seconds=60) + timedelta(minutes=5)).isoformat()
    assert [g["reason"] for g in series["gaps"]] == [
        "metrics unavailable: ReadTimeout",
        "no snapshot (the scraper was away)",
    ]
    assert series["start"] == (NOW - timedelta(hours=1)).isoformat() and series["end"] == NOW.isoformat()


@pytest.mark.django_db
def test_longer_ranges_are_bucketed_worst_p95_and_empty_buckets_break(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    bucket_start = datetime(2026, 11, 30, 11, 0, 0, tzinfo=UTC)  # a 5-minute boundary
    for i, (p50, p95) in enumerate([(300.0, 900.0), (320.0, 1900.0), (310.0, 950.0)]):
        metric_snapshot(
            endpoint, bucket_start + timedelta(seconds=15 * i + 5), p50=p50, p95=p95, requests_per_s=1.0 + i
        )
    gap_snapshot(endpoint, bucket_start + timedelta(minutes=5, seconds=5))

    series = selectors.snapshot_series(endpoint=endpoint, range_name="24h", now=NOW)

    assert series["bucket_s"] == 300.0
    assert len(series["taken_at"]) == 24 * 12
    index = series["taken_at"].index((bucket_start + timedelta(seconds=150)).isoformat())
    assert series["ttft_p50_ms"][index] == 310.0  # the median
    assert series["ttft_p95_ms"][index] == 1900.0  # the worst interval, not hidden by a mean
    assert series["requests_per_s"][index] == pytest.approx(2.0)
    assert series["ttft_p95_ms"][index + 1] is None  # a bucket of gaps
    assert series["ttft_p95_ms"][index - 1] is None  # a bucket with no snapshot
    assert sum(v is not None for v in series["ttft_p95_ms"]) == 1
    # Shaded at this resolution: the bucket of gaps only (not the hours before the first scrape).
    assert series["gaps"] == [
        {
            "start": (bucket_start + timedelta(minutes=5)).isoformat(),
            "end": (bucket_start + timedelta(minutes=10)).isoformat(),
            "reason": "no scrape with data in this bucket",
        }
    ]


# --- Charts -----------------------------------------------------------------------------------------


def _series(**overrides: Any) -> dict[str, Any]:
    base = {
        "range": "1h",
        "range_label": "last hour",
        "start": "2026-11-30T11:00:00+00:00",
        "end": "2026-11-30T12:00:00+00:00",
        "bucket_s": None,
        "taken_at": ["2026-11-30T11:10:00+00:00", "2026-11-30T11:10:15+00:00", "2026-11-30T11:10:30+00:00"],
        "ttft_p50_ms": [300.0, None, 320.0],
        "ttft_p95_ms": [900.0, None, 1600.0],
        "requests_per_s": [2.0, None, 2.5],
        "prompt_tokens_per_s": [1600.0, None, 1700.0],
        "generation_tokens_per_s": [240.0, None, 250.0],
        "prefix_cache_hit_rate": [0.4, None, 0.5],
        "num_snapshots": 3,
        "num_gaps": 1,
        "gaps": [
            {
                "start": "2026-11-30T11:10:00+00:00",
                "end": "2026-11-30T11:10:15+00:00",
                "reason": "endpoint degraded",
            }
        ],
    }
    return {**base, **overrides}


def _trace(figure: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in figure["data"] if t.get("name") == name)


def test_ttft_chart_draws_p50_and_p95_with_slo_lines_and_breaks_at_gaps() -> None:
    figure = charts.ttft_figure(_series(), {"ttft_p50_ms": 600.0, "ttft_p95_ms": 1500.0})
    p50, p95 = _trace(figure, "p50 TTFT"), _trace(figure, "p95 TTFT")
    assert p50["y"] == [300.0, None, 320.0] and p95["y"] == [900.0, None, 1600.0]
    assert p50["connectgaps"] is False and p95["connectgaps"] is False
    assert p50["x"][0] == "2026-11-30T11:10:00+00:00"
    layout = figure["layout"]
    assert layout["yaxis"]["title"]["text"] == "time to first token (ms)"
    assert layout["xaxis"]["type"] == "date" and layout["xaxis"]["title"]["text"] == "time (UTC)"
    assert layout["xaxis"]["range"] == ["2026-11-30T11:00:00+00:00", "2026-11-30T12:00:00+00:00"]
    lines = [s for s in layout["shapes"] if s["type"] == "line"]
    assert sorted(s["y0"] for s in lines) == [600.0, 1500.0]
    notes = [a["text"] for a in layout["annotations"]]
    assert "SLO p50 ≤ 600 ms" in notes and "SLO p95 ≤ 1,500 ms" in notes
    # The gap is shaded over its span.
    shaded = [s for s in layout["shapes"] if s["type"] == "rect"]
    assert [(s["x0"], s["x1"]) for s in shaded] == [
        ("2026-11-30T11:10:00+00:00", "2026-11-30T11:10:15+00:00")
    ]
    assert "last hour" in layout["title"]["text"]


def test_ttft_chart_without_data_or_slo_says_so() -> None:
    empty = _series(ttft_p50_ms=[None, None, None], ttft_p95_ms=[None, None, None], gaps=[])
    figure = charts.ttft_figure(empty, {"ttft_p50_ms": None, "ttft_p95_ms": None})
    assert "No TTFT measured in the last hour" in [a["text"] for a in figure["layout"]["annotations"]]
    assert not [s for s in figure["layout"].get("shapes", []) if s["type"] == "line"]


def test_rate_and_prefix_charts_have_their_units_and_axes() -> None:
    rates = charts.rates_figure(_series())
    assert _trace(rates, "requests/s")["y"] == [2.0, None, 2.5]
    assert _trace(rates, "requests/s").get("yaxis", "y") == "y"
    for name, values in (
        ("prompt tokens/s", [1600.0, None, 1700.0]),
        ("generation tokens/s", [240.0, None, 250.0]),
    ):
        trace = _trace(rates, name)
        assert trace["y"] == values and trace["yaxis"] == "y2" and trace["connectgaps"] is False
    assert rates["layout"]["yaxis"]["title"]["text"] == "requests / s"
    assert rates["layout"]["yaxis2"]["title"]["text"] == "tokens / s"
    assert rates["layout"]["yaxis2"]["overlaying"] == "y"

    prefix = charts.prefix_cache_figure(_series(bucket_s=300.0, range_label="last 24 hours"))
    assert _trace(prefix, "prefix-cache hit rate")["y"] == [0.4, None, 0.5]
    assert prefix["layout"]["yaxis"]["tickformat"] == ".0%"
    assert prefix["layout"]["yaxis"]["range"] == [0, 1.02]
    assert "5-min buckets" in prefix["layout"]["title"]["text"]


def test_sla_chart_bars_per_window_with_the_commitment_line() -> None:
    compliance = {
        "source": "sla_terms",
        "metric": "ttft_p95_ms",
        "target_ms": 1500.0,
        "commitment_pct": 99.5,
        "windows": [
            {"label": "2026-10", "compliance_pct": 100.0, "coverage_pct": 98.0, "status": "met"},
            {
                "label": "2026-11 (so far)",
                "compliance_pct": 97.25,
                "coverage_pct": 95.0,
                "status": "breached",
            },
        ],
    }
    figure = charts.sla_figure(compliance)
    bars = figure["data"][0]
    assert bars["type"] == "bar"
    assert bars["x"] == ["2026-10", "2026-11 (so far)"] and bars["y"] == [100.0, 97.25]
    assert bars["text"] == ["100.0%", "97.2%"]
    assert figure["layout"]["yaxis"]["title"]["text"] == "share of measured time at target (%)"
    lines = [s for s in figure["layout"]["shapes"] if s["type"] == "line"]
    assert [s["y0"] for s in lines] == [99.5]
    assert "commitment 99.5%" in [a["text"] for a in figure["layout"]["annotations"]]
    assert figure["layout"]["title"]["text"] == "SLA compliance per month (p95 TTFT ≤ 1,500 ms)"


def test_history_chart_is_the_measured_sequence_annotated_with_its_triggers() -> None:
    history = [
        {
            "generation": 1,
            "tokens_per_s": 230.0,
            "ttft_p50_ms": 500.0,
            "serving": False,
            "reason": "deployed",
            "trigger": None,
        },
        {
            "generation": 2,
            "tokens_per_s": 315.0,
            "ttft_p50_ms": 400.0,
            "serving": False,
            "reason": "promoted by hand",
            "trigger": None,
        },
        {
            "generation": 3,
            "tokens_per_s": 400.0,
            "ttft_p50_ms": 300.0,
            "serving": True,
            "reason": "continual loop iteration 2",
            "trigger": "prompt lengths drifted",
            "iteration": 2,
        },
    ]
    figure = charts.history_figure(history)
    assert figure["layout"]["title"]["text"] == "Optimization history: 230 → 315 → 400 tok/s"
    bars = _trace(figure, "tokens/s at the target load")
    assert bars["x"] == ["gen 1", "gen 2", "gen 3"] and bars["y"] == [230.0, 315.0, 400.0]
    assert bars["text"] == ["230 tok/s", "315 tok/s", "400 tok/s"]
    line = _trace(figure, "p50 TTFT (ms)")
    assert line["y"] == [500.0, 400.0, 300.0] and line["yaxis"] == "y2"
    assert figure["layout"]["yaxis"]["title"]["text"] == "tokens / s at the target load"
    assert figure["layout"]["yaxis2"]["title"]["text"] == "p50 TTFT (ms)"
    notes = [a["text"] for a in figure["layout"]["annotations"]]
    assert "deployed" in notes and "promoted by hand" in notes
    assert "loop iteration 2: prompt lengths drifted" in notes
    assert bars["customdata"][2] == "loop iteration 2: prompt lengths drifted"


# --- Selectors on the database --------------------------------------------------------------------


@pytest.mark.django_db
def test_history_computes_diffs_gains_and_loop_triggers(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    revisions = revision_history(endpoint)
    loop_iteration(
        endpoint,
        2,
        LoopIteration.Status.CONFIRMED,
        trigger="prompt lengths drifted (p50 300 -> 2,100 tokens)",
        revision=revisions[2],
    )
    rows = selectors.optimization_history(endpoint=endpoint)
    assert [r["generation"] for r in rows] == [1, 2, 3]
    assert rows[0]["is_first"] and rows[0]["diff"] == [] and rows[0]["tokens_gain_pct"] is None
    assert rows[1]["diff"] == [{"key": "dtype", "before": "bfloat16", "after": "float32"}]
    assert rows[2]["diff"] == [
        {"key": "enable_prefix_caching", "before": "false", "after": "true"},
        {"key": "max_num_seqs", "before": "64", "after": "128"},
    ]
    assert rows[1]["tokens_gain_pct"] == pytest.approx(100 * 85 / 230)
    assert rows[2]["tokens_gain_pct"] == pytest.approx(100 * 85 / 315)
    assert rows[2]["ttft_p50_change_pct"] == pytest.approx(-25.0)
    assert (
        rows[2]["trigger"] == "prompt lengths drifted (p50 300 -> 2,100 tokens)" and rows[2]["iteration"] == 2
    )
    assert rows[1]["trigger"] is None
    assert [r["serving"] for r in rows] == [False, False, True]


@pytest.mark.django_db
def test_slo_comes_from_the_job_and_an_unreadable_one_says_why(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    assert selectors.endpoint_slo(endpoint=endpoint) == {
        "text": SLO,
        "ttft_p50_ms": 600.0,
        "ttft_p95_ms": 1500.0,
        "problem": None,
    }
    broken = deployed_endpoint(alice_org, alice, port=59102, slo="fast please")
    slo = selectors.endpoint_slo(endpoint=broken)
    assert slo["ttft_p95_ms"] is None and "cannot be read" in slo["problem"]
    compliance = selectors.sla_compliance(endpoint=broken, slo=slo, range_name="1h", now=NOW)
    assert compliance["source"] == "none" and compliance["windows"] == []
    assert charts.sla_figure(compliance)["layout"]["annotations"][0]["text"] == "No target to judge"


@pytest.mark.django_db
def test_without_sla_terms_each_hour_is_judged_against_the_jobs_p95(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    settings.COMPLIANCE_SLA_MAX_INTERVAL_S = 120
    endpoint = deployed_endpoint(alice_org, alice)
    hour = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
    # 10:00-11:00: 40 one-minute intervals, the last 10 over the 1500 ms p95 target.
    for minute in range(41):
        metric_snapshot(endpoint, hour + timedelta(minutes=minute), p95=2000.0 if minute > 30 else 900.0)
    slo = selectors.endpoint_slo(endpoint=endpoint)
    compliance = selectors.sla_compliance(endpoint=endpoint, slo=slo, range_name="24h", now=NOW)
    assert compliance["source"] == "slo" and compliance["target_ms"] == 1500.0
    assert compliance["commitment_pct"] is None
    assert "No SLA terms are set for this endpoint" in compliance["note"]
    by_label = {w["label"]: w for w in compliance["windows"]}
    assert list(by_label) == [f"11-29 {h:02d}:00" for h in range(12, 24)] + [
        f"11-30 {h:02d}:00" for h in range(12)
    ]
    assert by_label["11-30 10:00"]["compliance_pct"] == pytest.approx(75.0)
    assert by_label["11-30 10:00"]["status"] == "breached"
    assert by_label["11-30 09:00"]["compliance_pct"] is None  # nothing measured: not 0 %, not 100 %
    figure = charts.sla_figure(compliance)
    assert figure["data"][0]["y"][22] == pytest.approx(75.0) and figure["data"][0]["y"][21] is None
    assert figure["data"][0]["text"][21] == "no data"
    assert not [s for s in figure["layout"].get("shapes", []) if s["type"] == "line"]
    assert (
        figure["layout"]["title"]["text"] == "SLO compliance per hour (p95 TTFT ≤ 1,500 ms; no SLA terms set)"
    )


@pytest.mark.django_db
def test_with_sla_terms_the_compliance_apps_monthly_windows_are_shown(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    Endpoint.objects.filter(pk=endpoint.pk).update(created_at=datetime(2026, 10, 1, tzinfo=UTC))
    endpoint.refresh_from_db()
    sla_services.sla_terms_set(
        actor=alice,
        endpoint=endpoint,
        metric="ttft_p95_ms",
        target_ms=1000.0,
    )
    for minute in range(0, 60, 1):
        metric_snapshot(
            endpoint, datetime(2026, 10, 15, 8, 0, tzinfo=UTC) + timedelta(minutes=minute), p95=900.0
        )
    for minute in range(0, 60, 1):
        metric_snapshot(endpoint, NOW - timedelta(minutes=60 - minute), p95=1200.0 if minute % 2 else 800.0)
    assert sla_windows_close(now=NOW) == 1  # October, frozen by the monthly close (portal.sla)

    compliance = selectors.sla_compliance(
        endpoint=endpoint, slo=selectors.endpoint_slo(endpoint=endpoint), range_name="1h", now=NOW
    )
    # Monitoring targets carry no credits, so no commitment line.
    assert compliance["source"] == "sla_terms" and compliance["commitment_pct"] is None
    assert compliance["metric"] == "ttft_p95_ms" and compliance["target_ms"] == 1000.0
    assert [w["label"] for w in compliance["windows"]] == ["2026-10", "2026-11 (so far)"]
    october, november = compliance["windows"]
    assert october["compliance_pct"] == pytest.approx(100.0) and october["status"] == "met"
    # 59 one-minute intervals, each judged by the snapshot that ends it: 29 at 800 ms are met.
    assert november["compliance_pct"] == pytest.approx(100 * 29 / 59)
    assert november["status"] == "breached" and november["current"]


# --- The page --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_alice_sees_health_configuration_charts_history_and_iterations(
    alice, alice_org, alice_client
) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice, status_detail="engine restarted after exit code -9")
    revisions = revision_history(endpoint)
    retune = finished_job(alice_org, alice, name="live traffic re-tune")
    loop_iteration(
        endpoint,
        1,
        LoopIteration.Status.KEPT,
        trigger="request rate drifted",
        job=retune,
        verdict="the running configuration is still the best on the new traffic",
        before_p95_ms=1100.0,
        finished_at=timezone.now(),
    )
    loop_iteration(
        endpoint,
        2,
        LoopIteration.Status.CONFIRMED,
        trigger="prompt lengths drifted",
        job=retune,
        verdict="candidate p50 25% lower than the incumbent",
        candidate_ttft_p50_ms=300.0,
        incumbent_ttft_p50_ms=400.0,
        before_p95_ms=1200.0,
        after_p95_ms=900.0,
        revision=revisions[2],
        promoted_at=timezone.now(),
        finished_at=timezone.now(),
    )
    loop_iteration(
        endpoint,
        3,
        LoopIteration.Status.FAILED,
        trigger="SLO erosion",
        error="the re-tuning job was refused: budget",
    )
    now = timezone.now()
    metric_snapshot(endpoint, now - timedelta(minutes=2))
    gap_snapshot(endpoint, now - timedelta(seconds=90))
    metric_snapshot(endpoint, now - timedelta(seconds=75))

    response = alice_client.get(reverse("endpoints:detail", args=[endpoint.id]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "engine restarted after exit code -9" in html
    assert f"http://127.0.0.1:{endpoint.port}/v1" in html
    assert 'hx-trigger="every 15s"' in html and "hx-preserve" in html
    for chart in ("chart-ttft", "chart-rates", "chart-prefix", "chart-sla", "chart-history"):
        assert f'id="{chart}"' in html
    figures = response.context["figures"]
    assert [f["id"] for f in figures] == [
        "chart-ttft",
        "chart-rates",
        "chart-prefix",
        "chart-sla",
        "chart-history",
    ]
    assert _trace(figures[0]["figure"], "p95 TTFT")["y"] == [900.0, None, 900.0]
    assert 'id="plotly-figures"' in html and "js/live_charts.js" in html
    # The configuration as a table.
    assert re.search(r"<td><code>max_num_seqs</code></td><td><code>128</code></td>", html)
    # The history: diffs, measurements and gains; the loop's generation names its trigger.
    assert "<code>dtype</code>: bfloat16 → float32" in html
    assert "<code>max_num_seqs</code>: 64 → 128" in html
    assert "+37% tok/s, p50 -20%" in html and "+27% tok/s, p50 -25%" in html
    assert "Triggered by loop iteration 2: prompt lengths drifted" in html
    assert 'class="winner"' in html and "3 (serving)" in html
    # The iterations, newest first.
    rows = re.findall(r'<tr data-iteration="(\d+)" data-status="(\w+)"', html)
    assert rows == [("3", "failed"), ("2", "confirmed"), ("1", "kept")]
    assert "the running configuration is still the best on the new traffic" in html
    assert "1200 ms → 900 ms (-25%)" in html and "(p50 300 vs 400 ms)" in html
    assert "the re-tuning job was refused: budget" in html
    assert reverse("jobs:detail", args=[retune.id]) in html
    assert 'id="policy-form"' in html and reverse(POLICY_URL, args=[endpoint.id]) in html


@pytest.mark.django_db
def test_the_htmx_refresh_is_the_live_panel_only(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    url = reverse("endpoints:detail", args=[endpoint.id])
    fragment = alice_client.get(url + "?range=15m", HTTP_HX_REQUEST="true")
    html = fragment.content.decode()
    assert fragment.status_code == 200 and "<html" not in html and 'id="policy-form"' not in html
    assert 'id="endpoint-live"' in html
    assert f'hx-get="{url}?range=15m"' in html and 'id="plotly-figures"' in html
    assert "HX-Refresh" not in fragment
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.STOPPED)
    stopped = alice_client.get(url, HTTP_HX_REQUEST="true")
    assert stopped["HX-Refresh"] == "true"
    assert "hx-trigger" not in alice_client.get(url).content.decode()  # a stopped endpoint does not poll


@pytest.mark.django_db
def test_an_unknown_range_falls_back_to_the_hour_and_says_so(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    response = alice_client.get(reverse("endpoints:detail", args=[endpoint.id]) + "?range=3y")
    assert response.status_code == 200
    assert "Unknown range “3y”: choose one of 15m, 1h, 6h, 24h or 7d." in response.content.decode()
    assert response.context["range"] == "1h"


@pytest.mark.django_db
def test_charlie_gets_404_for_the_page_and_the_policy(alice, alice_org, charlie, charlie_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    before = (policy.policy_values(endpoint), AuditEvent.objects.count())
    assert charlie_client.get(reverse("endpoints:detail", args=[endpoint.id])).status_code == 404
    assert (
        charlie_client.get(
            reverse("endpoints:detail", args=[endpoint.id]), HTTP_HX_REQUEST="true"
        ).status_code
        == 404
    )
    response = charlie_client.post(
        reverse(POLICY_URL, args=[endpoint.id]), _policy_post(retune_cooldown_s=600)
    )
    assert response.status_code == 404
    endpoint.refresh_from_db()
    assert (policy.policy_values(endpoint), AuditEvent.objects.count()) == before


def _policy_post(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "auto_retune": "on",
        "retune_cooldown_s": "3600",
        "retune_max_per_day": "4",
        "retune_budget_trials": "4",
        "detect_window_s": "120",
    }
    values.update({k: str(v) for k, v in overrides.items()})
    return values


@pytest.mark.django_db
def test_bob_reads_the_page_but_cannot_change_the_policy(alice, alice_org, bob, bob_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    page = bob_client.get(reverse("endpoints:detail", args=[endpoint.id]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "Only members and above can change the policy." in html
    assert reverse(POLICY_URL, args=[endpoint.id]) not in html and "Save policy" not in html
    assert re.search(r'name="retune_cooldown_s" value="3600"[^>]*disabled', html)
    before = (policy.policy_values(endpoint), AuditEvent.objects.count())
    response = bob_client.post(reverse(POLICY_URL, args=[endpoint.id]), _policy_post(retune_cooldown_s=600))
    assert response.status_code == 403
    with pytest.raises(PermissionDenied):
        policy.endpoint_policy_set(
            actor=bob,
            endpoint=endpoint,
            auto_retune=False,
            retune_cooldown_s=600,
            retune_max_per_day=4,
            retune_budget_trials=4,
            detect_window_s=120,
        )
    endpoint.refresh_from_db()
    assert (policy.policy_values(endpoint), AuditEvent.objects.count()) == before


@pytest.mark.django_db
def test_policy_out_of_range_values_are_field_errors_and_nothing_changes(
    alice, alice_org, alice_client
) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    url = reverse(POLICY_URL, args=[endpoint.id])
    before = (policy.policy_values(endpoint), AuditEvent.objects.count())
    response = alice_client.post(
        url,
        _policy_post(
            retune_cooldown_s=59, retune_max_per_day=49, retune_budget_trials=1, detect_window_s=3601
        ),
    )
    assert response.status_code == 400
    html = response.content.decode()
    errors = dict(re.findall(r'<span class="error" data-field="(\w+)">([^<]+)</span>', html))
    assert errors == {
        "retune_cooldown_s": "The cool-down must be between 60 s and 30 days (2592000 s).",
        "retune_max_per_day": "Re-tuning jobs per day must be between 0 and 48.",
        "retune_budget_trials": "The budget must be between 2 and 20 trials per re-tuning job.",
        "detect_window_s": "The detection window must be between 30 and 3600 s.",
    }
    # What was typed is shown back, and the rest of the page still renders.
    assert 'name="retune_cooldown_s" value="59"' in html and 'id="chart-ttft"' in html
    not_a_number = alice_client.post(url, _policy_post(retune_budget_trials="four", detect_window_s=""))
    assert not_a_number.status_code == 400
    errors = dict(
        re.findall(r'<span class="error" data-field="(\w+)">([^<]+)</span>', not_a_number.content.decode())
    )
    assert errors == {
        "retune_budget_trials": "Enter a whole number.",
        "detect_window_s": "This field is required.",
    }
    huge = alice_client.post(url, _policy_post(retune_cooldown_s=10**12))
    assert huge.status_code == 400
    endpoint.refresh_from_db()
    assert (policy.policy_values(endpoint), AuditEvent.objects.count()) == before
    with pytest.raises(ValidationError) as excinfo:
        policy.endpoint_policy_set(
            actor=alice,
            endpoint=endpoint,
            auto_retune=True,
            retune_cooldown_s=60,
            retune_max_per_day=True,  # a bool is not a count
            retune_budget_trials=20,
            detect_window_s=30,
        )
    assert set(excinfo.value.message_dict) == {"retune_max_per_day"}


@pytest.mark.django_db
def test_alice_changes_the_policy_and_it_is_audited(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    url = reverse(POLICY_URL, args=[endpoint.id])
    response = alice_client.post(
        url,
        {
            "retune_cooldown_s": "60",
            "retune_max_per_day": "0",
            "retune_budget_trials": "20",
            "detect_window_s": "30",
        },
    )
    assert response.status_code == 302 and response["Location"] == reverse(
        "endpoints:detail", args=[endpoint.id]
    )
    endpoint.refresh_from_db()
    assert policy.policy_values(endpoint) == {
        "auto_retune": False,
        "retune_cooldown_s": 60,
        "retune_max_per_day": 0,
        "retune_budget_trials": 20,
        "detect_window_s": 30,
    }
    event = AuditEvent.objects.get(action="endpoint.policy_set")
    assert event.actor_id == alice.pk and event.target_id == str(endpoint.pk)
    assert event.data == {
        "changed": {
            "auto_retune": False,
            "retune_cooldown_s": 60,
            "retune_max_per_day": 0,
            "retune_budget_trials": 20,
            "detect_window_s": 30,
        }
    }
    assert event.before_digest and event.after_digest and event.before_digest != event.after_digest
    # Saving the same values again changes nothing and records nothing.
    alice_client.post(
        url,
        {
            "retune_cooldown_s": "60",
            "retune_max_per_day": "0",
            "retune_budget_trials": "20",
            "detect_window_s": "30",
        },
    )
    assert AuditEvent.objects.filter(action="endpoint.policy_set").count() == 1
    page = alice_client.get(reverse("endpoints:detail", args=[endpoint.id])).content.decode()
    assert "Re-tuning policy saved." in page


# --- In a real browser (headless Chromium) -------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_dashboard_draws_and_refreshes_in_chromium(  # type: ignore[no-untyped-def]
    live_server,
    page_factory,
    alice,
    alice_org,
) -> None:
    endpoint = deployed_endpoint(alice_org, alice)
    revision_history(endpoint)
    now = timezone.now()
    for i in range(8):
        metric_snapshot(endpoint, now - timedelta(seconds=15 * (10 - i)), p50=300.0 + i, p95=900.0 + 10 * i)
    gap_snapshot(endpoint, now - timedelta(seconds=15))
    charts_ids = ("chart-ttft", "chart-rates", "chart-prefix", "chart-sla", "chart-history")
    page = page_factory()
    errors: list[str] = []

    def console(msg) -> None:  # type: ignore[no-untyped-def]
        # The browser's own favicon request is no part of the page (the site has no icon).
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            errors.append(f"{msg.text} ({msg.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", "alice@acme.test")
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/dashboard/$"))
    page.goto(live_server.url + reverse("endpoints:detail", args=[endpoint.id]))
    for chart in charts_ids:
        page.wait_for_selector(f"#{chart}.js-plotly-plot[data-rendered='true'] svg.main-svg")
    assert page.locator(".js-plotly-plot").count() == len(charts_ids)
    assert page.evaluate("document.getElementById('chart-ttft').data[1].y.length") == 9
    assert page.evaluate("document.getElementById('chart-ttft').data[1].y[8]") is None

    # A refresh, as the 15-second poll does it: the same chart elements get the new snapshot.
    metric_snapshot(endpoint, timezone.now(), p50=350.0, p95=1000.0)
    page.evaluate("document.getElementById('chart-ttft').setAttribute('data-rendered', 'old')")
    page.evaluate("window.__kept = document.getElementById('chart-ttft')")
    page.evaluate(
        "htmx.ajax('GET', document.getElementById('endpoint-live').getAttribute('hx-get'),"
        " {target: '#endpoint-live', swap: 'outerHTML'})"
    )
    page.wait_for_selector("#chart-ttft[data-rendered='true']")
    assert page.evaluate("document.getElementById('chart-ttft') === window.__kept")
    assert page.evaluate("document.getElementById('chart-ttft').data[1].y.slice(-1)[0]") == 1000.0
    for chart in charts_ids:
        page.wait_for_selector(f"#{chart}.js-plotly-plot svg.main-svg")

    # The overview's copy buttons put the text on the clipboard (static/js/copy.js, no inline script).
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page.click("button[data-copy='endpoint-url']")
    page.wait_for_selector("button[data-copy='endpoint-url']:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == f"http://127.0.0.1:{endpoint.port}/v1"
    page.click("button[data-copy='snippet-python']")
    page.wait_for_selector("button[data-copy='snippet-python']:has-text('Copied')")
    assert "from openai import OpenAI" in page.evaluate("navigator.clipboard.readText()")
    assert errors == []
