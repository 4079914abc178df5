"""Reads of SLA agreements and their figures: the edge report (exact, from the request records)
and, beside it, the engine's own figure (from the scraped histogram snapshots); and each
endpoint's own monitoring targets (compliance's SLA terms) with this month's result."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from compliance import edge, sla
from portal.endpoints import selectors as endpoint_selectors
from portal.endpoints.models import Endpoint, MetricSnapshot
from portal.sla.models import EdgeCoverage, EdgeIntervalSummary, EdgeRequest, SLAAgreement, SLAPeriod


def sla_agreement_in_force(*, endpoint: Endpoint) -> SLAAgreement | None:
    return SLAAgreement.objects.filter(endpoint=endpoint, status=SLAAgreement.Status.IN_FORCE).first()


def sla_agreement_proposed(*, endpoint: Endpoint) -> SLAAgreement | None:
    return SLAAgreement.objects.filter(endpoint=endpoint, status=SLAAgreement.Status.PROPOSED).first()


def sla_agreement_history(*, endpoint: Endpoint) -> QuerySet[SLAAgreement]:
    return (
        SLAAgreement.objects.filter(endpoint=endpoint)
        .select_related("provider_signed_by", "customer_signed_by")
        .order_by("-version")
    )


def sla_period_list(
    *, organization: Any, start: datetime | None = None, end: datetime | None = None
) -> QuerySet[SLAPeriod]:
    periods = SLAPeriod.objects.filter(organization=organization).select_related("agreement", "endpoint")
    if start is not None:
        periods = periods.filter(window_start__gte=start)
    if end is not None:
        periods = periods.filter(window_start__lt=end)
    return periods.order_by("-window_start", "endpoint__name")


def criteria(agreement: SLAAgreement) -> list[edge.Criterion]:
    found = []
    for name in ("ttft_p50_ms", "ttft_p95_ms", "availability_pct"):
        target = getattr(agreement, name)
        if target is not None:
            found.append(edge.Criterion(name=name, target=float(target)))
    return found


def interval_breaches(interval: edge.EdgeInterval, criteria: list[edge.Criterion]) -> bool:
    for criterion in criteria:
        if criterion.name == "availability_pct":
            value = interval.availability_pct
            if value is not None and value < criterion.target:
                return True
        else:
            value = interval.ttft_p50_ms if criterion.name == "ttft_p50_ms" else interval.ttft_p95_ms
            if value is not None and value > criterion.target:
                return True
    return False


def _records(endpoint_id: uuid.UUID | str, start: datetime, end: datetime) -> Iterator[edge.EdgeRecord]:
    rows = (
        EdgeRequest.objects.filter(endpoint_id=endpoint_id, arrived_at__gte=start, arrived_at__lt=end)
        .order_by("arrived_at", "id")
        .values_list("arrived_at", "ttft_ms", "status_code")
        .iterator(chunk_size=5000)
    )
    for arrived_at, ttft_ms, status_code in rows:
        yield edge.EdgeRecord.of(arrived_at, ttft_ms, status_code)


def raw_intervals(
    *, endpoint_id: uuid.UUID | str, interval_s: int, peak_rps: float, start: datetime, end: datetime
) -> list[edge.EdgeInterval]:
    """[start, end) judged from the request records themselves (start on an interval boundary)."""
    coverage = EdgeCoverage.objects.filter(
        endpoint_id=endpoint_id, covered_to__gt=start, covered_from__lt=end
    ).values_list("covered_from", "covered_to")
    return edge.intervals(
        _records(endpoint_id, start, end),
        start=start,
        end=end,
        interval_s=interval_s,
        peak_rps=peak_rps,
        coverage=list(coverage),
    )


def _from_summary(row: EdgeIntervalSummary, step: timedelta) -> edge.EdgeInterval:
    return edge.EdgeInterval(
        start=row.start,
        end=row.start + step,
        covered=row.covered,
        admitted=row.admitted,
        excluded=row.excluded,
        failed=row.failed,
        ttft_p50_ms=row.ttft_p50_ms,
        ttft_p95_ms=row.ttft_p95_ms,
        client_errors=row.client_errors,
    )


def edge_intervals(*, agreement: SLAAgreement, start: datetime, end: datetime) -> list[edge.EdgeInterval]:
    """[start, end) as intervals of the agreement's terms: the settled ones from their stored
    summaries, the others (a run of intervals not summarised yet, and the recent tail) judged from
    the request records. The same intervals either way; only the cost differs."""
    step = timedelta(seconds=agreement.interval_s)
    stored = {
        row.start: _from_summary(row, step)
        for row in EdgeIntervalSummary.objects.filter(
            endpoint_id=agreement.endpoint_id,
            interval_s=agreement.interval_s,
            peak_rps=agreement.peak_rps,
            start__gte=start,
            start__lt=end,
        )
    }
    out: list[edge.EdgeInterval] = []
    cursor = start
    while cursor + step <= end:
        if cursor in stored:
            out.append(stored[cursor])
            cursor += step
            continue
        # A run of intervals without summaries: judged from the records in one pass.
        run_end = cursor
        while run_end + step <= end and run_end not in stored:
            run_end += step
        out += raw_intervals(
            endpoint_id=agreement.endpoint_id,
            interval_s=agreement.interval_s,
            peak_rps=agreement.peak_rps,
            start=cursor,
            end=run_end,
        )
        cursor = run_end
    return out


def _span(s: sla.Span) -> dict[str, Any]:
    return {"start": s.start.isoformat(), "end": s.end.isoformat(), "worst": s.worst_ms}


def _report_json(report: sla.WindowReport) -> dict[str, Any]:
    return {
        "status": report.status,
        "judged_until": report.judged_until.isoformat(),
        "compliance_pct": report.compliance_pct,
        "coverage_pct": report.coverage_pct,
        "compliant_s": report.compliant_s,
        "breached_s": report.breached_s,
        "idle_s": report.idle_s,
        "gap_s": report.gap_s,
        "credit_pct": report.credit_pct,
        "credit_basis": report.credit_basis,
        # Bounded: a month of 60 s intervals could list thousands of spans.
        "breaches": [_span(s) for s in report.breaches[:200]],
        "gaps": [_span(s) for s in report.gaps[:200]],
    }


def _engine_figure(
    agreement: SLAAgreement, start: datetime, end: datetime, now: datetime
) -> dict[str, Any] | None:
    """The engine's histogram-based figure for the first TTFT target, for comparison only."""
    metric = "ttft_p50_ms" if agreement.ttft_p50_ms is not None else "ttft_p95_ms"
    target = getattr(agreement, metric)
    if target is None:
        return None
    reach = sla.lookaround(settings.COMPLIANCE_SLA_MAX_INTERVAL_S)
    rows = MetricSnapshot.objects.filter(
        endpoint_id=agreement.endpoint_id, taken_at__gte=start - reach, taken_at__lt=end + reach
    ).values_list("taken_at", metric, "gap")
    measurements = [
        sla.Measurement(taken_at=t, value_ms=v, gap=g) for t, v, g in rows.iterator(chunk_size=5000)
    ]
    report = sla.evaluate(
        measurements,
        target_ms=float(target),
        window_start=start,
        window_end=end,
        now=now,
        tiers=[sla.CreditTier(float(t["below_pct"]), float(t["credit_pct"])) for t in agreement.credit_tiers],
        max_interval_s=settings.COMPLIANCE_SLA_MAX_INTERVAL_S,
        min_coverage_pct=agreement.min_coverage_pct,
    )
    return {"metric": metric, "target": float(target), **_report_json(report)}


