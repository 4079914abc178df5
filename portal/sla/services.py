"""Writes of SLA agreements: proposing and signing terms, recording edge measurements, closing
periods into credits on the invoice, and raising SLA alerts; and freezing the months of each
endpoint's own monitoring targets (compliance's SLA terms).

Who may do what:
- the provider is a platform admin (staff role `platform_admin`, or a superuser); it proposes full
  terms (targets, peak rate, credit tiers, the fee they apply to) and signs customer proposals;
- the customer is the endpoint's organization, through an owner or admin; it signs the
  provider's terms, or proposes other targets. Credit tiers, the fee and the coverage rule are the
  provider's: a customer proposal that changes them is refused (403) and the refusal is audited.
Every proposal is a new version; it is in force once both sides have signed it.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from compliance import edge, sla
from compliance import selectors as compliance_selectors
from compliance.holders import DataHolder
from compliance.services import audit_record, is_provider
from portal.accounts.models import Membership, Role, User
from portal.accounts.services import require_role
from portal.alerts.models import AlertKind
from portal.alerts.services import alert_raise
from portal.billing.services import invoice_credit_add
from portal.endpoints import selectors as endpoint_selectors
from portal.endpoints.models import Endpoint, SLATerms, SLAWindowReport
from portal.sla import selectors
from portal.sla.models import EdgeCoverage, EdgeIntervalSummary, EdgeRequest, SLAAgreement, SLAPeriod

# The provider's default terms when a job gives only targets (the provider edits them freely).
DEFAULT_CREDIT_TIERS = [{"below_pct": 99.5, "credit_pct": 10.0}, {"below_pct": 99.0, "credit_pct": 25.0}]
DEFAULT_AVAILABILITY_PCT = 99.9
# Ingest bounds: requests per batch, and how long one batch may claim to cover.
EDGE_BATCH_MAX = 10_000
EDGE_BATCH_MAX_SPAN = timedelta(hours=1)
_REQUEST_ID_MAX = 64
_TTFT_MAX_MS = 3_600_000.0


def _customer_membership(actor: User, endpoint: Endpoint) -> Membership | None:
    return Membership.objects.filter(user=actor, organization_id=endpoint.organization_id).first()


def _refuse(*, actor: User, endpoint: Endpoint, action: str, reason: str, audited: bool = True) -> None:
    """Raises PermissionDenied with the reason. An attempt by one party to do the other party's
    part (a customer admin editing credit terms or countersigning its own proposal) is audited
    first (in its own savepoint, so it stays when the caller answers 403); a member whose role
    cannot sign at all is simply refused, like every other role refusal."""
    if not audited:
        raise PermissionDenied(reason)
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=endpoint.organization_id,
            action=f"sla.refused.{action}",
            target=endpoint,
            data={"endpoint": str(endpoint.pk), "reason": reason[:300]},
        )
    raise PermissionDenied(reason)


def sla_terms_derive(*, endpoint: Endpoint) -> dict[str, Any]:
    """Terms the provider starts from: the tuning job's SLO targets and peak rate."""
    spec = endpoint.job.spec if endpoint.job is not None and isinstance(endpoint.job.spec, dict) else {}
    terms: dict[str, Any] = {
        "ttft_p50_ms": None,
        "ttft_p95_ms": None,
        "availability_pct": DEFAULT_AVAILABILITY_PCT,
        "peak_rps": None,
        "interval_s": 300,
        "credit_tiers": [dict(t) for t in DEFAULT_CREDIT_TIERS],
        "min_coverage_pct": 90.0,
        "monthly_fee_cents": 0,
        "currency": "usd",
        "derived_from_job": str(endpoint.job_id or ""),
    }
    slo = endpoint.job.slo_or_none() if endpoint.job is not None else None
    if slo is not None:
        terms["ttft_p50_ms"] = slo.limit("ttft_p50_ms")
        terms["ttft_p95_ms"] = slo.limit("ttft_p95_ms")
    peak = spec.get("peak_rps")
    if isinstance(peak, int | float) and peak > 0:
        terms["peak_rps"] = float(peak)
    return terms


def _number(
    value: Any, field: str, errors: dict[str, str], *, lo: float, hi: float, optional: bool
) -> float | None:
    if value in (None, ""):
        if not optional:
            errors[field] = "Required."
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        errors[field] = "Enter a number."
        return None
    if not math.isfinite(number) or not lo <= number <= hi:
        errors[field] = f"Use a number from {lo:g} to {hi:g}."
        return None
    return number


