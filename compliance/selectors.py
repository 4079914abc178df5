"""Reads of the compliance app. Everything tenant-owned is filtered by organization here."""

from __future__ import annotations

import uuid
from datetime import date
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from compliance import chain, endpoint_sla
from compliance.models import AuditEvent, BAARecord, ResidencyPolicy, RetentionPolicy, StoredObject
from portal.accounts import rls
from portal.accounts.models import Membership, Organization, Role


def audit_event_list(*, organization: Any) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(organization=organization).select_related("actor")


def audit_event_chain(*, organization: Any) -> QuerySet[AuditEvent]:
    """The organization's chain in order, first event first."""
    return AuditEvent.objects.filter(
        chain=chain.chain_key(getattr(organization, "pk", organization))
    ).order_by("seq")


def allowed_regions(*, organization: Any) -> list[str]:
    policy = ResidencyPolicy.objects.filter(organization=organization).first()
    if policy is None:
        return list(settings.COMPLIANCE_DEFAULT_REGIONS)
    return list(policy.allowed_regions)


def residency_is_default(*, organization: Any) -> bool:
    return not ResidencyPolicy.objects.filter(organization=organization).exists()


def retention_settings(*, organization: Any) -> dict[str, Any]:
    policy = RetentionPolicy.objects.filter(organization=organization).first()
    default_metrics = settings.COMPLIANCE_METRIC_RETENTION_DAYS
    if policy is None:
        return {
            "sample_retention_days": settings.COMPLIANCE_SAMPLE_RETENTION_DAYS,
            "metric_retention_days": default_metrics,
            "retain_prompt_text": False,
        }
    return {
        "sample_retention_days": policy.sample_retention_days,
        "metric_retention_days": policy.metric_retention_days or default_metrics,
        "retain_prompt_text": policy.retain_prompt_text,
    }


def baa_list(*, organization: Any) -> QuerySet[BAARecord]:
    return BAARecord.objects.filter(organization=organization).select_related("document", "recorded_by")


def baa_awaiting_countersignature(*, limit: int = 200) -> list[BAARecord]:
    """Every tenant's BAAs the provider has not countersigned yet (the console, platform scope)."""
    return list(
        BAARecord.objects.filter(countersigned_at__isnull=True)
        .select_related("organization", "recorded_by")
        .order_by("recorded_at")[: max(1, min(limit, 1000))]
    )


def baa_get(*, organization: Any, baa_id: uuid.UUID | str) -> BAARecord | None:
    return baa_list(organization=organization).filter(id=baa_id).first()


def baa_effective(*, organization: Any, on: date | None = None) -> BAARecord | None:
    """The BAA in effect on `on` (today, UTC, by default), if any: countersigned by the provider
    and within its effective dates. A BAA only the customer recorded is not in effect."""
    day = on or timezone.now().date()
    return (
        BAARecord.objects.filter(
            organization=organization, effective_on__lte=day, countersigned_at__isnull=False
        )
        .exclude(ends_on__lt=day)
        .order_by("-effective_on")
        .first()
    )


def stored_object_list(*, organization: Any) -> QuerySet[StoredObject]:
    return StoredObject.objects.filter(organization=organization).order_by("-created_at")


# --- SLA --------------------------------------------------------------------------------------


def sla_report_json(report: Any, terms: Any) -> dict[str, Any]:
    def span(s: Any) -> dict[str, Any]:
        return {"start": s.start.isoformat(), "end": s.end.isoformat(), "worst_ms": s.worst_ms}

    return {
        "metric": terms.metric,
        "target_ms": terms.target_ms,
        "source": terms.source,
        "window_start": report.window_start.isoformat(),
        "window_end": report.window_end.isoformat(),
        "judged_until": report.judged_until.isoformat(),
        "status": report.status,
        "compliance_pct": report.compliance_pct,
        "compliance_pct_gaps_as_breach": report.compliance_pct_gaps_as_breach,
        "coverage_pct": report.coverage_pct,
        "compliant_s": report.compliant_s,
        "breached_s": report.breached_s,
        "idle_s": report.idle_s,
        "gap_s": report.gap_s,
        "credit_pct": report.credit_pct,
        "credit_basis": report.credit_basis,
        "breaches": [span(s) for s in report.breaches],
        "gaps": [{"start": s.start.isoformat(), "end": s.end.isoformat()} for s in report.gaps],
    }


def console_rows(*, q: str = "", baa: str = "", sla_status: str = "") -> list[dict[str, Any]]:
    """Every tenant with its residency, BAA and endpoints' SLA status (platform admins only; the
    endpoints' rows are portal.sla's: `compliance.endpoint_sla`)."""

    rows = []
    organizations = Organization.objects.order_by("name")
    if q:
        organizations = organizations.filter(name__icontains=q)
    for organization in organizations:
        effective = baa_effective(organization=organization)
        if (baa == "yes" and effective is None) or (baa == "no" and effective is not None):
            continue
        endpoints = endpoint_sla.endpoint_sla_rows(organization=organization)
        if sla_status:
            endpoints = [
                e
                for e in endpoints
                if (e["report"].status if e["report"] is not None else "no terms") == sla_status
            ]
            if not endpoints:
                continue
        rows.append(
            {
                "organization": organization,
                "allowed_regions": allowed_regions(organization=organization),
                "baa": effective,
                "endpoints": endpoints,
            }
        )
    return rows


# --- Two-factor -------------------------------------------------------------------------------


def totp_confirmed(*, user: Any) -> bool:
    from compliance.models import TOTPDevice

    return TOTPDevice.objects.filter(user=user, confirmed_at__isnull=False).exists()


def totp_pending_secret(*, user: Any) -> str | None:
    """The secret of `user`'s authenticator awaiting its first code, or None (none made yet, or
    already confirmed). A read: the key is made only by `services.totp_enroll_start`."""
    from compliance.models import TOTPDevice
    from compliance.storage import unseal

    device = TOTPDevice.objects.filter(user=user, confirmed_at__isnull=True).first()
    if device is None:
        return None
    return unseal(bytes(device.secret_encrypted), purpose="totp-secret").decode()


def totp_recovery_codes_left(*, user: Any) -> int:
    from compliance.models import TOTPRecoveryCode

    return TOTPRecoveryCode.objects.filter(user=user, used_at__isnull=True).count()


def two_factor_required(*, user: Any) -> bool:
    """Owners of an organization with a BAA on record for today must use two-factor (from the
    moment they record it: the customer means to send PHI, whether or not the provider has
    countersigned yet); anyone who enrolled an authenticator uses it too."""

    if totp_confirmed(user=user):
        return True
    day = timezone.now().date()
    # Across every organization the user owns, whichever one the request acts in.
    with rls.platform_transaction():
        owned = Membership.objects.filter(user=user, role=Role.OWNER).values_list(
            "organization_id", flat=True
        )
        return (
            BAARecord.objects.filter(organization_id__in=list(owned), effective_on__lte=day)
            .exclude(ends_on__lt=day)
            .exists()
        )
