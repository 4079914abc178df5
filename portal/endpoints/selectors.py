"""Reads for the endpoint page: plain data (dicts and lists) that the template shows and
`portal.endpoints.charts` draws (the series the charts take are JSON-ready: times as ISO text).

Missing data stays missing. A gap snapshot (the engine or its metrics were unavailable), an
interval in which no request finished, and a silence longer than the SLA's longest interval
(the scraper was away) all become `None` in the series, never zeros, so a chart breaks its line
there instead of drawing a fall to zero.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import statistics
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Max, QuerySet
from django.utils import timezone

from compliance import sla
from portal.catalog.selectors import PRICE_SOURCE_UNPRICED, effective_price_per_hour, usd_text
from portal.endpoints.models import (
    Endpoint,
    EndpointRevision,
    LoopIteration,
    MetricSnapshot,
    SLATerms,
    SLAWindowReport,
)
from portal.jobs.models import Trial
from portal.jobs.selectors import requests_at_target
from serving.catalog import UnknownHardware
from tuning.search.slo import SLOParseError

# Range key -> (length, bucket). Up to an hour every scrape (one each 15 s) is a point; longer
# ranges are bucketed so a page refreshed every 15 s does not ship tens of thousands of points.
RANGES: dict[str, tuple[timedelta, timedelta | None]] = {
    "15m": (timedelta(minutes=15), None),
    "1h": (timedelta(hours=1), None),
    "6h": (timedelta(hours=6), timedelta(minutes=1)),
    "24h": (timedelta(hours=24), timedelta(minutes=5)),
    "7d": (timedelta(days=7), timedelta(minutes=30)),
}
RANGE_LABELS = {
    "15m": "last 15 minutes",
    "1h": "last hour",
    "6h": "last 6 hours",
    "24h": "last 24 hours",
    "7d": "last 7 days",
}
DEFAULT_RANGE = "1h"
SERIES = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "requests_per_s",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    "prefix_cache_hit_rate",
)
# Requests finished in a snapshot's interval (its `window`, `LiveWindow.to_dict()`): what the
# interval's p50 and p95 rest on, stated beside every percentile the page shows.
COUNT = "num_requests"
SLA_WINDOWS_SHOWN = 6  # closed monthly windows on the chart, besides the current one
_MAX_CELL = 120  # characters of a configuration value shown in a table cell


# The page's moment moves in scrape steps (endpoints-watch runs every 15 s): every request
# within one step draws the same range, so they share their charts (`portal.plotting.memoized`;
# rebuilding five Plotly figures per poll was most of the page's time under load).
DASHBOARD_STEP_S = 15


def dashboard_now(now: datetime | None = None) -> datetime:
    """`now` rounded up to the next scrape step: no snapshot is newer than now, so none is left
    out; the range ends at most one step ahead."""
    moment = now or timezone.now()
    step = DASHBOARD_STEP_S
    return datetime.fromtimestamp(math.ceil(moment.timestamp() / step) * step, tz=UTC)


def range_key(value: str | None) -> str:
    """The range asked for, or the default when it is missing or unknown."""
    return value if value in RANGES else DEFAULT_RANGE


def endpoint_base_url(endpoint: Endpoint) -> str:
    """The OpenAI base URL clients use: the endpoint's public address (from its pool) + /v1;
    '' until the host that starts it has reported its port, where the address carries one."""
    from portal.endpoints.services import public_base_url

    base = endpoint.base_url or public_base_url(
        pool=endpoint.pool, port=endpoint.port, endpoint_id=str(endpoint.id)
    )
    return f"{base}/v1" if base else ""


def endpoint_model_id(endpoint: Endpoint) -> str:
    """The model name clients send (`model` in every request; `GET /v1/models` lists it): the
    name the engine serves, the model's short name (set at deploy); an endpoint deployed before
    short names were given serves its folder path."""
    served = (endpoint.config or {}).get("served_model_name")
    return str(served) if served else endpoint.served_model.path


# The key is shown once, at deploy: the snippets read it from the environment, never the page.
API_KEY_VARIABLE = "TAILGUARD_API_KEY"


def client_snippets(*, base_url: str, model_id: str, endpoint: Endpoint) -> dict[str, str]:
    """Ready-to-paste calls of the endpoint (the `openai` Python client and curl), with its base
    URL and model; '' each until the address is known."""
    if not base_url:
        return {"python": "", "curl": ""}
    python = (
        "import os\n\n"
        "from openai import OpenAI\n\n"
        f"# {API_KEY_VARIABLE}: the key shown once at deploy (tgk_{endpoint.api_key_prefix}_…)\n"
        f'client = OpenAI(base_url="{base_url}", api_key=os.environ["{API_KEY_VARIABLE}"])\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model_id}",\n'
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        "    max_tokens=64,\n"
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )
    body = json.dumps(
        {"model": model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}
    )
    curl = (
        f"curl {base_url}/chat/completions \\\n"
        f'  -H "Authorization: Bearer ${API_KEY_VARIABLE}" \\\n'
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d '{body}'\n"
    )
    return {"python": python, "curl": curl}


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def endpoint_slo(*, endpoint: Endpoint) -> dict[str, Any]:
    """The SLO the endpoint was tuned for (its job's), with p50/p95 TTFT targets where stated."""
    text = endpoint.job.slo_text if endpoint.job else ""
    empty: dict[str, Any] = {"text": text, "ttft_p50_ms": None, "ttft_p95_ms": None, "problem": None}
    if endpoint.job is None:
        return {**empty, "problem": "the endpoint's tuning job was deleted, so its SLO is unknown"}
    try:
        target = endpoint.job.slo()
    except SLOParseError as exc:
        return {**empty, "problem": f"the job's SLO cannot be read: {exc}"}
    return {**empty, "ttft_p50_ms": target.limit("ttft_p50_ms"), "ttft_p95_ms": target.limit("ttft_p95_ms")}


def _point(row: dict[str, Any]) -> dict[str, float | None]:
    if row["gap"]:
        return dict.fromkeys((*SERIES, COUNT))
    return {**{name: _finite(row[name]) for name in SERIES}, COUNT: _finite(row.get(COUNT))}


def _bucket(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """One bucket's point: the median p50, the worst p95 (a bucket must not hide a bad interval),
    mean rates and hit rate; `None` where no snapshot in it measured the value."""
    points = [_point(r) for r in rows]
    values = {name: [v for p in points if (v := p[name]) is not None] for name in SERIES}
    counts = [c for p in points if (c := p[COUNT]) is not None]
    out: dict[str, float | None] = {COUNT: sum(counts) if counts else None}
    for name, found in values.items():
        if not found:
            out[name] = None
        elif name == "ttft_p50_ms":
            out[name] = float(statistics.median(found))
        elif name == "ttft_p95_ms":
            out[name] = max(found)
        else:
            out[name] = sum(found) / len(found)
    return out


def _gap_spans(rows: list[dict[str, Any]], start: datetime, max_interval: timedelta) -> list[dict[str, Any]]:
    """Spans with no data: from the snapshot before a gap snapshot to it, and silences longer
    than the longest interval the SLA accepts."""
    spans: list[dict[str, Any]] = []
    previous: datetime | None = None
    for row in rows:
        taken = row["taken_at"]
        if row["gap"]:
            # A gap snapshot stands for the interval since the one before it.
            since = previous if previous is not None else max(start, taken - max_interval)
            spans.append({"start": since, "end": taken, "reason": row["gap_reason"] or "gap"})
        elif previous is not None and taken - previous > max_interval:
            spans.append({"start": previous, "end": taken, "reason": "no snapshot (the scraper was away)"})
        previous = taken
    merged: list[dict[str, Any]] = []
    for span in spans:
        last = merged[-1] if merged else None
        if last is not None and last["end"] >= span["start"] and last["reason"] == span["reason"]:
            last["end"] = span["end"]
        else:
            merged.append(dict(span))
    return [{**s, "start": s["start"].isoformat(), "end": s["end"].isoformat()} for s in merged]


Point = tuple[datetime, dict[str, float | None]]


def _rows(endpoint: Endpoint, since: datetime, until: datetime) -> list[dict[str, Any]]:
    return list(
        MetricSnapshot.objects.filter(endpoint=endpoint, taken_at__gte=since, taken_at__lte=until)
        .order_by("taken_at")
        .values("taken_at", "gap", "gap_reason", *SERIES, **{COUNT: F("window__num_requests")})
    )


def _range_start(range_name: str, end: datetime) -> datetime:
    length, bucket = RANGES[range_name]
    start = end - length
    if bucket is not None:
        # Buckets on fixed boundaries: a refresh 15 s later moves no point but the last.
        step_s = bucket.total_seconds()
        start = datetime.fromtimestamp(math.floor(start.timestamp() / step_s) * step_s, tz=UTC)
    return start


def _hours_start(range_name: str, now: datetime) -> datetime:
    return (now - RANGES[range_name][0]).replace(minute=0, second=0, microsecond=0)


def _raw_points(rows: list[dict[str, Any]], max_interval: timedelta) -> list[Point]:
    points: list[Point] = []
    previous: datetime | None = None
    for row in rows:
        if previous is not None and row["taken_at"] - previous > max_interval:
            # A silence: one empty point between the two, so the line breaks there.
            points.append((previous + (row["taken_at"] - previous) / 2, dict.fromkeys((*SERIES, COUNT))))
        points.append((row["taken_at"], _point(row)))
        previous = row["taken_at"]
    return points


def _bucket_points(
    rows: list[dict[str, Any]], start: datetime, end: datetime, bucket: timedelta
) -> tuple[list[Point], list[dict[str, Any]]]:
    """A point per bucket of the range, an empty one included (that is the break), and the
    gaps at this resolution: buckets without one good scrape, between the first snapshot and
    the last (before the first, the endpoint may not have existed)."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(int((row["taken_at"] - start) / bucket), []).append(row)
    points = [
        (min(start + bucket * index + bucket / 2, end), _bucket(groups.get(index, [])))
        for index in range(math.ceil((end - start) / bucket))
    ]
    gaps: list[dict[str, Any]] = []
    if rows:
        first = int((rows[0]["taken_at"] - start) / bucket)
        last = int((rows[-1]["taken_at"] - start) / bucket)
        for index in range(first, last + 1):
            if all(r["gap"] for r in groups.get(index, [])):
                lo, hi = start + bucket * index, min(start + bucket * (index + 1), end)
                if gaps and gaps[-1]["end"] == lo:
                    gaps[-1]["end"] = hi
                else:
                    gaps.append({"start": lo, "end": hi, "reason": "no scrape with data in this bucket"})
    return points, [{**g, "start": g["start"].isoformat(), "end": g["end"].isoformat()} for g in gaps]


def _total_requests(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """Requests finished over the range's snapshots; None when no snapshot counted them."""
    counts = [_finite(r.get(COUNT)) for r in rows if not r["gap"]]
    known = [c for c in counts if c is not None]
    return round(sum(known)) if known else None


def snapshot_series(
    *,
    endpoint: Endpoint,
    range_name: str,
    now: datetime | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The endpoint's snapshots over the range as aligned lists (`taken_at` and one list per
    metric), gaps as `None`, plus the spans with no data. `rows` (ordered, covering the range)
    saves reading them again."""
    _, bucket = RANGES[range_name]
    end = now or timezone.now()
    start = _range_start(range_name, end)
    max_interval = timedelta(seconds=settings.COMPLIANCE_SLA_MAX_INTERVAL_S)
    rows = (
        [r for r in rows if start <= r["taken_at"] <= end]
        if rows is not None
        else _rows(endpoint, start, end)
    )
    if bucket is None:
        points, gaps = _raw_points(rows, max_interval), _gap_spans(rows, start, max_interval)
    else:
        points, gaps = _bucket_points(rows, start, end, bucket)
    return {
        "range": range_name,
        "range_label": RANGE_LABELS[range_name],
        "start": start.isoformat(),
        "end": end.isoformat(),
        "bucket_s": bucket.total_seconds() if bucket else None,
        "taken_at": [moment.isoformat() for moment, _ in points],
        **{name: [point[name] for _, point in points] for name in SERIES},
        # Per point, the requests its percentiles rest on (None where unknown or a gap).
        COUNT: [point[COUNT] for _, point in points],
        "total_requests": _total_requests(rows),
        "num_snapshots": len(rows),
        "num_gaps": sum(1 for r in rows if r["gap"]),
        "gaps": gaps,
    }


# --- SLA compliance by window ----------------------------------------------------------------


def _terms_snapshots(terms: Any, since: datetime, until: datetime) -> QuerySet[MetricSnapshot]:
    return MetricSnapshot.objects.filter(
        endpoint_id=terms.endpoint_id, taken_at__gte=since, taken_at__lt=until
    )


def _terms_measurements(terms: Any, start: datetime, end: datetime) -> list[sla.Measurement]:
    """The snapshots that can touch [start, end) (from `lookaround` before to after it)."""
    if terms.source != terms.Source.ENGINE:
        # No client-observed series is recorded yet: the whole window is a gap, shown as one.
        return []
    margin = sla.lookaround(settings.COMPLIANCE_SLA_MAX_INTERVAL_S)
    rows = _terms_snapshots(terms, start - margin, end + margin).values_list("taken_at", "gap", terms.metric)
    return [sla.Measurement(taken_at=t, value_ms=v, gap=g) for t, g, v in rows]


# The current window's judged beginning, per SLA terms and hour. A month-to-date report reads
# and judges every snapshot of the month (tens of thousands per endpoint); the endpoint and
# compliance pages ask for it on every refresh. Snapshots are appended as they are scraped, so
# the month up to an hour that is well past stays as judged; only the last hour or so is
# judged again. A settled part is reused only while the snapshots it was judged from are
# unchanged (their count and newest moment, one indexed aggregate), so a backfill or a
# retention purge re-judges it.
_SETTLED_KEEP = 512
_settled: OrderedDict[tuple[Any, ...], sla.Settled] = OrderedDict()
_settled_lock = threading.Lock()


def _settled_beginning(terms: Any, start: datetime, now: datetime) -> sla.Settled | None:
    """The judged [start, cut) of the window, cut the hour before now less twice the gap
    limit, or None when the window is too young to have a settled beginning."""
    margin = sla.lookaround(settings.COMPLIANCE_SLA_MAX_INTERVAL_S)
    cut = (now - 2 * margin).replace(minute=0, second=0, microsecond=0)
    if cut <= start or terms.source != terms.Source.ENGINE:
        return None
    marks = _terms_snapshots(terms, start - margin, cut + margin).aggregate(
        n=Count("id"), last=Max("taken_at")
    )
    key = (
        terms.pk,
        terms.metric,
        terms.source,
        float(terms.target_ms),
        float(settings.COMPLIANCE_SLA_MAX_INTERVAL_S),
        start,
        cut,
        marks["n"],
        marks["last"],
    )
    with _settled_lock:
        found = _settled.get(key)
        if found is not None:
            _settled.move_to_end(key)
            return found
    found = sla.settle(
        _terms_measurements(terms, start, cut),
        target_ms=terms.target_ms,
        window_start=start,
        until=cut,
        max_interval_s=settings.COMPLIANCE_SLA_MAX_INTERVAL_S,
    )
    with _settled_lock:
        _settled[key] = found
        while len(_settled) > _SETTLED_KEEP:
            _settled.popitem(last=False)
    return found


def settled_clear() -> None:
    """Forget every kept window beginning (tests that count reads start from nothing)."""
    with _settled_lock:
        _settled.clear()


def sla_terms_get(*, endpoint: Endpoint) -> SLATerms | None:
    """The endpoint's own monitoring targets (its SLA terms), or None."""
    return SLATerms.objects.filter(endpoint=endpoint, organization=endpoint.organization_id).first()


def sla_report(
    *, terms: Any, moment: datetime | None = None, now: datetime | None = None
) -> sla.WindowReport:
    """The SLA terms' window containing `moment` (default: now), judged from the endpoint's stored
    snapshots (`compliance.sla`'s arithmetic); the pages, the API and the monthly close read it."""
    current = now or timezone.now()
    start, end = sla.month_window(moment or current)
    settled = _settled_beginning(terms, start, current) if start <= current < end else None
    return sla.evaluate(
        _terms_measurements(terms, settled.until if settled else start, end),
        target_ms=terms.target_ms,
        window_start=start,
        window_end=end,
        now=current,
        tiers=[sla.CreditTier(float(t["below_pct"]), float(t["credit_pct"])) for t in terms.credit_tiers],
        max_interval_s=settings.COMPLIANCE_SLA_MAX_INTERVAL_S,
        min_coverage_pct=terms.min_coverage_pct,
        settled=settled,
    )


def _terms_windows(terms: Any, now: datetime) -> list[dict[str, Any]]:
    closed = list(SLAWindowReport.objects.filter(terms=terms).order_by("-window_start")[:SLA_WINDOWS_SHOWN])
    windows = []
    for report in reversed(closed):
        result = report.result or {}
        windows.append(
            {
                "label": report.window_start.astimezone(UTC).strftime("%Y-%m"),
                "start": report.window_start.isoformat(),
                "end": report.window_end.isoformat(),
                "compliance_pct": result.get("compliance_pct"),
                "coverage_pct": result.get("coverage_pct"),
                "status": result.get("status", "no data"),
                "current": False,
            }
        )
    current = sla_report(terms=terms, now=now)
    if not any(w["start"] == current.window_start.isoformat() for w in windows):
        windows.append(
            {
                "label": current.window_start.strftime("%Y-%m") + " (so far)",
                "start": current.window_start.isoformat(),
                "end": current.window_end.isoformat(),
                "compliance_pct": current.compliance_pct,
                "coverage_pct": current.coverage_pct,
                "status": current.status,
                "current": True,
            }
        )
    return windows


def _hourly_windows(
    endpoint: Endpoint,
    target_ms: float,
    range_name: str,
    now: datetime,
    rows: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Each UTC hour of the range judged the way SLA windows are (`compliance.sla.evaluate`):
    the share of measured time whose p95 TTFT met the target; gaps and idle intervals left out."""
    max_interval_s = float(settings.COMPLIANCE_SLA_MAX_INTERVAL_S)
    first = _hours_start(range_name, now)
    margin = sla.lookaround(max_interval_s)
    if rows is None:
        rows = _rows(endpoint, first - margin, now)
    measurements = [
        sla.Measurement(taken_at=r["taken_at"], value_ms=_finite(r["ttft_p95_ms"]), gap=r["gap"])
        for r in rows
        if first - margin <= r["taken_at"] <= now
    ]
    times = [m.taken_at for m in measurements]
    windows = []
    hour = first
    while hour < now:
        # Only the snapshots that can touch this hour (a week is 168 hours of 240 snapshots each).
        lo = bisect.bisect_left(times, hour - margin)
        hi = bisect.bisect_right(times, hour + timedelta(hours=1) + margin)
        report = sla.evaluate(
            measurements[lo:hi],
            target_ms=target_ms,
            window_start=hour,
            window_end=hour + timedelta(hours=1),
            now=now,
            max_interval_s=max_interval_s,
        )
        windows.append(
            {
                "label": hour.astimezone(UTC).strftime("%m-%d %H:00"),
                "start": hour.isoformat(),
                "end": (hour + timedelta(hours=1)).isoformat(),
                "compliance_pct": report.compliance_pct,
                "coverage_pct": report.coverage_pct,
                "status": report.status,
                "current": hour + timedelta(hours=1) > now,
            }
        )
        hour += timedelta(hours=1)
    return windows


def sla_compliance(
    *,
    endpoint: Endpoint,
    slo: dict[str, Any],
    range_name: str,
    now: datetime | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """SLA compliance per window. With SLA terms, the compliance app's own monthly windows
    (closed ones as frozen, the current one so far) and the compliance the credits start below;
    without, the job's p95 TTFT target judged per hour over the range, with no commitment."""
    current = now or timezone.now()
    terms = sla_terms_get(endpoint=endpoint)
    if terms is not None:
        tiers = [float(t["below_pct"]) for t in terms.credit_tiers or []]
        metric = terms.get_metric_display()
        return {
            "source": "sla_terms",
            "metric": terms.metric,
            "target_ms": terms.target_ms,
            "commitment_pct": max(tiers) if tiers else None,
            "windows": _terms_windows(terms, current),
            "note": (
                f"The endpoint's SLA: {metric} at most {terms.target_ms:,.0f} ms per calendar month "
                f"(UTC), {terms.get_source_display().lower()} measurements; gaps are not counted as met."
            ),
        }
    target = slo.get("ttft_p95_ms")
    if target is None:
        return {
            "source": "none",
            "metric": None,
            "target_ms": None,
            "commitment_pct": None,
            "windows": [],
            "note": "No SLA terms are set for this endpoint and its job's SLO states no p95 TTFT target, "
            "so there is no compliance to show.",
        }
    return {
        "source": "slo",
        "metric": "ttft_p95_ms",
        "target_ms": target,
        "commitment_pct": None,
        "windows": _hourly_windows(endpoint, float(target), range_name, current, rows),
        "note": (
            "No SLA terms are set for this endpoint, so compliance is computed here from its snapshots: "
            f"per UTC hour, the share of measured time whose p95 TTFT met the job's SLO target "
            f"({target:,.0f} ms). Gaps and intervals with no finished request are left out."
        ),
    }


# --- Optimization history --------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def config_rows(config: dict[str, Any] | None) -> list[dict[str, str]]:
    """The configuration as table rows, sorted by key."""
    return [{"key": key, "value": _cell(value)} for key, value in sorted((config or {}).items())]


_MISSING = object()


def config_diff(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, str]]:
    """Keys whose values differ, with both sides ("not set" where a side lacks it)."""
    before, after = before or {}, after or {}
    rows = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, _MISSING) != after.get(key, _MISSING):
            rows.append(
                {
                    "key": key,
                    "before": _cell(before[key]) if key in before else "not set",
                    "after": _cell(after[key]) if key in after else "not set",
                }
            )
    return rows


def _change_pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return 100.0 * (after - before) / before


def optimization_history(*, endpoint: Endpoint) -> list[dict[str, Any]]:
    """Every generation in order: what was deployed and why, what changed from the generation
    before, what its tuning job measured, and the gain over the generation before (tokens per
    second up, p50 TTFT down). A loop-created generation carries its iteration's trigger."""
    revisions = list(EndpointRevision.objects.filter(endpoint=endpoint).select_related("job"))
    # The requests each generation's percentiles rest on: its trial's repeats at the target rate.
    results: dict[tuple[uuid.UUID | None, int | None], dict[str, Any]] = {
        (t["job_id"], t["number"]): t["result"] or {}
        for t in Trial.objects.filter(job_id__in={r.job_id for r in revisions if r.job_id}).values(
            "job_id", "number", "result"
        )
    }
    by_revision = {
        it.revision_id: it for it in LoopIteration.objects.filter(endpoint=endpoint, revision__isnull=False)
    }
    serving = max(
        (r.generation for r in revisions if r.config == endpoint.config),
        default=revisions[-1].generation if revisions else None,
    )
    rows: list[dict[str, Any]] = []
    previous: EndpointRevision | None = None
    for revision in revisions:
        iteration = by_revision.get(revision.pk)
        tokens = _finite(revision.measured_tokens_per_s)
        p50 = _finite(revision.measured_ttft_p50_ms)
        before_tokens = _finite(previous.measured_tokens_per_s) if previous else None
        before_p50 = _finite(previous.measured_ttft_p50_ms) if previous else None
        rows.append(
            {
                "generation": revision.generation,
                "created_at": revision.created_at.isoformat(),
                "when": revision.created_at,
                "reason": revision.reason,
                "trigger": iteration.trigger if iteration else None,
                "iteration": iteration.number if iteration else None,
                "job_id": str(revision.job_id) if revision.job_id else None,
                "job_name": revision.job.name if revision.job else None,
                "trial_number": revision.trial_number,
                "diff": config_diff(previous.config, revision.config) if previous else [],
                # The fused-MoE tables it runs (their digest; '' is vLLM's own) and whether they
                # changed from the generation before.
                "moe_tables_digest": revision.moe_tables_digest,
                "moe_tables_changed": previous is not None
                and previous.moe_tables_digest != revision.moe_tables_digest,
                "moe_tables_before": previous.moe_tables_digest if previous else "",
                "moe_tables_note": revision.moe_tables_note,
                "is_first": previous is None,
                "ttft_p50_ms": p50,
                "ttft_p95_ms": _finite(revision.measured_ttft_p95_ms),
                "num_requests": requests_at_target(results.get((revision.job_id, revision.trial_number), {})),
                "tokens_per_s": tokens,
                "tokens_gain_pct": _change_pct(before_tokens, tokens),
                "ttft_p50_change_pct": _change_pct(before_p50, p50),
                "serving": revision.generation == serving,
            }
        )
        previous = revision
    return rows


def moe_tables_rows(endpoint: Endpoint) -> list[dict[str, object]]:
    """The tuned fused-MoE tables the endpoint serves with: each file vLLM reads, and the token
    counts (batch-size keys) it has a configuration for."""
    rows: list[dict[str, object]] = []
    for name, text in sorted((endpoint.moe_tables or {}).items()):
        try:
            keys = sorted(int(k) for k in json.loads(text))
        except (TypeError, ValueError):
            keys = []
        rows.append(
            {
                "file": name,
                "keys": len(keys),
                "smallest": min(keys, default=None),
                "largest": max(keys, default=None),
            }
        )
    return rows


def _requests_between(endpoint: Endpoint, since: datetime, until: datetime | None) -> int | None:
    rows = MetricSnapshot.objects.filter(endpoint=endpoint, gap=False, taken_at__gte=since)
    if until is not None:
        rows = rows.filter(taken_at__lte=until)
    return _total_requests(list(rows.values("gap", **{COUNT: F("window__num_requests")})))


def _iteration_requests(it: LoopIteration) -> tuple[int | None, int | None]:
    """The requests behind an iteration's live p95s, over the snapshots the loop judged them on
    (`portal.endpoints.loop`): before, the detection's windows (or the window up to the
    promotion); after, the snapshots from the settled switch to the verdict."""
    window = timedelta(seconds=it.endpoint.detect_window_s)
    before = None
    if it.promoted_at is not None:
        before = _requests_between(it.endpoint, it.promoted_at - window, it.promoted_at)
    if before is None:
        counts = [_finite((w or {}).get(COUNT)) for w in it.live_windows or []]
        known = [c for c in counts if c is not None]
        before = round(sum(known)) if known else None
    after = None
    if it.promoted_at is not None and it.after_p95_ms is not None:
        after = _requests_between(it.endpoint, it.promoted_at + window, it.finished_at)
    return before, after


def _canary_requests(it: LoopIteration) -> tuple[int | None, int | None]:
    """The requests behind the canary's two p50s: those of the re-tuning job's trials that
    measured them (`loop._judge` takes the winner's and the running configuration's results)."""
    if it.job_id is None or (it.candidate_ttft_p50_ms is None and it.incumbent_ttft_p50_ms is None):
        return None, None
    results = [
        r or {}
        for r in Trial.objects.filter(job_id=it.job_id, status=Trial.Status.DONE)
        .order_by("number")
        .values_list("result", flat=True)
    ]

    def behind(p50: float | None) -> int | None:
        found = next((r for r in results if p50 is not None and r.get("ttft_p50_ms") == p50), None)
        return requests_at_target(found) if found is not None else None

    return behind(it.candidate_ttft_p50_ms), behind(it.incumbent_ttft_p50_ms)


def loop_iterations(*, endpoint: Endpoint) -> list[dict[str, Any]]:
    """The loop's iterations, newest first, as the page's table shows them."""
    rows = []
    iterations = LoopIteration.objects.filter(endpoint=endpoint).select_related("job", "revision", "endpoint")
    for it in iterations.order_by("-number"):
        before, after = _finite(it.before_p95_ms), _finite(it.after_p95_ms)
        before_requests, after_requests = _iteration_requests(it)
        candidate_requests, incumbent_requests = _canary_requests(it)
        rows.append(
            {
                "number": it.number,
                "status": it.status,
                "status_display": it.get_status_display(),
                "trigger": it.trigger,
                "job_id": str(it.job_id) if it.job_id else None,
                "job_name": it.job.name if it.job else None,
                "job_status": it.job.get_status_display() if it.job else None,
                "verdict": it.verdict,
                "error": it.error,
                "candidate_ttft_p50_ms": _finite(it.candidate_ttft_p50_ms),
                "candidate_requests": candidate_requests,
                "incumbent_ttft_p50_ms": _finite(it.incumbent_ttft_p50_ms),
                "incumbent_requests": incumbent_requests,
                "before_p95_ms": before,
                "before_requests": before_requests if before is not None else None,
                "after_p95_ms": after,
                "after_requests": after_requests if after is not None else None,
                "p95_change_pct": _change_pct(before, after),
                "generation": it.revision.generation if it.revision else None,
                "detected_at": it.detected_at,
                "promoted_at": it.promoted_at,
                "finished_at": it.finished_at,
            }
        )
    return rows


def endpoint_dashboard(*, endpoint: Endpoint, range_name: str, now: datetime | None = None) -> dict[str, Any]:
    """Everything the endpoint page shows, for one range."""
    current = now or timezone.now()
    slo = endpoint_slo(endpoint=endpoint)
    history = optimization_history(endpoint=endpoint)
    # One read of the range's snapshots serves the series and the hourly compliance.
    margin = sla.lookaround(float(settings.COMPLIANCE_SLA_MAX_INTERVAL_S))
    since = min(_range_start(range_name, current), _hours_start(range_name, current) - margin)
    rows = _rows(endpoint, since, current)
    return {
        "slo": slo,
        "series": snapshot_series(endpoint=endpoint, range_name=range_name, now=current, rows=rows),
        "sla": sla_compliance(endpoint=endpoint, slo=slo, range_name=range_name, now=current, rows=rows),
        "history": history,
        "serving_generation": next((r["generation"] for r in history if r["serving"]), None),
        "iterations": loop_iterations(endpoint=endpoint),
        "config": config_rows(endpoint.config),
        "moe_tables": moe_tables_rows(endpoint),
        "base_url": endpoint_base_url(endpoint),
        "model_id": endpoint_model_id(endpoint),
        "client": client_snippets(
            base_url=endpoint_base_url(endpoint), model_id=endpoint_model_id(endpoint), endpoint=endpoint
        ),
        "last_snapshot": MetricSnapshot.objects.filter(endpoint=endpoint)
        .order_by("-taken_at")
        .values("taken_at", "gap", "gap_reason")
        .first(),
    }


# --- Deploy confirmation ------------------------------------------------------------------------


def deploy_summary(*, job: Any) -> dict[str, Any]:
    """What deploying `job`'s winner will create, for the confirmation page: name, model,
    hardware, the configuration that will serve, and its price per hour."""
    hardware = job.hardware
    trial = job.trials.filter(number=job.winner_trial).first() if job.winner_trial is not None else None
    config = dict((trial.result or {}).get("config") or {}) if trial is not None else {}
    price_text: str | None = None
    if job.pool_id is not None:
        # It deploys on the job's pool, so the pool's price is the one it runs at (none: not priced).
        if job.pool.price_per_host_hour_usd is not None:
            price_text = f"${usd_text(job.pool.price_per_device_hour_usd)} per device-hour"
    else:
        # Hardware the catalog no longer knows has no price to show: it stays "not priced".
        with contextlib.suppress(UnknownHardware):
            price, source = effective_price_per_hour(hardware)
            if source != PRICE_SOURCE_UNPRICED and price > 0:
                price_text = f"${usd_text(price)} per device-hour"
    return {
        "name": f"{job.served_model.name} (tuned)",
        "model": job.served_model.name,
        "hardware": hardware,
        "trial": job.winner_trial,
        "trial_label": trial.label if trial is not None else "",
        "config": sorted((k, v) for k, v in config.items() if v not in (None, [], {})),
        "price": price_text,
    }