def _clean_tiers(raw: Any, errors: dict[str, str]) -> list[dict[str, float]]:
    tiers: list[dict[str, float]] = []
    if not isinstance(raw, list) or len(raw) > 10:
        errors["credit_tiers"] = "Give at most 10 tiers as a list."
        return tiers
    for tier in raw:
        try:
            below, credit = float(tier["below_pct"]), float(tier["credit_pct"])
        except (KeyError, TypeError, ValueError):
            errors["credit_tiers"] = 'Each tier needs numbers "below_pct" and "credit_pct".'
            return []
        if not (0 < below <= 100 and 0 <= credit <= 100):
            errors["credit_tiers"] = "Tier percentages must be between 0 and 100."
            return []
        tiers.append({"below_pct": below, "credit_pct": credit})
    return sorted(tiers, key=lambda t: -t["below_pct"])


@dataclass(frozen=True)
class _Terms:
    values: dict[str, Any]


def _clean_terms(raw: dict[str, Any]) -> _Terms:
    errors: dict[str, str] = {}
    values: dict[str, Any] = {
        "ttft_p50_ms": _number(
            raw.get("ttft_p50_ms"), "ttft_p50_ms", errors, lo=1, hi=600_000, optional=True
        ),
        "ttft_p95_ms": _number(
            raw.get("ttft_p95_ms"), "ttft_p95_ms", errors, lo=1, hi=600_000, optional=True
        ),
        "availability_pct": _number(
            raw.get("availability_pct"), "availability_pct", errors, lo=50, hi=100, optional=True
        ),
        "peak_rps": _number(
            raw.get("peak_rps"), "peak_rps", errors, lo=0.001, hi=edge.MAX_PEAK_RPS, optional=False
        ),
        "min_coverage_pct": _number(
            raw.get("min_coverage_pct", 90.0), "min_coverage_pct", errors, lo=0, hi=100, optional=False
        ),
    }
    try:
        values["interval_s"] = int(raw.get("interval_s") or 300)
    except (TypeError, ValueError):
        errors["interval_s"] = "Enter whole seconds."
        values["interval_s"] = 300
    if "peak_rps" not in errors and "interval_s" not in errors and values["peak_rps"] is not None:
        problems = edge.check_terms(interval_s=values["interval_s"], peak_rps=values["peak_rps"])
        if problems:
            errors["interval_s"] = " ".join(problems)
    if values["ttft_p50_ms"] is None and values["ttft_p95_ms"] is None and values["availability_pct"] is None:
        errors["ttft_p50_ms"] = "Set at least one target: TTFT p50, TTFT p95 or availability."
    values["credit_tiers"] = _clean_tiers(raw.get("credit_tiers", []), errors)
    try:
        values["monthly_fee_cents"] = int(raw.get("monthly_fee_cents") or 0)
        if not 0 <= values["monthly_fee_cents"] <= 100_000_000:
            raise ValueError
    except (TypeError, ValueError):
        errors["monthly_fee_cents"] = "Use whole cents from 0 to 100000000."
    currency = str(raw.get("currency") or "usd").lower()
    if len(currency) != 3 or not currency.isascii() or not currency.isalpha():
        errors["currency"] = "Use a three-letter currency code, e.g. usd."
    values["currency"] = currency
    if errors:
        raise ValidationError(errors)
    return _Terms(values)


_PROVIDER_ONLY = ("credit_tiers", "monthly_fee_cents", "currency", "min_coverage_pct")


