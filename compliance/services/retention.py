"""Retention: per-organization policies, their enforcement, and the deletion of an organization's data."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from compliance import holders, selectors
from compliance.models import (
    RetentionPolicy,
    StoredObject,
)
from compliance.services.audit import audit_record
from compliance.services.rules import _require, baa_require
from compliance.storage import get_store
from portal.accounts.models import Organization, User

logger = logging.getLogger(__name__)

# --- Retention and deletion -------------------------------------------------------------------


MIN_METRIC_RETENTION_DAYS = 35


def retention_policy_set(
    *,
    actor: User,
    organization: Organization,
    sample_retention_days: int,
    retain_prompt_text: bool = False,
    metric_retention_days: int | None = None,
) -> RetentionPolicy:
    _require(actor, organization, "owner", "change data retention")
    if not 1 <= sample_retention_days <= 3650:
        raise ValidationError({"sample_retention_days": "Use 1 to 3650 days."})
    if metric_retention_days is not None and not MIN_METRIC_RETENTION_DAYS <= metric_retention_days <= 3650:
        raise ValidationError(
            {
                "metric_retention_days": (
                    f"Use {MIN_METRIC_RETENTION_DAYS} to 3650 days: monthly SLA windows are closed from them."
                )
            }
        )
    if retain_prompt_text:
        baa_require(organization=organization, doing="retain prompt text", field="retain_prompt_text")
    with transaction.atomic():
        before = selectors.retention_settings(organization=organization)
        policy, _ = RetentionPolicy.objects.select_for_update().get_or_create(
            organization=organization,
            defaults={"sample_retention_days": sample_retention_days, "updated_by": actor},
        )
        policy.sample_retention_days = sample_retention_days
        policy.metric_retention_days = metric_retention_days
        policy.retain_prompt_text = retain_prompt_text
        policy.updated_by = actor
        policy.save()
        after = selectors.retention_settings(organization=organization)
        audit_record(
            actor=actor,
            organization=organization,
            action="retention.set",
            target=policy,
            data=after,
            before=before,
            after=after,
        )
    return policy


def retention_enforce(*, now: datetime | None = None) -> dict[str, int]:
    """Deletes what is past each organization's retention: expired sensitive objects here, and
    whatever each registered data holder keeps (traffic samples with their objects and files,
    endpoint metric snapshots: `compliance.holders`). Idempotent; the scheduled task calls it.
    Returns counts."""

    moment = now or timezone.now()
    registered = holders.holders()
    counts = {"objects": 0}
    for holder in registered:
        counts.update({name: 0 for name in holder.counts})
    store = get_store()
    # What is computed from data that may go now (closed SLA windows, from their snapshots) is
    # stored before any holder expires anything.
    for holder in registered:
        if holder.freeze is not None:
            holder.freeze(moment)
    for organization in Organization.objects.all().iterator():
        retention = selectors.retention_settings(organization=organization)
        cutoffs = holders.RetentionCutoffs(
            samples=moment - timedelta(days=retention["sample_retention_days"]),
            sample_days=retention["sample_retention_days"],
            metrics=moment - timedelta(days=retention["metric_retention_days"]),
            metric_days=retention["metric_retention_days"],
        )
        expired_objects = StoredObject.objects.filter(
            organization=organization, kind=StoredObject.Kind.SAMPLE_UPLOAD, created_at__lt=cutoffs.samples
        )
        for obj in expired_objects:
            store.delete(region=obj.region, key=obj.key)
            with transaction.atomic():
                audit_record(
                    actor=None,
                    organization=organization,
                    action="retention.object_delete",
                    target=obj,
                    data={"region": obj.region, "retention_days": cutoffs.sample_days},
                )
                obj.delete()
            counts["objects"] += 1
        for holder in registered:
            if holder.expire is not None:
                for name, value in holder.expire(organization, cutoffs).items():
                    counts[name] = counts.get(name, 0) + value
    return counts


def organization_data_delete(*, actor: User, organization: Organization, confirm: str) -> dict[str, int]:
    """Deletes everything an organization has: its objects in every region of the deployment
    (not only the allowed ones: a past policy may have allowed others), its files and its rows
    (each registered data holder's share, `compliance.holders`). What remains is the audit trail,
    which never held its data, ending with this deletion."""
    _require(actor, organization, "owner", "delete the organization's data")
    if confirm != organization.slug:
        raise ValidationError({"confirm": f"Type the organization's slug ({organization.slug}) to confirm."})
    registered = holders.holders()
    for holder in registered:
        reason = holder.refuse_deletion(organization) if holder.refuse_deletion is not None else ""
        if reason:
            raise ValidationError({"confirm": reason})
    store = get_store()
    prefix = f"org/{organization.pk}/"
    per_region: dict[str, int] = {}
    for region in settings.COMPLIANCE_REGIONS:
        per_region[region] = store.delete_prefix(region=region, prefix=prefix)
    for holder in registered:
        if holder.remove_files is not None:
            holder.remove_files(organization)
    organization_id, name = organization.pk, organization.name
    with transaction.atomic():
        counts = {"objects": sum(per_region.values())}
        for holder in registered:
            if holder.count is not None:
                counts.update(holder.count(organization))
        audit_record(
            actor=actor,
            organization=organization_id,
            action="organization.data_delete",
            data={"name": name, "objects_by_region": per_region, **counts},
        )
        for holder in registered:
            if holder.delete_rows is not None:
                holder.delete_rows(organization)
        organization.delete()
    return counts
