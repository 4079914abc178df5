"""The refusals every compliance write checks before it writes anything: the actor's role, the
organization's data-residency rule and its BAA rule."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError

from compliance import selectors
from compliance.models import (
    BAARecord,
)
from portal.accounts.models import Membership, Organization, User

logger = logging.getLogger(__name__)


def _require(actor: User, organization: Organization, minimum: str, doing: str) -> None:

    membership = Membership.objects.filter(user=actor, organization=organization).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organization.")
    if not membership.has_role(minimum):
        raise PermissionDenied(f"Only an {minimum} or above can {doing}; your role is {membership.role}.")


def residency_require(*, organization: Organization, region: str, doing: str, field: str = "region") -> None:
    """Refuses, before anything is written, data or compute outside the organization's regions."""
    allowed = selectors.allowed_regions(organization=organization)
    if region not in allowed:
        raise ValidationError(
            {
                field: (
                    f"Refused by the data-residency rule of {organization.name}: data and compute may only be in "
                    f"{', '.join(allowed) or 'no region'}; {doing} would be in {region!r}."
                )
            },
            code="residency",
        )


def storage_region_for(*, organization: Organization) -> str:
    """Where this organization's new objects go: chosen by policy, never by the caller."""
    allowed = selectors.allowed_regions(organization=organization)
    for region in settings.COMPLIANCE_REGIONS:
        if region in allowed:
            return region
    raise ValidationError(
        {
            "region": (
                f"Refused by the data-residency rule of {organization.name}: none of its allowed regions "
                f"({', '.join(allowed) or 'none'}) is available in this deployment "
                f"({', '.join(settings.COMPLIANCE_REGIONS)})."
            )
        },
        code="residency",
    )


def baa_require(*, organization: Organization, doing: str, field: str) -> BAARecord:
    baa = selectors.baa_effective(organization=organization)
    if baa is None:
        raise ValidationError(
            {
                field: (
                    f"Refused by the BAA rule: {organization.name} has no effective business associate "
                    f"agreement, so it cannot {doing}. An owner or admin records the signed BAA on the "
                    "Compliance page first, and it is in effect once the provider has countersigned it."
                )
            },
            code="baa",
        )
    return baa