def sla_agreement_propose(*, actor: User, endpoint: Endpoint, terms: dict[str, Any]) -> SLAAgreement:
    """A new version of the endpoint's terms, signed by the proposer's side. A pending proposal
    it replaces is withdrawn."""
    provider = is_provider(actor)
    current = selectors.sla_agreement_in_force(endpoint=endpoint)
    if not provider:
        membership = _customer_membership(actor, endpoint)
        if membership is None or not membership.has_role(Role.ADMIN):
            _refuse(
                actor=actor,
                endpoint=endpoint,
                action="propose",
                reason="Only the organization's owner or admin, or the provider, can propose SLA terms.",
                audited=False,
            )
        if current is None:
            _refuse(
                actor=actor,
                endpoint=endpoint,
                action="propose",
                reason="The provider proposes an endpoint's first SLA terms; you can then sign them or propose other targets.",
            )
        assert current is not None
        provider_terms = {k: getattr(current, k) for k in _PROVIDER_ONLY}
        changed = [
            k
            for k in _PROVIDER_ONLY
            if k in terms
            and _clean_provider_value(k, terms[k]) != _clean_provider_value(k, provider_terms[k])
        ]
        if changed:
            _refuse(
                actor=actor,
                endpoint=endpoint,
                action="credit_terms",
                reason=f"Credit tiers, the fee and the coverage rule are the provider's terms; a customer cannot change {', '.join(changed)}.",
            )
        terms = {**terms, **provider_terms}
    cleaned = _clean_terms(terms).values
    now = timezone.now()
    side = SLAAgreement.Side.PROVIDER if provider else SLAAgreement.Side.CUSTOMER
    with transaction.atomic():
        Endpoint.objects.select_for_update().filter(pk=endpoint.pk).first()
        SLAAgreement.objects.filter(endpoint=endpoint, status=SLAAgreement.Status.PROPOSED).update(
            status=SLAAgreement.Status.WITHDRAWN
        )
        version = (SLAAgreement.objects.filter(endpoint=endpoint).aggregate(v=Max("version"))["v"] or 0) + 1
        agreement = SLAAgreement.objects.create(
            organization_id=endpoint.organization_id,
            endpoint=endpoint,
            version=version,
            derived_from_job=str(
                terms.get("derived_from_job") or (current.derived_from_job if current else "")
            ),
            proposed_by_side=side,
            provider_signed_by=actor if provider else None,
            provider_signed_at=now if provider else None,
            customer_signed_by=None if provider else actor,
            customer_signed_at=None if provider else now,
            **cleaned,
        )
        audit_record(
            actor=actor,
            organization=endpoint.organization_id,
            action="sla.agreement.propose",
            target=agreement,
            data={"endpoint": str(endpoint.pk), "version": version, "side": side, **_audit_terms(cleaned)},
            before=current.terms() if current else None,
            after=agreement.terms(),
        )
    return agreement


def _clean_provider_value(key: str, value: Any) -> Any:
    if key == "credit_tiers":
        errors: dict[str, str] = {}
        return _clean_tiers(value, errors) if not errors else value
    if key == "currency":
        return str(value or "").lower()
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _audit_terms(values: dict[str, Any]) -> dict[str, Any]:
    # Audit data may not carry lists of dicts with free text; tiers are numbers only.
    return {k: v for k, v in values.items() if k != "credit_tiers"} | {
        "credit_tiers": [[t["below_pct"], t["credit_pct"]] for t in values.get("credit_tiers", [])]
    }


def sla_agreement_sign(*, actor: User, agreement: SLAAgreement) -> SLAAgreement:
    """The other side signs a proposal; with both signatures it comes into force and the version
    before it is superseded."""
    endpoint = agreement.endpoint
    provider = is_provider(actor)
    if not provider:
        membership = _customer_membership(actor, endpoint)
        if membership is None or not membership.has_role(Role.ADMIN):
            _refuse(
                actor=actor,
                endpoint=endpoint,
                action="sign",
                reason="Only the organization's owner or admin can sign SLA terms.",
                audited=False,
            )
    if agreement.status != SLAAgreement.Status.PROPOSED:
        raise ValidationError(
            f"Version {agreement.version} is {agreement.get_status_display().lower()}; only a proposal can be signed."
        )
    if provider and agreement.provider_signed_at is not None:
        _refuse(
            actor=actor,
            endpoint=endpoint,
            action="sign",
            reason="The provider already signed this version; the customer signs next.",
        )
    if not provider and agreement.customer_signed_at is not None:
        _refuse(
            actor=actor,
            endpoint=endpoint,
            action="countersign",
            reason="Your organization proposed this version; the provider countersigns it, not you.",
        )
    side = SLAAgreement.Side.PROVIDER if provider else SLAAgreement.Side.CUSTOMER
    now = timezone.now()
    with transaction.atomic():
        locked = SLAAgreement.objects.select_for_update().get(pk=agreement.pk)
        if locked.status != SLAAgreement.Status.PROPOSED:
            raise ValidationError("This proposal changed meanwhile; reload the page.")
        if side == SLAAgreement.Side.PROVIDER:
            locked.provider_signed_by, locked.provider_signed_at = actor, now
        else:
            locked.customer_signed_by, locked.customer_signed_at = actor, now
        previous = (
            SLAAgreement.objects.select_for_update()
            .filter(endpoint=endpoint, status=SLAAgreement.Status.IN_FORCE)
            .first()
        )
        if previous is not None:
            previous.status, previous.in_force_until = SLAAgreement.Status.SUPERSEDED, now
            previous.save(update_fields=["status", "in_force_until"])
        locked.status, locked.in_force_from = SLAAgreement.Status.IN_FORCE, now
        locked.save()
        audit_record(
            actor=actor,
            organization=endpoint.organization_id,
            action="sla.agreement.sign",
            target=locked,
            data={
                "endpoint": str(endpoint.pk),
                "version": locked.version,
                "side": side,
                "in_force_from": now.isoformat(),
                "supersedes": previous.version if previous else None,
            },
            after=locked.terms(),
        )
    return locked


