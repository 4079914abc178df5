"""Reads of the accounts app. Everything tenant-owned is filtered by organization here."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from portal.accounts.models import ApiToken, Invitation, Membership, Organization, User


def organization_list_for_user(*, user: User) -> QuerySet[Organization]:
    return Organization.objects.filter(memberships__user=user).order_by("name")


def membership_get(*, user: User, organization_id: uuid.UUID | str) -> Membership | None:
    try:
        uuid.UUID(str(organization_id))
    except ValueError:
        # A malformed id is simply not a membership.
        return None
    return (
        Membership.objects.select_related("organization")
        .filter(user=user, organization_id=organization_id)
        .first()
    )


def membership_list_for_user(*, user: User) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("organization").order_by("organization__name")


def member_list(*, organization: Organization) -> QuerySet[Membership]:
    return Membership.objects.filter(organization=organization).select_related("user").order_by("user__email")


def member_get(*, organization: Organization, membership_id: int) -> Membership | None:
    return (
        Membership.objects.filter(organization=organization, pk=membership_id)
        .select_related("user", "organization")
        .first()
    )


def invitation_list_pending(*, organization: Organization) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        organization=organization, accepted_at__isnull=True, revoked_at__isnull=True
    ).order_by("-created_at")


def invitation_get(*, organization: Organization, invitation_id: uuid.UUID | str) -> Invitation | None:
    return Invitation.objects.filter(organization=organization, id=invitation_id).first()


def api_token_list(*, organization: Organization) -> QuerySet[ApiToken]:
    return (
        ApiToken.objects.filter(organization=organization)
        .select_related("created_by")
        .order_by("-created_at")
    )


def api_token_get(*, organization: Organization, token_id: uuid.UUID | str) -> ApiToken | None:
    return (
        ApiToken.objects.filter(organization=organization, id=token_id).select_related("organization").first()
    )
