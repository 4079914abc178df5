"""Benchmark reports for sales engineers.

Targets are real local HTTP servers speaking the OpenAI streaming chat-completions protocol
(aiohttp, each on its own thread and event loop): a fast one, a slow one, one that answers plain
JSON instead of a stream, one that never answers, and a closed port that refuses connections.
The load generator measures them for real; only the latency floors the servers sleep are
asserted, never an upper bound.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance.models import AuditEvent
from portal.accounts.models import User
from portal.benchmarks import charts, measure, services
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink, BenchmarkTarget
from portal.benchmarks.selectors import benchmark_report_view
from portal.outbox.models import OutboxMessage
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.browser import watched
from tests.conftest import PASSWORD
from tests.portal.benchmarks import (
    API_KEY,
    FakeOpenAI,
    benchmark_form,
    closed_port_url,
    finished_report,
    report_view,
    target_spec,
)


@pytest.fixture(autouse=True)
def _internal_targets_allowed(settings: Any) -> None:
    """These tests measure fake endpoints on this machine and enter a private address: the
    operator setting that allows them (the refusal itself is tested in test_benchmark_ssrf)."""
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8", "10.0.0.0/8"]


def _run(
    sam: User, sample: TrafficSample, targets: list[services.TargetSpec], capture, **kw: Any
) -> BenchmarkReport:  # type: ignore[no-untyped-def]
    options: dict[str, Any] = {"load_multipliers": [1.0], "duration_s": 2.0, "request_timeout_s": 5.0, **kw}
    with capture(execute=True):
        report = services.benchmark_report_create(
            actor=sam, traffic_sample=sample, targets=targets, **options
        )
    report.refresh_from_db()
    return report


def _cells(report: BenchmarkReport) -> dict[tuple[int, str], dict[str, Any]]:
    names = {str(t.id): t.name for t in report.targets.all()}
    return {
        (i, names[target_id]): cell
        for i, level in enumerate(report.results["levels"])
        for target_id, cell in level["cells"].items()
    }


# --- Measuring real endpoints -----------------------------------------------------------------


@pytest.mark.django_db
def test_targets_are_measured_side_by_side_and_failures_are_reported_not_missing(
    sam, sam_client, sample, serve, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    fast = serve(FakeOpenAI(ttft_s=0.0, tpot_s=0.0))
    slow = serve(FakeOpenAI(ttft_s=0.3, tpot_s=0.03))
    plain = serve(FakeOpenAI(mode="json"))
    refused = closed_port_url()
    report = _run(
        sam,
        sample,
        [
            target_spec("Fast", fast.base_url, api_key=API_KEY),
            target_spec("Slow", slow.base_url),
            target_spec("Refuses", refused),
            target_spec("Plain JSON", plain.base_url),
        ],
        django_capture_on_commit_callbacks,
        load_multipliers=[1.0, 2.0],
    )
    assert report.status == BenchmarkReport.Status.SUCCEEDED, report.error
    cells = _cells(report)
    # Every target has a row at every level, failures included.
    assert set(cells) == {(i, n) for i in (0, 1) for n in ("Fast", "Slow", "Refuses", "Plain JSON")}
    for level in (0, 1):
        sent = {cells[(level, n)]["num_requests"] for n in ("Fast", "Slow", "Refuses", "Plain JSON")}
        assert len(sent) == 1 and sent.pop() >= 5  # the same schedule for every target
        assert cells[(level, "Fast")]["num_errors"] == 0
        assert cells[(level, "Fast")]["ttft_p95_ci_ms"] is not None
        assert cells[(level, "Fast")]["cost_per_mtok_usd"] > 0
        assert len(cells[(level, "Fast")]["ttft_cdf_ms"]) == measure.CDF_POINTS
        slow_cell = cells[(level, "Slow")]
        assert slow_cell["num_errors"] == 0
        assert slow_cell["ttft_ms"]["p50"] >= 300  # the server's sleep is a floor
        assert slow_cell["tpot_ms"]["p50"] >= 15
        refused_cell = cells[(level, "Refuses")]
        assert refused_cell["error_rate"] == 1.0
        assert refused_cell["errors"] == {"connection_refused": refused_cell["num_requests"]}
        assert refused_cell["cost_per_mtok_usd"] is None and refused_cell["ttft_cdf_ms"] == []
        plain_cell = cells[(level, "Plain JSON")]
        assert plain_cell["errors"] == {"not_streaming": plain_cell["num_requests"]}
    # Requests really streamed chat completions, with the key as a bearer token.
    assert fast.received and all(r["body"]["stream"] is True for r in fast.received)
    assert {r["authorization"] for r in fast.received} == {f"Bearer {API_KEY}"}
    assert {r["authorization"] for r in slow.received} == {None}
    assert report.results["conditions"]["client_host"] == socket.gethostname()

    page = sam_client.get(reverse("benchmarks:detail", args=[report.id]))
    assert page.status_code == 200
    html = page.content.decode()
    assert API_KEY not in html
    assert re.search(r'data-target="Refuses".*?100\.0%.*?connection refused', html, re.S)
    assert re.search(r'data-target="Plain JSON".*?answered without a token stream', html, re.S)
    assert re.search(r'data-target="Fast".*?0\.0%', html, re.S)
    # The key is stored sealed, bound to its target, and never in clear text.
    stored = BenchmarkTarget.objects.get(report=report, name="Fast")
    assert API_KEY.encode() not in bytes(stored.api_key_sealed)
    assert services._api_key(stored) == API_KEY
    actions = set(
        AuditEvent.objects.filter(organization=report.organization).values_list("action", flat=True)
    )
    assert {"benchmark_report.create", "benchmark_report.succeeded", "staff.access"} <= actions


@pytest.mark.django_db
def test_a_target_that_never_answers_times_out_and_per_token_cost_follows_the_prices(
    sam, sample, serve, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    fast = serve(FakeOpenAI())
    hang = serve(FakeOpenAI(mode="hang"))
    report = _run(
        sam,
        sample,
        [
            target_spec(
                "Provider",
                fast.base_url,
                pricing=BenchmarkTarget.Pricing.PER_TOKEN,
                price_input_per_mtok_usd=Decimal("0.50"),
                price_output_per_mtok_usd=Decimal("1.50"),
            ),
            target_spec("Silent", hang.base_url),
        ],
        django_capture_on_commit_callbacks,
        duration_s=1.5,
        request_timeout_s=1.0,
    )
    assert report.status == BenchmarkReport.Status.SUCCEEDED, report.error
    cells = _cells(report)
    silent = cells[(0, "Silent")]
    assert silent["num_requests"] >= 2 and silent["errors"] == {"timeout": silent["num_requests"]}
    provider = cells[(0, "Provider")]
    assert provider["num_errors"] == 0
    expected = (provider["input_tokens"] * 0.5 + provider["output_tokens"] * 1.5) / (
        provider["input_tokens"] + provider["output_tokens"]
    )
    assert provider["cost_per_mtok_usd"] == pytest.approx(expected)
    # The provider's own prompt-token count (usage) is what its prices apply to.
    assert provider["prompt_tokens_reported_mean"] is not None


@pytest.mark.django_db
def test_a_duplicate_delivery_is_skipped_and_a_killed_run_resumes_where_it_stopped(
    sam, sample, serve, bench_settings
) -> None:  # type: ignore[no-untyped-def]
    first = serve(FakeOpenAI())
    second = serve(FakeOpenAI())
    report = services.benchmark_report_create(  # not committed: the task does not run by itself
        actor=sam,
        traffic_sample=sample,
        targets=[target_spec("A", first.base_url), target_spec("B", second.base_url)],
        load_multipliers=[1.0],
        duration_s=1.0,
    )
    a, b = report.targets.all()
    kept = measure.failed_cell(num_requests=3, reason="recorded before the worker died")
    BenchmarkReport.objects.filter(pk=report.pk).update(
        status=BenchmarkReport.Status.RUNNING,
        lease_owner="a worker that died",
        lease_heartbeat_at=timezone.now(),
        results={
            "conditions": {"client_host": "before"},
            "levels": [{"multiplier": 1.0, "rate_rps": report.peak_rps, "cells": {str(a.id): kept}}],
        },
    )
    assert services.benchmark_report_run(report_id=str(report.id)) == "skipped"  # a live worker holds it
    BenchmarkReport.objects.filter(pk=report.pk).update(
        lease_heartbeat_at=timezone.now() - timedelta(hours=2)
    )
    assert services.benchmark_report_run(report_id=str(report.id)) == BenchmarkReport.Status.SUCCEEDED
    report.refresh_from_db()
    cells = report.results["levels"][0]["cells"]
    assert cells[str(a.id)] == kept and first.received == []  # the finished replay was not repeated
    assert cells[str(b.id)]["num_ok"] > 0 and second.received
    assert report.attempts == 1 and report.lease_owner == ""  # the lease was given back
    assert services.benchmark_report_run(report_id=str(report.id)) == "skipped"  # finished: a no-op
    # Writes are fenced by the lease: a run that lost it (another worker took over) writes nothing.
    BenchmarkReport.objects.filter(pk=report.pk).update(lease_owner="the worker that took over")
    with pytest.raises(services._LeaseLost):
        services._update_results(str(report.id), "the slow worker", lambda results: results.clear())
    report.refresh_from_db()
    assert report.results["levels"][0]["cells"][str(a.id)] == kept


@pytest.mark.django_db
def test_the_beat_queues_a_run_whose_worker_died_once_and_fails_it_after_the_last_attempt(
    sam, sample, serve, bench_settings, settings
) -> None:  # type: ignore[no-untyped-def]
    """A run killed with its broker message (no redelivery to resume it) is queued again by the
    one redispatch beat once its lease is stale, once per death; a queued report whose message the
    broker took and lost is sent again; after BENCHMARK_MAX_ATTEMPTS deaths the report fails."""
    target = serve(FakeOpenAI())
    report = services.benchmark_report_create(  # not committed: the task does not run by itself
        actor=sam,
        traffic_sample=sample,
        targets=[target_spec("A", target.base_url)],
        load_multipliers=[1.0],
        duration_s=1.0,
    )
    keys = lambda: sorted(  # noqa: E731
        m.key for m in OutboxMessage.objects.filter(key__startswith=f"benchmark_report.run:{report.id}:")
    )
    assert keys() == [f"benchmark_report.run:{report.id}:create"]
    rows = BenchmarkReport.objects.filter(pk=report.pk)
    rows.update(
        status=BenchmarkReport.Status.RUNNING, lease_owner="w1", attempts=1, lease_heartbeat_at=timezone.now()
    )
    assert services.benchmark_reports_recover() == {"died": 0, "lost": 0, "failed": 0}  # a live run

    report.refresh_from_db()
    dead_since = timezone.now() - timedelta(seconds=report.lease_s + 1)
    rows.update(lease_heartbeat_at=dead_since)
    assert services.benchmark_reports_recover() == {"died": 1, "lost": 0, "failed": 0}
    assert services.benchmark_reports_recover()["died"] == 0  # once per death, not once per beat
    [again] = [k for k in keys() if k.endswith(":attempt-2")]
    # The message it queued runs the report to the end (the stale lease is taken over).
    message = OutboxMessage.objects.get(key=again)
    assert services.benchmark_report_run(**message.kwargs) == BenchmarkReport.Status.SUCCEEDED
    assert rows.get().attempts == 2 and target.received

    # A message the broker took and lost: still queued long after it was sent.
    rows.update(
        status=BenchmarkReport.Status.QUEUED, attempts=0, **{"lease_owner": "", "lease_heartbeat_at": None}
    )
    long_ago = timezone.now() - timedelta(seconds=settings.TUNING_REDISPATCH_AFTER_S + 1)
    rows.update(created_at=long_ago)
    OutboxMessage.objects.filter(key__startswith=f"benchmark_report.run:{report.id}:").update(
        status=OutboxMessage.Status.SENT, sent_at=long_ago
    )
    assert services.benchmark_reports_recover() == {"died": 0, "lost": 1, "failed": 0}
    assert services.benchmark_reports_recover()["lost"] == 0

    # A run that keeps killing its worker ends as a failure with a reason.
    rows.update(
        status=BenchmarkReport.Status.RUNNING,
        lease_owner="w3",
        attempts=settings.BENCHMARK_MAX_ATTEMPTS,
        lease_heartbeat_at=dead_since,
    )
    assert services.benchmark_reports_recover() == {"died": 0, "lost": 0, "failed": 1}
    report.refresh_from_db()
    assert report.status == BenchmarkReport.Status.FAILED and "runs in a row" in report.error
    assert report.lease_owner == ""


# --- Pure parts ---------------------------------------------------------------------------------


def test_error_kinds_from_the_load_generators_messages() -> None:
    kinds = {
        "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]": "connection_refused",
        "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]": "connection_refused",
        "ClientConnectorDNSError: Cannot connect to host nowhere.invalid:443 ssl:default [Name or service not known]": "cannot_connect",
        "TimeoutError": "timeout",
        "ConnectionTimeoutError: Connection timeout to host http://10.255.255.1:80": "timeout",
        "stream ended without a token": "not_streaming",
        "HTTP 401: {'error': 'bad key'}": "http_4xx",
        "HTTP 503: overloaded": "http_5xx",
        "stream error: {'message': 'boom'}": "stream_error",
        "JSONDecodeError: Expecting value: line 1 column 1 (char 0)": "bad_stream",
        "ServerDisconnectedError: Server disconnected": "disconnected",
        "something new": "other",
    }
    assert {m: measure.error_kind(m) for m in kinds} == kinds


def test_cost_per_million_tokens_for_both_kinds_of_price() -> None:
    hourly = measure.Price(pricing="hourly", per_hour_usd=3.6)
    # 1000 tokens/s for 10 s: 3.6 M tokens/hour at $3.60/hour is $1 per million.
    assert measure.cost_per_mtok_usd(
        hourly, input_tokens=8000, output_tokens=2000, duration_s=10
    ) == pytest.approx(1.0)
    per_token = measure.Price(pricing="per_token", input_per_mtok_usd=1.0, output_per_mtok_usd=4.0)
    assert measure.cost_per_mtok_usd(
        per_token, input_tokens=3, output_tokens=1, duration_s=1
    ) == pytest.approx(1.75)
    assert measure.cost_per_mtok_usd(hourly, input_tokens=0, output_tokens=0, duration_s=10) is None


def test_bootstrap_interval_and_cdf_sample() -> None:
    rng = np.random.default_rng(0)
    values = list(rng.lognormal(5, 0.5, size=400))
    low, high = measure.bootstrap_ci(values, 95, np.random.default_rng(1))  # type: ignore[misc]
    assert low < float(np.percentile(values, 95)) < high
    assert measure.bootstrap_ci(values[:4], 50, np.random.default_rng(1)) is None
    assert measure.bootstrap_ci(values, 50, np.random.default_rng(1)) == measure.bootstrap_ci(
        values, 50, np.random.default_rng(1)
    )
    cdf = measure.quantiles(values)
    assert len(cdf) == measure.CDF_POINTS and cdf == sorted(cdf)
    assert cdf[0] == pytest.approx(min(values), abs=0.05) and cdf[-1] == pytest.approx(max(values), abs=0.05)


def test_load_plan_parsing_names_the_field() -> None:
    assert services.parse_load_plan("1.25, 0.5x, 1") == [0.5, 1.0, 1.25]
    for bad, words in (
        ("", "at least one"),
        ("1, fast", "'fast' is not a number"),
        ("0, 1", "out of range"),
        ("-1", "out of range"),
        ("11", "at most 10"),
        ("1, 1", "once"),
        ("nan", "out of range"),
    ):
        with pytest.raises(ValidationError) as exc:
            services.parse_load_plan(bad)
        assert words in exc.value.message_dict["load_multipliers"][0]


# --- Charts -------------------------------------------------------------------------------------


def test_cdf_chart_has_one_curve_per_target_with_data_and_names_the_rest() -> None:
    fig = charts.cdf_figure(report_view(), 1, "ttft")
    assert [t["name"] for t in fig["data"]] == ["Tuned", "Provider"]
    tuned = fig["data"][0]
    assert tuned["x"][50] == pytest.approx(200.0) and tuned["y"][0] == 0 and tuned["y"][-1] == 1
    layout = fig["layout"]
    assert layout["xaxis"]["title"]["text"] == "time to first token (ms)"
    assert layout["yaxis"]["range"] == [0, 1] and layout["yaxis"]["tickformat"] == ".0%"
    assert "1\u00d7 peak (3.00 req/s)" in layout["title"]["text"]
    assert "No successful requests: Down" in layout["annotations"][0]["text"]
    tpot = charts.cdf_figure(report_view(), 0, "tpot")
    assert tpot["layout"]["xaxis"]["title"]["text"].startswith("time per output token")
    assert tpot["data"][0]["x"][0] == pytest.approx(5.0)


def test_latency_vs_load_chart_has_p50_and_p95_with_confidence_bars() -> None:
    fig = charts.latency_vs_load_figure(report_view())
    names = [t["name"] for t in fig["data"]]
    assert names == ["Tuned p50", "Tuned p95", "Provider p50", "Provider p95"]  # "Down" has nothing
    tuned_p95 = fig["data"][1]
    assert tuned_p95["x"] == [1.5, 3.0] and tuned_p95["y"] == [200.0, 400.0]
    assert tuned_p95["error_y"]["array"] == [40.0, 40.0] and tuned_p95["error_y"]["arrayminus"] == [
        30.0,
        30.0,
    ]
    assert tuned_p95["line"]["dash"] == "dash" and fig["data"][0]["line"]["dash"] == "solid"
    assert fig["data"][0]["line"]["color"] == fig["data"][1]["line"]["color"] == charts.COLOURS[0]
    assert fig["layout"]["xaxis"]["title"]["text"] == "offered load (requests/s)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "TTFT (ms)"


def test_throughput_cost_and_error_charts() -> None:
    view = report_view()
    throughput = charts.throughput_figure(view)
    assert [t["name"] for t in throughput["data"]] == ["Tuned", "Provider", "Down"]
    assert throughput["data"][0]["y"] == [40.0, 80.0] and throughput["data"][2]["y"] == [0.0, 0.0]
    assert throughput["layout"]["yaxis"]["title"]["text"] == "output tokens / s"
    cost = charts.cost_figure(view)
    assert [t["type"] for t in cost["data"]] == ["bar"] * 3
    assert cost["data"][1]["y"] == [2.5, 2.5] and cost["data"][2]["y"] == [None, None]
    assert cost["data"][1]["text"] == ["$2.500", "$2.500"] and cost["data"][2]["text"] == ["", ""]
    assert cost["data"][0]["x"] == ["0.5\u00d7 peak (1.50 req/s)", "1\u00d7 peak (3.00 req/s)"]
    assert cost["layout"]["yaxis"]["title"]["text"] == "USD per 1M tokens"
    assert "No tokens served, so no cost: Down" in cost["layout"]["annotations"][0]["text"]
    errors = charts.error_rate_figure(view)
    assert errors["data"][2]["y"] == [1.0, 1.0] and errors["data"][0]["y"] == [0.0, 0.0]
    assert errors["data"][2]["hovertext"] == ["10 connection refused"] * 2
    assert errors["layout"]["yaxis"]["tickformat"] == ".0%"
    ids = [f["id"] for f in charts.report_figures(view)]
    assert ids == [
        "chart-latency-load",
        "chart-throughput",
        "chart-cost",
        "chart-errors",
        "chart-ttft-cdf-0",
        "chart-tpot-cdf-0",
        "chart-ttft-cdf-1",
        "chart-tpot-cdf-1",
    ]
    assert charts.report_figures({"targets": view["targets"], "levels": []}) == []


# --- Who may do what ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_only_sales_engineers_and_platform_admins_see_benchmarks(
    alice, alice_client, sam, sam_client, sample
) -> None:  # type: ignore[no-untyped-def]
    report = finished_report(sam, sample)
    urls = [
        reverse("benchmarks:list"),
        reverse("benchmarks:create"),
        reverse("benchmarks:detail", args=[report.id]),
        reverse("benchmarks:status", args=[report.id]),
    ]
    staff_without_role = User.objects.create_user(
        email="ops@tailguard.test", password=PASSWORD, is_staff=True
    )
    role_without_staff = User.objects.create_user(
        email="former@tailguard.test", password=PASSWORD, staff_role=User.StaffRole.SALES_ENGINEER
    )
    admin = User.objects.create_user(
        email="pat@tailguard.test", password=PASSWORD, is_staff=True, staff_role=User.StaffRole.PLATFORM_ADMIN
    )
    for user in (staff_without_role, role_without_staff):
        client = Client()
        client.force_login(user)
        assert all(client.get(url).status_code == 404 for url in urls)
    # Alice owns the prospect's organization, yet benchmark reports are a staff tool.
    assert all(alice_client.get(url).status_code == 404 for url in urls)
    assert Client().get(urls[0]).status_code == 302  # anonymous: sign in first
    before = BenchmarkReport.objects.count()
    response = alice_client.post(urls[1], {"targets-TOTAL_FORMS": "1", "targets-INITIAL_FORMS": "0"})
    assert response.status_code == 404 and BenchmarkReport.objects.count() == before
    with pytest.raises(PermissionDenied):
        services.benchmark_report_create(
            actor=alice,
            traffic_sample=sample,
            targets=[target_spec("x", "http://h/v1")],
            load_multipliers=[1],
            duration_s=5,
        )
    assert BenchmarkReport.objects.count() == before
    admin_client = Client()
    admin_client.force_login(admin)
    for client in (sam_client, admin_client):
        assert [client.get(url).status_code for url in urls] == [200, 200, 200, 200]
    # The navigation shows the page to staff only.
    assert '<a href="/benchmarks/">Benchmarks</a>' in sam_client.get(urls[0]).content.decode()
    assert 'href="/benchmarks/"' not in alice_client.get(reverse("traffic:list")).content.decode()


@pytest.mark.django_db
def test_the_form_names_each_bad_field_and_creates_nothing(sam_client, sample) -> None:  # type: ignore[no-untyped-def]
    url = reverse("benchmarks:create")
    cases = [
        ({"targets-0-base_url": "api.provider.example"}, "targets-0-base_url", "http:// or https://"),
        (
            {"targets-0-base_url": "https://user:pw@api.provider.example/v1"},
            "targets-0-base_url",
            "API key field",
        ),
        ({"targets-0-base_url": "http://h:99999/v1"}, "targets-0-base_url", "port"),
        (
            {"targets-1-base_url": "http://h/v1/chat/completions"},
            "targets-1-base_url",
            "not the completions route",
        ),
        ({"load_multipliers": "0.5, lots"}, "load_multipliers", "'lots' is not a number"),
        ({"load_multipliers": "0, 1"}, "load_multipliers", "out of range"),
        ({"targets-1-price_per_hour_usd": ""}, "targets-1-price_per_hour_usd", "price per hour"),
        (
            {"targets-0-price_output_per_mtok_usd": ""},
            "targets-0-price_output_per_mtok_usd",
            "million output tokens",
        ),
        ({"targets-0-price_input_per_mtok_usd": "-1"}, "targets-0-price_input_per_mtok_usd", "negative"),
        ({"targets-1-name": "Provider"}, "targets-errors", "different name"),
        ({"duration_s": "100000"}, "duration_s", "1 to 3600"),
    ]
    for overrides, where, words in cases:
        response = sam_client.post(url, benchmark_form(sample, **overrides))
        assert response.status_code == 400, overrides
        html = unescape(response.content.decode())
        if where == "targets-errors":
            assert re.search(rf'id="targets-errors".*?{words}', html, re.S), overrides
        else:
            name = where.split("-")[-1]
            assert re.search(rf'id="id_{where}".*?data-field="{name}">[^<]*{re.escape(words)}', html, re.S), (
                overrides,
                re.findall(r'data-field="[^"]+">[^<]*', html),
            )
        assert API_KEY not in html  # the key field is never rendered back
    assert not BenchmarkReport.objects.exists()
    assert not AuditEvent.objects.filter(action="benchmark_report.create").exists()
    # No targets at all: the first one is required.
    empty = {k: v for k, v in benchmark_form(sample).items() if not k.startswith("targets-") or "FORMS" in k}
    assert sam_client.post(url, empty).status_code == 400
    assert not BenchmarkReport.objects.exists()


@pytest.mark.django_db
def test_the_form_creates_a_queued_report_with_sealed_keys(sam, sam_client, sample, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    response = sam_client.post(
        reverse("benchmarks:create"), benchmark_form(sample)
    )  # the run is not committed here
    assert response.status_code == 302
    report = BenchmarkReport.objects.get()
    assert response["Location"] == reverse("benchmarks:detail", args=[report.id])
    assert report.organization == sample.organization and report.created_by == sam
    assert report.load_multipliers == [0.5, 1.0, 1.25] and report.status == BenchmarkReport.Status.QUEUED
    provider, tuned = report.targets.all()
    assert provider.pricing == "per_token" and provider.price_per_hour_usd is None and provider.has_api_key
    assert tuned.base_url == "http://10.0.0.5:8000" and tuned.send_ignore_eos and not tuned.has_api_key
    page = sam_client.get(response["Location"]).content.decode()
    assert 'data-status="queued"' in page and API_KEY not in page
    # The page polls its status fragment until the run ends, then reloads.
    status_url = reverse("benchmarks:status", args=[report.id])
    polling = sam_client.get(status_url, headers={"HX-Request": "true"})
    assert f'hx-get="{status_url}"' in polling.content.decode() and "HX-Refresh" not in polling
    BenchmarkReport.objects.filter(pk=report.pk).update(status=BenchmarkReport.Status.SUCCEEDED)
    assert sam_client.get(status_url, headers={"HX-Request": "true"})["HX-Refresh"] == "true"


# --- Sharing --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_share_link_works_anonymously_until_it_expires_or_is_revoked(
    alice_client, sam, sam_client, sample
) -> None:  # type: ignore[no-untyped-def]
    report = finished_report(sam, sample)
    share_url = reverse("benchmarks:share", args=[report.id])
    assert sam_client.post(share_url, {"days": "31"}).status_code == 400
    assert alice_client.post(share_url, {"days": "7"}).status_code == 404
    assert not BenchmarkShareLink.objects.exists()
    response = sam_client.post(share_url, {"days": "7"})
    assert response.status_code == 200
    link_url = re.search(r'id="new-share-url">([^<]+)<', response.content.decode()).group(1)  # type: ignore[union-attr]
    link = BenchmarkShareLink.objects.get()
    assert link.expires_at == pytest.approx(timezone.now() + timedelta(days=7), abs=timedelta(minutes=1))
    secret = link_url.rstrip("/").rsplit("/", 1)[1]
    assert (
        link.token_hash != secret
        and secret not in sam_client.get(reverse("benchmarks:detail", args=[report.id])).content.decode()
    )

    customer = Client()
    page = customer.get(link_url)
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("Tuned", "Provider", "Down"):
        assert f'data-target="{name}"' in html
    assert (
        "2025-01-02 03:04 UTC" in html
        and "bench-host" in html
        and "1\u00d7 peak (3.00 req/s)" in html
        and "plotly-figures" in html
    )
    # Read-only and discreet: no addresses, keys, raw error texts or staff controls.
    for hidden in (
        "10.0.0.5",
        "api.provider.example",
        API_KEY,
        "Connect call failed",
        "share-form",
        "Revoke",
    ):
        assert hidden not in html
    assert (
        AuditEvent.objects.filter(action="benchmark_share.view", organization=report.organization).count()
        == 1
    )
    link.refresh_from_db()
    assert link.view_count == 1

    # Expiry: after its date the same link is a 404.
    assert services.benchmark_share_open(secret=secret, now=link.expires_at + timedelta(seconds=1)) is None
    BenchmarkShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert customer.get(link_url).status_code == 404
    BenchmarkShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() + timedelta(days=1))
    assert customer.get(link_url).status_code == 200

    # Revocation: only staff may, and then the link is a 404 for good.
    revoke_url = reverse("benchmarks:share_revoke", args=[report.id, link.id])
    assert alice_client.post(revoke_url).status_code == 404
    assert customer.get(link_url).status_code == 200
    assert sam_client.post(revoke_url).status_code == 302
    assert customer.get(link_url).status_code == 404
    assert customer.get(link_url.replace(secret, secret[:-2] + "xx")).status_code == 404
    actions = list(
        AuditEvent.objects.filter(organization=report.organization).values_list("action", flat=True)
    )
    assert {"benchmark_share.create", "benchmark_share.revoke"} <= set(actions)
    detail = sam_client.get(reverse("benchmarks:detail", args=[report.id])).content.decode()
    assert 'data-state="revoked"' in detail


@pytest.mark.django_db
def test_unfinished_reports_are_not_shared_and_a_lost_sample_fails_the_run_cleanly(
    sam, sample, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    report = services.benchmark_report_create(
        actor=sam,
        traffic_sample=sample,
        targets=[target_spec("A", "http://h/v1")],
        load_multipliers=[1],
        duration_s=5,
    )
    with pytest.raises(ValidationError) as exc:
        services.benchmark_share_create(actor=sam, report=report, days=7)
    assert "finished" in exc.value.message_dict["days"][0]
    # The sample is deleted (e.g. by retention) before the worker gets to the report.
    traffic_services.traffic_sample_delete(actor=sample.created_by, sample=sample)
    assert services.benchmark_report_run(report_id=str(report.id)) == BenchmarkReport.Status.FAILED
    report.refresh_from_db()
    assert report.status == BenchmarkReport.Status.FAILED and "deleted before the run" in report.error
    assert report.sample_name == "acme voice week 12" and report.traffic_sample is None
    assert AuditEvent.objects.filter(action="benchmark_report.failed").count() == 1


@pytest.mark.django_db
def test_public_traces_are_attributed_in_the_report(sam, sam_client, sample) -> None:  # type: ignore[no-untyped-def]
    report = finished_report(sam, sample)
    own = sam_client.get(reverse("benchmarks:detail", args=[report.id])).content.decode()
    assert "Acme Voice's own requests" in own and "CC-BY" not in own
    BenchmarkReport.objects.filter(pk=report.pk).update(traffic_source="azure2023_conv")
    public = sam_client.get(reverse("benchmarks:detail", args=[report.id])).content.decode()
    assert re.search(
        r'id="attribution">.*Azure LLM inference trace 2023.*Azure/AzurePublicDataset.*CC-BY 4\.0',
        public,
        re.S,
    )


@pytest.mark.django_db
def test_more_than_four_targets_are_refused(sam, sam_client, sample) -> None:  # type: ignore[no-untyped-def]
    targets = [target_spec(f"T{i}", f"http://10.0.0.{i}:8000/v1") for i in range(5)]
    with pytest.raises(ValidationError) as exc:
        services.benchmark_report_create(
            actor=sam, traffic_sample=sample, targets=targets, load_multipliers=[1], duration_s=5
        )
    assert exc.value.message_dict["targets"] == ["Add 1 to 4 targets."]
    data = benchmark_form(sample, **{"targets-TOTAL_FORMS": "5", "targets-4-name": "Fifth"})
    response = sam_client.post(reverse("benchmarks:create"), data)
    assert response.status_code == 400 and "Use at most 4 targets." in response.content.decode()
    assert not BenchmarkReport.objects.exists()


@pytest.mark.django_db
def test_a_sample_without_its_workload_is_refused_at_creation(sam, sample) -> None:  # type: ignore[no-untyped-def]
    traffic_services.workload_path(sample).unlink()
    with pytest.raises(ValidationError) as exc:
        services.benchmark_report_create(
            actor=sam,
            traffic_sample=sample,
            targets=[target_spec("A", "http://h/v1")],
            load_multipliers=[1],
            duration_s=5,
        )
    assert "workload is missing" in exc.value.message_dict["traffic_sample"][0]
    assert not BenchmarkReport.objects.exists()


@pytest.mark.django_db
def test_a_stand_in_tokenizer_is_built_once_when_none_is_configured(settings, tmp_path: Path) -> None:
    settings.BENCHMARK_TOKENIZER_DIR = tmp_path / "tokenizer"
    path = services.benchmark_tokenizer_dir()
    assert (path / "tokenizer.json").exists() and (path / services.STAND_IN_MARKER).exists()
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    assert services.benchmark_tokenizer_dir() == path
    assert (path / "tokenizer.json").stat().st_mtime_ns == stamp


# --- In a real browser, and against a real engine -----------------------------------------------


# The name test_sla_browser still imports from here.
_watched = watched


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_report_page_draws_every_chart_in_chromium(live_server, page_factory, sam, sample) -> None:  # type: ignore[no-untyped-def]
    report = finished_report(sam, sample)
    _link, secret = services.benchmark_share_create(actor=sam, report=report, days=1)
    problems: list[str] = []
    page = _watched(page_factory(), problems)
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", sam.email)
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/(dashboard|organizations/new)/$"))
    page.click("nav >> text=Benchmarks")
    page.click(f"a:has-text('{report.name}')")
    expected = [f["id"] for f in charts.report_figures(benchmark_report_view(report=report))]
    assert len(expected) == 8
    for chart_id in expected:
        page.wait_for_selector(f"#{chart_id}[data-rendered='true'] .main-svg")
    # Plotly drew the series: three bar groups in the cost chart, two CDF curves at 1x.
    assert page.locator("#chart-cost .barlayer .trace").count() == 3
    assert page.locator("#chart-ttft-cdf-1 .scatterlayer .trace").count() == 2
    assert "No successful requests: Down" in (page.text_content("#chart-ttft-cdf-1") or "")
    # The customer's copy, without signing in.
    customer = _watched(page_factory(), problems)
    customer.goto(live_server.url + reverse("benchmarks:shared", kwargs={"token": secret}))
    for chart_id in expected:
        customer.wait_for_selector(f"#{chart_id}[data-rendered='true'] .main-svg")
    assert problems == []


@pytest.fixture(scope="module")
def bench_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The serving tests' engine (same tiny model, same configuration), but stopped when this
    module ends: their session-wide engine imported here would stay up beside theirs."""
    from serving.engine import start_engine
    from serving.models import build_tiny_model
    from tests.serving.helpers import engine_config

    model = tmp_path_factory.mktemp("bench-models") / "llama-s"
    build_tiny_model(arch="llama", size="s", out_dir=model, seed=0)
    log = tmp_path_factory.mktemp("bench-engine") / "engine.log"
    process = start_engine(model=str(model), config=engine_config(), log_path=log, startup_timeout_s=600)
    try:
        yield process, model
    finally:
        process.stop()