def sla_agreement_decline(*, actor: User, agreement: SLAAgreement) -> SLAAgreement:
    endpoint = agreement.endpoint
    if not is_provider(actor):
        membership = _customer_membership(actor, endpoint)
        if membership is None or not membership.has_role(Role.ADMIN):
            _refuse(
                actor=actor,
                endpoint=endpoint,
                action="decline",
                reason="Only the organization's owner or admin can decline SLA terms.",
                audited=False,
            )
    if agreement.status != SLAAgreement.Status.PROPOSED:
        raise ValidationError("Only a proposal can be declined.")
    with transaction.atomic():
        SLAAgreement.objects.filter(pk=agreement.pk).update(status=SLAAgreement.Status.DECLINED)
        audit_record(
            actor=actor,
            organization=endpoint.organization_id,
            action="sla.agreement.decline",
            target=agreement,
            data={"endpoint": str(endpoint.pk), "version": agreement.version},
        )
    agreement.refresh_from_db()
    return agreement


# --- Edge measurements ----------------------------------------------------------------------------


def _moment(value: Any, field: str) -> datetime:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field} must be Unix seconds (a number)")
    if not 946_684_800 <= value < 32_503_680_000:
        raise ValueError(f"{field} is not a time in years 2000-2999")
    return datetime.fromtimestamp(float(value), tz=UTC)


def edge_batch_record(*, endpoint: Endpoint, payload: Any, now: datetime | None = None) -> dict[str, int]:
    """Stores one batch from the measuring point: the span it covers and its requests. The whole
    batch is refused (ValidationError naming the first bad row) or stored; a request already
    stored (same id) is kept once, so a batch sent twice changes nothing."""
    now = now or timezone.now()
    if not isinstance(payload, dict):
        raise ValidationError("Send a JSON object with covered_from, covered_to and requests.")
    try:
        covered_from = _moment(payload.get("covered_from"), "covered_from")
        covered_to = _moment(payload.get("covered_to"), "covered_to")
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    if covered_to <= covered_from or covered_to - covered_from > EDGE_BATCH_MAX_SPAN:
        raise ValidationError("covered_to must be after covered_from, by at most an hour.")
    if covered_to > now + timedelta(minutes=1):
        raise ValidationError("covered_to is in the future.")
    rows = payload.get("requests")
    if not isinstance(rows, list):
        raise ValidationError("requests must be a list.")
    if len(rows) > EDGE_BATCH_MAX:
        raise ValidationError(f"At most {EDGE_BATCH_MAX} requests per batch; send the rest in another.")
    records = []
    for n, row in enumerate(rows):
        where = f"requests[{n}]"
        if not isinstance(row, dict):
            raise ValidationError(f"{where} is not an object.")
        request_id = row.get("id")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= _REQUEST_ID_MAX:
            raise ValidationError(f"{where}.id must be a string of 1 to {_REQUEST_ID_MAX} characters.")
        try:
            arrived = _moment(row.get("arrived_at"), f"{where}.arrived_at")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        if not covered_from <= arrived < covered_to:
            raise ValidationError(f"{where}.arrived_at is outside the batch's covered span.")
        ttft = row.get("ttft_ms")
        if ttft is not None and (
            isinstance(ttft, bool) or not isinstance(ttft, int | float) or not 0 <= ttft <= _TTFT_MAX_MS
        ):
            raise ValidationError(f"{where}.ttft_ms must be null or a number from 0 to {_TTFT_MAX_MS:g}.")
        status = row.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValidationError(f"{where}.status must be an HTTP status code (100-599).")
        records.append(
            EdgeRequest(
                organization_id=endpoint.organization_id,
                endpoint=endpoint,
                request_id=request_id,
                arrived_at=arrived,
                ttft_ms=None if ttft is None else float(ttft),
                status_code=status,
            )
        )
    with transaction.atomic():
        before = EdgeRequest.objects.filter(
            endpoint=endpoint, arrived_at__gte=covered_from, arrived_at__lt=covered_to
        ).count()
        EdgeRequest.objects.bulk_create(records, ignore_conflicts=True, batch_size=2000)
        after = EdgeRequest.objects.filter(
            endpoint=endpoint, arrived_at__gte=covered_from, arrived_at__lt=covered_to
        ).count()
        EdgeCoverage.objects.create(
            organization_id=endpoint.organization_id,
            endpoint=endpoint,
            covered_from=covered_from,
            covered_to=covered_to,
            requests=len(records),
        )
        # A late batch changes the intervals it covers: their summaries are judged again.
        EdgeIntervalSummary.objects.filter(
            endpoint=endpoint,
            start__gt=covered_from - timedelta(seconds=edge.MAX_INTERVAL_S),
            start__lt=covered_to,
        ).delete()
    return {"received": len(records), "stored": after - before}


