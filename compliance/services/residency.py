"""Data residency: where an organization's data and the hardware it uses may be."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from compliance import selectors
from compliance.models import (
    ResidencyPolicy,
    StoredObject,
)
from compliance.services.audit import audit_record
from compliance.services.rules import _require, residency_require
from portal.accounts.models import Organization, User

logger = logging.getLogger(__name__)

# --- Residency --------------------------------------------------------------------------------


def residency_policy_set(
    *, actor: User, organization: Organization, allowed_regions: list[str]
) -> ResidencyPolicy:
    _require(actor, organization, "owner", "change data residency")
    regions = sorted({r.strip() for r in allowed_regions if r and r.strip()})
    if not regions:
        raise ValidationError({"allowed_regions": "Allow at least one region."})
    unknown = [r for r in regions if r not in settings.COMPLIANCE_REGIONS]
    if unknown:
        raise ValidationError(
            {
                "allowed_regions": (
                    f"Unknown region {', '.join(unknown)}; this deployment has {', '.join(settings.COMPLIANCE_REGIONS)}."
                )
            }
        )
    stranded = (
        StoredObject.objects.filter(organization=organization)
        .exclude(region__in=regions)
        .values_list("region", flat=True)
    )
    if stranded:
        where = ", ".join(sorted(set(stranded)))
        raise ValidationError(
            {
                "allowed_regions": (
                    f"Refused by the data-residency rule: {len(stranded)} stored object(s) are in {where}; "
                    "delete them before removing the region."
                )
            }
        )
    with transaction.atomic():
        before = selectors.allowed_regions(organization=organization)
        policy, _ = ResidencyPolicy.objects.select_for_update().get_or_create(
            organization=organization, defaults={"allowed_regions": regions, "updated_by": actor}
        )
        policy.allowed_regions = regions
        policy.updated_by = actor
        policy.save()
        audit_record(
            actor=actor,
            organization=organization,
            action="residency.set",
            target=policy,
            data={"allowed_regions": regions, "previous": before},
            before={"allowed_regions": before},
            after={"allowed_regions": regions},
        )
    return policy


# --- Hardware residency --------------------------------------------------------------------------------------


def residency_require_hardware(*, organization: Organization, hardware: str, doing: str) -> None:
    """For compute (tuning jobs, endpoints): the hardware's region must be allowed."""
    from tuning.search.job import HARDWARE

    target = HARDWARE.get(hardware)
    if target is None:
        raise ValidationError({"hardware": f"unknown hardware {hardware!r}"})
    # A local target runs on this machine, whose region the deployment declares (validated settings).
    region = target.region or settings.LOCAL_HARDWARE_REGION
    residency_require(organization=organization, region=region, doing=doing, field="hardware")