@pytest.mark.engine
@pytest.mark.django_db
def test_a_real_vllm_endpoint_is_benchmarked(  # type: ignore[no-untyped-def]
    sam, sample, settings, bench_engine, django_capture_on_commit_callbacks
) -> None:
    engine, model = bench_engine
    # The engine serves the tiny model with its own tokenizer: prompt lengths are then exact.
    settings.BENCHMARK_TOKENIZER_DIR = model
    report = _run(
        sam,
        sample,
        [
            services.TargetSpec(
                name="Tailguard vLLM",
                base_url=engine.base_url + "/v1",
                model=engine.endpoint.model_name,
                api_key=engine.endpoint.api_key or "",
                price_per_hour_usd=Decimal("1.20"),
                send_ignore_eos=True,
            )
        ],
        django_capture_on_commit_callbacks,
        load_multipliers=[0.5],
        duration_s=6.0,
        request_timeout_s=120.0,
        max_prompt_tokens=256,
    )
    assert report.status == BenchmarkReport.Status.SUCCEEDED, report.error
    cell = _cells(report)[(0, "Tailguard vLLM")]
    assert cell["num_requests"] >= 2 and cell["num_errors"] == 0, cell["error_examples"]
    assert cell["ttft_ms"]["p50"] > 0 and cell["output_throughput_tps"] > 0
    assert cell["prompt_tokens_reported_mean"] == pytest.approx(cell["prompt_tokens_planned_mean"])
    assert cell["cost_per_mtok_usd"] > 0