# --- Periods, credits and alerts -----------------------------------------------------------------------


def _agreement_for_window(
    endpoint_id: uuid.UUID | str, start: datetime, end: datetime
) -> SLAAgreement | None:
    """The version in force at the window's end (or the last one in force during it)."""
    return (
        SLAAgreement.objects.filter(
            endpoint_id=endpoint_id, in_force_from__isnull=False, in_force_from__lt=end
        )
        .exclude(in_force_until__lte=start)
        .order_by("-in_force_from")
        .first()
    )


def sla_periods_close(*, now: datetime | None = None) -> int:
    """Freezes every ended month of every endpoint that had terms in force in it, and records its
    credit on the invoice. Idempotent (one period per endpoint and month, one credit per period)."""
    now = now or timezone.now()
    this_month, _ = sla.month_window(now)
    closed = 0
    endpoint_ids = (
        SLAAgreement.objects.filter(in_force_from__isnull=False)
        .values_list("endpoint_id", flat=True)
        .distinct()
    )
    for endpoint_id in list(endpoint_ids):
        earliest = (
            SLAAgreement.objects.filter(endpoint_id=endpoint_id, in_force_from__isnull=False)
            .order_by("in_force_from")
            .values_list("in_force_from", flat=True)
            .first()
        )
        if earliest is None:
            continue
        done = set(SLAPeriod.objects.filter(endpoint_id=endpoint_id).values_list("window_start", flat=True))
        # From the month after the last closed one (months before it were closed or had no terms).
        start, end = sla.month_window(max(done) if done else earliest)
        if done:
            start, end = sla.month_window(end)
        # At most two years of months per run: bounded work even for an endpoint years behind.
        for _ in range(24):
            if end > this_month:
                break
            if start not in done:
                closed += _period_close(endpoint_id, start, end, now)
            start, end = sla.month_window(end)
    return closed


# An interval is summarised once it ended this long ago: batches of it still in flight (the
# measuring point sends every few seconds to minutes) have arrived. A later one re-judges it.
EDGE_SETTLE = timedelta(minutes=10)
# Intervals summarised per agreement and run (a month of 60 s intervals is 44,640).
_SETTLE_MAX_INTERVALS = 50_000