def sla_window(
    *, agreement: SLAAgreement, window_start: datetime, window_end: datetime, now: datetime | None = None
) -> dict[str, Any]:
    """The window judged at the edge on every criterion of the terms, and the engine's figure."""
    now = now or timezone.now()
    judged_end = min(window_end, max(now, window_start))
    intervals = edge_intervals(agreement=agreement, start=window_start, end=judged_end)
    terms_criteria = criteria(agreement)
    report = edge.evaluate(
        intervals,
        criteria=terms_criteria,
        window_start=window_start,
        window_end=window_end,
        now=now,
        tiers=[sla.CreditTier(float(t["below_pct"]), float(t["credit_pct"])) for t in agreement.credit_tiers],
        min_coverage_pct=agreement.min_coverage_pct,
    )
    return {
        "window_start": window_start.isoformat(),
        "window_end": window_end.isoformat(),
        "version": agreement.version,
        "terms": agreement.terms(),
        "edge": {
            "source": "edge (per-request records, exact percentiles)",
            "status": report.status,
            "compliance_pct": report.compliance_pct,
            "credit_pct": report.credit_pct,
            "admitted": report.admitted,
            "excluded_above_peak": report.excluded,
            "failed": report.failed,
            "client_errors_not_judged": report.client_errors,
            "criteria": {
                name: {"target": next(c.target for c in terms_criteria if c.name == name), **_report_json(r)}
                for name, r in report.reports
            },
        },
        "engine": _engine_figure(agreement, window_start, window_end, now),
    }


def endpoint_sla_rows(*, organization: Any) -> list[dict[str, Any]]:
    """Each of the organization's endpoints with its own monitoring targets (SLA terms) and this
    month's result: the rows of the compliance page and console (`compliance.endpoint_sla`)."""
    rows = []
    for endpoint in Endpoint.objects.filter(organization=organization).order_by("name"):
        terms = endpoint_selectors.sla_terms_get(endpoint=endpoint)
        report = endpoint_selectors.sla_report(terms=terms) if terms is not None else None
        rows.append({"endpoint": endpoint, "terms": terms, "report": report})
    return rows


def console_rows(*, limit: int = 500) -> list[dict[str, Any]]:
    """Every endpoint with an agreement (platform scope): the version in force, a proposal
    awaiting a signature, and the last closed month with its credit. Reads stored rows only."""
    agreements = (
        SLAAgreement.objects.filter(status__in=[SLAAgreement.Status.IN_FORCE, SLAAgreement.Status.PROPOSED])
        .select_related("endpoint", "organization")
        .order_by("organization__name", "endpoint__name", "-version")[: max(1, min(limit, 2000))]
    )
    rows: dict[uuid.UUID, dict[str, Any]] = {}
    for agreement in agreements:
        row = rows.setdefault(
            agreement.endpoint_id,
            {
                "endpoint": agreement.endpoint,
                "organization": agreement.organization,
                "in_force": None,
                "proposed": None,
            },
        )
        row["in_force" if agreement.status == SLAAgreement.Status.IN_FORCE else "proposed"] = agreement
    last: dict[uuid.UUID, SLAPeriod] = {}
    for period in SLAPeriod.objects.filter(endpoint_id__in=list(rows)).order_by(
        "endpoint_id", "-window_start"
    ):
        last.setdefault(period.endpoint_id, period)
    for endpoint_id, row in rows.items():
        row["last_period"] = last.get(endpoint_id)
    return list(rows.values())
