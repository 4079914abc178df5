"""Reads of the compliance app. Everything tenant-owned is filtered by organization here."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from compliance import chain
from compliance.models import AuditEvent, BAARecord, ResidencyPolicy, RetentionPolicy, StoredObject


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
    if policy is None:
        return {
            "sample_retention_days": settings.COMPLIANCE_SAMPLE_RETENTION_DAYS,
            "retain_prompt_text": False,
        }
    return {
        "sample_retention_days": policy.sample_retention_days,
        "retain_prompt_text": policy.retain_prompt_text,
    }


def baa_list(*, organization: Any) -> QuerySet[BAARecord]:
    return BAARecord.objects.filter(organization=organization).select_related("document", "recorded_by")


def baa_get(*, organization: Any, baa_id: object) -> BAARecord | None:
    return baa_list(organization=organization).filter(id=baa_id).first()


def baa_effective(*, organization: Any, on: date | None = None) -> BAARecord | None:
    """The BAA in effect on `on` (today, UTC, by default), if any."""
    day = on or timezone.now().date()
    return (
        BAARecord.objects.filter(organization=organization, effective_on__lte=day)
        .exclude(ends_on__lt=day)
        .order_by("-effective_on")
        .first()
    )


def stored_object_list(*, organization: Any) -> QuerySet[StoredObject]:
    return StoredObject.objects.filter(organization=organization).order_by("-created_at")