def edge_intervals_settle(*, now: datetime | None = None) -> int:
    """Stores the summary of every settled interval of this month and the last (for each
    agreement in force in them) that has none yet. Idempotent. Returns summaries stored."""
    now = now or timezone.now()
    this_month, _ = sla.month_window(now)
    last_month, _ = sla.month_window(this_month - timedelta(days=1))
    stored = 0
    agreements = SLAAgreement.objects.filter(in_force_from__isnull=False).exclude(
        in_force_until__lt=last_month
    )
    for agreement in agreements.order_by("endpoint_id", "version")[:1000]:
        step = timedelta(seconds=agreement.interval_s)
        for month_start in (last_month, this_month):
            _, month_end = sla.month_window(month_start)
            settled = min(month_end, now - EDGE_SETTLE)
            # Whole intervals only, counted from the month's start.
            settled = (
                month_start + ((settled - month_start) // step) * step
                if settled > month_start
                else month_start
            )
            have = set(
                EdgeIntervalSummary.objects.filter(
                    endpoint_id=agreement.endpoint_id,
                    interval_s=agreement.interval_s,
                    peak_rps=agreement.peak_rps,
                    start__gte=month_start,
                    start__lt=settled,
                ).values_list("start", flat=True)
            )
            missing = [
                month_start + k * step
                for k in range(min(int((settled - month_start) / step), _SETTLE_MAX_INTERVALS))
                if month_start + k * step not in have
            ]
            if not missing:
                continue
            judged = selectors.raw_intervals(
                endpoint_id=agreement.endpoint_id,
                interval_s=agreement.interval_s,
                peak_rps=agreement.peak_rps,
                start=missing[0],
                end=missing[-1] + step,
            )
            wanted = set(missing)
            rows = [
                EdgeIntervalSummary(
                    organization_id=agreement.organization_id,
                    endpoint_id=agreement.endpoint_id,
                    interval_s=agreement.interval_s,
                    peak_rps=agreement.peak_rps,
                    start=i.start,
                    covered=i.covered,
                    admitted=i.admitted,
                    excluded=i.excluded,
                    failed=i.failed,
                    ttft_p50_ms=i.ttft_p50_ms,
                    ttft_p95_ms=i.ttft_p95_ms,
                    client_errors=i.client_errors,
                )
                for i in judged
                if i.start in wanted
            ]
            stored += len(
                EdgeIntervalSummary.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)
            )
    return stored


# Rows deleted per statement, and statements per run, when old edge records are purged.
_PURGE_BATCH, _PURGE_BATCHES = 50_000, 20


