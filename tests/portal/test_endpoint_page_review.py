"""The endpoint page against issue 24 item 5: sections (overview with a copyable base URL, the key
hint and a client snippet; metrics with 15 min / 1 h / 24 h / 7 d ranges; SLA; configuration and
history; the continual loop), the model name clients send stated and explained, and every
percentile with the number of requests behind it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.endpoints import charts, selectors
from portal.endpoints.models import Endpoint, LoopIteration
from portal.jobs.models import Trial, TuningJob
from tests.factories import deployed_endpoint, finished_job, metric_snapshot
from tests.portal.dashboard import NOW, loop_iteration, revision_history

SECTIONS = ["overview", "metrics", "sla", "configuration", "loop"]


def _trial(job: TuningJob, number: int, p50: float, *counts: int) -> Trial:
    return Trial.objects.create(
        organization=job.organization,
        job=job,
        number=number,
        assignment={"max_num_seqs": 64 * (number + 1)},
        label=f"trial {number}",
        status=Trial.Status.DONE,
        result={
            "status": "ok",
            "ttft_p50_ms": p50,
            # The repeats at the target rate count; a capacity step (1.5x) does not.
            "load": [{"rate_multiple": 1.0, "num_requests": n} for n in counts]
            + [{"rate_multiple": 1.5, "num_requests": 999}],
        },
    )


def _window(num_requests: int) -> dict[str, Any]:
    return {
        "interval_s": 15.0,
        "num_requests": num_requests,
        "prefix_queries_tokens": 0,
        "prefix_hits_tokens": 0,
    }


def _page(client: Any, endpoint: Endpoint, query: str = "") -> str:
    response = client.get(reverse("endpoints:detail", args=[endpoint.id]) + query)
    assert response.status_code == 200
    return str(response.content.decode())


@pytest.mark.django_db
def test_the_page_is_in_sections_with_an_overview_to_copy_from(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    html = _page(alice_client, endpoint)
    # The sections, in order, each with its heading, and a table of contents linking them.
    found = re.findall(r'<section id="(\w+)">\s*<h2>', html)
    assert [s for s in found if s in SECTIONS] == SECTIONS
    for section in SECTIONS:
        assert f'<a href="#{section}">' in html
    base_url = f"http://127.0.0.1:{endpoint.port}/v1"
    assert (
        f'<code id="endpoint-url">{base_url}</code> <button type="button" class="copy" data-copy="endpoint-url">'
        in html
    )
    assert 'data-copy="endpoint-model"' in html and "js/copy.js" in html
    assert '<code id="endpoint-key-hint">tgk_abcd1234_…</code>' in html
    # The client snippet: this endpoint's address and model, the key from the environment
    # (the page never had it), valid Python.
    data = selectors.endpoint_dashboard(endpoint=endpoint, range_name="1h")
    python = data["client"]["python"]
    compile(python, "snippet.py", "exec")
    assert f'base_url="{base_url}"' in python and 'model="/models/llama-xs"' in python
    assert 'os.environ["TAILGUARD_API_KEY"]' in python and "tgk_abcd1234_…" in python
    assert f"curl {base_url}/chat/completions" in data["client"]["curl"]
    assert "$TAILGUARD_API_KEY" in data["client"]["curl"]
    assert (
        'id="snippet-python"' in html
        and 'data-copy="snippet-python"' in html
        and 'data-copy="snippet-curl"' in html
    )
    assert "client.chat.completions.create(" in html


@pytest.mark.django_db
def test_the_model_clients_send_is_stated_and_explained(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    served_as_path = deployed_endpoint(alice_org, alice)
    html = _page(alice_client, served_as_path)
    assert '<code id="endpoint-model">/models/llama-xs</code>' in html
    note = re.search(r'<span class="muted" id="endpoint-model-note">(.*?)</span></dd>', html, re.S)
    assert note is not None
    assert "the <code>model</code> every request names" in note.group(1)
    assert "llama-xs, served under its folder's path" in note.group(1)
    assert f"GET http://127.0.0.1:{served_as_path.port}/v1/models" in note.group(1)
    # Where the engine serves the short name, that is the name shown and put in the snippet.
    short = deployed_endpoint(
        alice_org, alice, port=59102, config={"max_num_seqs": 128, "served_model_name": "llama-xs"}
    )
    html = _page(alice_client, short)
    assert '<code id="endpoint-model">llama-xs</code>' in html and "served under its folder" not in html
    assert selectors.endpoint_model_id(short) == "llama-xs"
    assert (
        'model="llama-xs"'
        in selectors.endpoint_dashboard(endpoint=short, range_name="1h")["client"]["python"]
    )


@pytest.mark.django_db
def test_before_the_host_reports_an_address_there_is_nothing_to_copy(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice, port=None, status=Endpoint.Status.STARTING)
    html = _page(alice_client, endpoint)
    assert 'id="endpoint-url-pending"' in html and 'data-copy="endpoint-url"' not in html
    assert 'id="snippet-python"' not in html


@pytest.mark.django_db
def test_the_metrics_offer_15_minutes_1_hour_6_hours_24_hours_and_7_days(
    alice, alice_org, alice_client
) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    assert list(selectors.RANGES) == ["15m", "1h", "6h", "24h", "7d"]
    html = _page(alice_client, endpoint, "?range=15m")
    assert '<strong aria-current="page">last 15 minutes</strong>' in html
    for key in ("1h", "6h", "24h", "7d"):
        assert f'<a href="?range={key}#metrics" data-range="{key}">' in html
    metric_snapshot(endpoint, NOW - timedelta(minutes=20))
    metric_snapshot(endpoint, NOW - timedelta(minutes=10))
    series = selectors.snapshot_series(endpoint=endpoint, range_name="15m", now=NOW)
    assert series["range_label"] == "last 15 minutes" and series["num_snapshots"] == 1
    assert series["bucket_s"] is None  # every scrape a point


@pytest.mark.django_db
def test_every_live_percentile_states_the_requests_behind_it(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    metric_snapshot(endpoint, NOW - timedelta(minutes=3), window=_window(12))
    metric_snapshot(endpoint, NOW - timedelta(minutes=2), window=_window(1))
    metric_snapshot(endpoint, NOW - timedelta(minutes=1))  # scraped before windows were kept: not counted
    series = selectors.snapshot_series(endpoint=endpoint, range_name="1h", now=NOW)
    assert series["num_requests"] == [12.0, 1.0, None] and series["total_requests"] == 13
    figure = charts.ttft_figure(series, selectors.endpoint_slo(endpoint=endpoint))
    p95 = next(t for t in figure["data"] if t["name"] == "p95 TTFT")
    assert p95["customdata"] == ["12 requests", "1 request", "requests not counted"]
    assert "p95 TTFT %{y:,.0f} ms over %{customdata}" in p95["hovertemplate"]
    assert "over 13 requests" in figure["layout"]["title"]["text"]
    # Bucketed ranges add up their snapshots' requests.
    day = selectors.snapshot_series(endpoint=endpoint, range_name="24h", now=NOW)
    assert sum(n for n in day["num_requests"] if n is not None) == 13 and day["total_requests"] == 13

    recent = deployed_endpoint(alice_org, alice, port=59103)
    metric_snapshot(recent, timezone.now() - timedelta(minutes=1), window=_window(7))
    html = _page(alice_client, recent)
    assert "7 requests finished, and each point's p50 and p95 rest on the requests of its interval" in html


@pytest.mark.django_db
def test_history_and_loop_percentiles_state_their_requests(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice, detect_window_s=600)
    revisions = revision_history(endpoint)
    assert endpoint.job is not None
    _trial(endpoint.job, 2, 300.0, 40, 38)  # generation 3's trial
    retune = finished_job(alice_org, alice, name="live traffic re-tune")
    _trial(retune, 0, 400.0, 50, 50)  # the running configuration, in the re-tuning job
    _trial(retune, 1, 300.0, 45, 44)  # the candidate
    promoted = timezone.now() - timedelta(hours=1)
    metric_snapshot(endpoint, promoted - timedelta(minutes=5), window=_window(30))  # before the switch
    metric_snapshot(endpoint, promoted + timedelta(minutes=15), window=_window(20))  # after it settled
    metric_snapshot(endpoint, promoted + timedelta(minutes=16), window=_window(5))
    loop_iteration(
        endpoint,
        1,
        LoopIteration.Status.CONFIRMED,
        trigger="prompt lengths drifted",
        job=retune,
        verdict="candidate p50 25% lower than the incumbent",
        candidate_ttft_p50_ms=300.0,
        incumbent_ttft_p50_ms=400.0,
        before_p95_ms=1200.0,
        after_p95_ms=900.0,
        revision=revisions[2],
        live_windows=[_window(99)],
        promoted_at=promoted,
        finished_at=promoted + timedelta(minutes=30),
    )
    loop_iteration(
        endpoint,
        2,
        LoopIteration.Status.DETECTED,
        trigger="SLO erosion",
        before_p95_ms=1700.0,
        live_windows=[_window(8), _window(9)],
    )
    data = selectors.endpoint_dashboard(endpoint=endpoint, range_name="1h")
    assert [r["num_requests"] for r in data["history"]] == [None, None, 78]
    by_number = {it["number"]: it for it in data["iterations"]}
    assert (by_number[1]["before_requests"], by_number[1]["after_requests"]) == (30, 25)
    assert (by_number[1]["candidate_requests"], by_number[1]["incumbent_requests"]) == (89, 100)
    # Not promoted: the detection's own windows.
    assert (by_number[2]["before_requests"], by_number[2]["after_requests"]) == (17, None)

    html = _page(alice_client, endpoint)
    assert "<th>Requests behind them</th>" in html
    row = re.search(r'<tr data-generation="3".*?</tr>', html, re.S)
    assert row is not None and '<td class="requests">78</td>' in row.group(0)
    first = re.search(r'<tr data-generation="1".*?</tr>', html, re.S)
    assert first is not None and '<td class="requests">not counted</td>' in first.group(0)
    assert "1200 ms → 900 ms (-25%)" in html and "over 30 → 25 live requests" in html
    assert "over 17 → \N{EN DASH} live requests" in html
    assert "(p50 300 vs 400 ms)" in html and "over 89 and 100 requests in the re-tuning job" in html
    history = charts.history_figure(data["history"])
    p50 = next(t for t in history["data"] if t["name"] == "p50 TTFT (ms)")
    assert [c[1] for c in p50["customdata"]] == [
        "requests not counted",
        "requests not counted",
        "78 requests",
    ]