def edge_records_purge(*, now: datetime | None = None) -> int:
    """Deletes edge records (and coverage spans) older than SLA_EDGE_RETENTION_DAYS: by then their
    month is closed and frozen in its period. Bounded per run; the next run goes on. Returns rows
    deleted."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.SLA_EDGE_RETENTION_DAYS)
    deleted = 0
    for _ in range(_PURGE_BATCHES):
        ids = list(
            EdgeRequest.objects.filter(arrived_at__lt=cutoff).values_list("id", flat=True)[:_PURGE_BATCH]
        )
        if not ids:
            break
        deleted += EdgeRequest.objects.filter(id__in=ids).delete()[0]
    deleted += EdgeCoverage.objects.filter(covered_to__lt=cutoff).delete()[0]
    deleted += EdgeIntervalSummary.objects.filter(start__lt=cutoff).delete()[0]
    return deleted


def _period_close(endpoint_id: uuid.UUID | str, start: datetime, end: datetime, now: datetime) -> int:
    agreement = _agreement_for_window(endpoint_id, start, end)
    if agreement is None:
        return 0
    endpoint = Endpoint.objects.get(pk=endpoint_id)
    figures = selectors.sla_window(agreement=agreement, window_start=start, window_end=end, now=now)
    credit_pct = figures["edge"]["credit_pct"]
    credit_cents = round(agreement.monthly_fee_cents * credit_pct / 100.0)
    with transaction.atomic():
        period, created = SLAPeriod.objects.get_or_create(
            endpoint_id=endpoint_id,
            window_start=start,
            defaults={
                "organization_id": agreement.organization_id,
                "agreement": agreement,
                "window_end": end,
                "result": figures,
                "credit_pct": credit_pct,
                "credit_cents": credit_cents,
            },
        )
        if not created:
            return 0
        audit_record(
            actor=None,
            organization=agreement.organization_id,
            action="sla.period.close",
            target=period,
            data={
                "endpoint": str(endpoint_id),
                "version": agreement.version,
                "window_start": start.isoformat(),
                "status": figures["edge"]["status"],
                "compliance_pct": figures["edge"]["compliance_pct"],
                "engine_compliance_pct": (figures["engine"] or {}).get("compliance_pct"),
                "credit_pct": credit_pct,
                "credit_cents": credit_cents,
            },
            after=figures,
        )
        if credit_cents > 0:
            invoice_credit_add(
                organization=endpoint.organization,
                key=f"sla:{endpoint_id}:{start:%Y-%m}",
                amount_cents=credit_cents,
                currency=agreement.currency,
                description=f"SLA credit {credit_pct:g}% for {endpoint.name}, {start:%Y-%m} (terms v{agreement.version})",
                period_start=start,
                period_end=end,
                data={"endpoint": str(endpoint_id), "credit_pct": credit_pct},
            )
    return 1


def sla_alerts_check(*, now: datetime | None = None) -> int:
    """Raises `sla.breached` when an interval of the last hour breached, and `sla.at_risk` when the
    last hour burns the error budget SLA_BURN_RATE_ALERT times faster than the month allows. At
    most one of each per endpoint and hour. Returns alerts raised."""
    now = now or timezone.now()
    hour_start = now.replace(minute=0, second=0, microsecond=0)
    raised = 0
    for agreement in SLAAgreement.objects.filter(status=SLAAgreement.Status.IN_FORCE).select_related(
        "endpoint"
    )[:1000]:
        step = timedelta(seconds=agreement.interval_s)
        window_start, _ = sla.month_window(now)
        # The last hour's whole intervals, aligned to the month like the period's.
        lo = max(window_start, window_start + ((now - timedelta(hours=1) - window_start) // step) * step)
        recent = selectors.edge_intervals(agreement=agreement, start=lo, end=now)
        criteria = selectors.criteria(agreement)
        measured = [i for i in recent if i.covered and i.admitted]
        breached = [i for i in measured if selectors.interval_breaches(i, criteria)]
        objective = max((float(t["below_pct"]) for t in agreement.credit_tiers), default=99.0)
        rate = edge.burn_rate(
            breached_s=sum((i.end - i.start).total_seconds() for i in breached),
            measured_s=sum((i.end - i.start).total_seconds() for i in measured),
            objective_pct=objective,
        )
        endpoint = agreement.endpoint
        base = {
            "endpoint": str(endpoint.pk),
            "version": agreement.version,
            "link": f"{settings.SITE_URL}/sla/endpoints/{endpoint.pk}/",
        }
        with transaction.atomic():
            if breached:
                worst = breached[-1]
                raised += (
                    alert_raise(
                        organization=agreement.organization_id,
                        kind=AlertKind.SLA_BREACHED,
                        subject=f"sla:{endpoint.pk}:breached:{hour_start:%Y-%m-%dT%H}",
                        summary=f"SLA breached on {endpoint.name}",
                        data={
                            **base,
                            "interval_start": worst.start.isoformat(),
                            "ttft_p50_ms": worst.ttft_p50_ms,
                            "ttft_p95_ms": worst.ttft_p95_ms,
                            "availability_pct": worst.availability_pct,
                        },
                    )
                    is not None
                )
            if rate is not None and rate >= settings.SLA_BURN_RATE_ALERT:
                raised += (
                    alert_raise(
                        organization=agreement.organization_id,
                        kind=AlertKind.SLA_AT_RISK,
                        subject=f"sla:{endpoint.pk}:at_risk:{hour_start:%Y-%m-%dT%H}",
                        summary=f"SLA at risk on {endpoint.name}: error budget burning {rate:.1f}x",
                        data={**base, "burn_rate": round(rate, 2), "objective_pct": objective},
                    )
                    is not None
                )
    return raised


# --- Monitoring targets: the months of compliance's SLA terms ---------------------------------------


def sla_windows_close(*, now: datetime | None = None) -> int:
    """Freezes the result of every SLA terms' window that has ended and is not stored yet: each
    month from the endpoint's first to the previous one (normally just the previous month, right
    after it closes). Idempotent. Returns how many were stored."""
    current = now or timezone.now()
    this_start, _ = sla.month_window(current)
    stored = 0
    for terms in SLATerms.objects.select_related("endpoint").iterator():
        done = set(SLAWindowReport.objects.filter(terms=terms).values_list("window_start", flat=True))
        window_start, window_end = sla.month_window(terms.endpoint.created_at)
        while window_end <= this_start:
            if window_start not in done:
                stored += _sla_window_store(terms, window_start, current)
            window_start, window_end = sla.month_window(window_end)
    return stored


def _sla_window_store(terms: SLATerms, window_start: datetime, now: datetime) -> int:
    report = endpoint_selectors.sla_report(terms=terms, moment=window_start, now=now)
    result = compliance_selectors.sla_report_json(report, terms)
    with transaction.atomic():
        _, created = SLAWindowReport.objects.get_or_create(
            terms=terms,
            window_start=report.window_start,
            defaults={
                "organization_id": terms.organization_id,
                "window_end": report.window_end,
                "result": result,
            },
        )
        if not created:
            return 0
        audit_record(
            actor=None,
            organization=terms.organization_id,
            action="sla.window_close",
            target=terms,
            data={
                "window_start": result["window_start"],
                "status": result["status"],
                "compliance_pct": result["compliance_pct"],
                "credit_pct": result["credit_pct"],
            },
            after=result,
        )
    return 1


def _sla_windows_freeze(now: datetime) -> None:
    sla_windows_close(now=now)


# Registered with compliance.holders: retention freezes the ended windows before any of their
# snapshots can go (the endpoints' holder expires them).
SLA_HOLDER = DataHolder(name="sla", freeze=_sla_windows_freeze)


# --- The organization's own monitoring targets per endpoint ----------------------------------


def sla_terms_set(
    *,
    actor: Any,
    endpoint: Any,
    target_ms: float,
    metric: str = "ttft_p50_ms",
    source: str = "engine",
    credit_tiers: list[dict[str, float]] | None = None,
    min_coverage_pct: float = 90.0,
) -> Any:
    """Records (or replaces) an endpoint's monitoring targets: the organization's own objective,
    judged on the engine's metrics. Credits are not the customer's to set: they are the provider's
    terms in the two-party SLA agreement (portal.sla), so a customer sending credit tiers other
    than the ones already stored is refused (403) and the attempt is audited. Tiers stored before
    the agreement existed stay as they were."""
    organization = endpoint.organization
    require_role(actor=actor, organization=organization, minimum=Role.ADMIN, doing="set SLA terms")
    existing = SLATerms.objects.filter(endpoint=endpoint).first()
    stored_tiers = list(existing.credit_tiers) if existing is not None else []
    if credit_tiers and _tiers_key(credit_tiers) != _tiers_key(stored_tiers):
        reason = (
            "Credit tiers are the provider's terms: they come with the SLA agreement the provider "
            "proposes and your organization signs (SLA page), not with your own monitoring targets."
        )
        with transaction.atomic():
            audit_record(
                actor=actor,
                organization=organization,
                action="sla.refused.credit_tiers",
                target=endpoint,
                data={"endpoint": str(endpoint.pk), "reason": reason},
            )
        raise PermissionDenied(reason)
    errors: dict[str, str] = {}
    if metric not in SLATerms.Metric.values:
        errors["metric"] = f"Choose one of: {', '.join(SLATerms.Metric.values)}."
    if source not in SLATerms.Source.values:
        errors["source"] = f"Choose one of: {', '.join(SLATerms.Source.values)}."
    if not 0 < target_ms <= 600_000:
        errors["target_ms"] = "The target must be between 0 and 600000 ms."
    if not 0 <= min_coverage_pct <= 100:
        errors["min_coverage_pct"] = "Use 0 to 100."
    if errors:
        raise ValidationError(errors)
    values = {
        "metric": metric,
        "target_ms": float(target_ms),
        "source": source,
        "min_coverage_pct": float(min_coverage_pct),
    }
    with transaction.atomic():
        terms = SLATerms.objects.select_for_update().filter(endpoint=endpoint).first()
        before = None
        if terms is None:
            terms = SLATerms(organization=organization, endpoint=endpoint)
        else:
            before = {k: getattr(terms, k) for k in values}
        for key, value in values.items():
            setattr(terms, key, value)
        terms.updated_by = actor
        terms.save()
        audit_record(
            actor=actor,
            organization=organization,
            action="sla.terms_set",
            target=terms,
            data={"endpoint": str(endpoint.pk), **values},
            before=before,
            after=values,
        )
    return terms


def _tiers_key(tiers: list[dict[str, float]]) -> list[tuple[float, float]] | None:
    """Tiers in a comparable form (None when they are not numbers: never equal to stored ones)."""
    try:
        return sorted((float(t["below_pct"]), float(t["credit_pct"])) for t in tiers)
    except (KeyError, TypeError, ValueError):
        return None
