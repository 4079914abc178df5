from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from portal.accounts.tenancy import current_membership


def current_organization(request: HttpRequest) -> dict[str, Any]:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    membership = current_membership(request)
    return {
        "current_membership": membership,
        "current_organization": membership.organization if membership else None,
        "my_memberships": request.user.memberships.select_related("organization").order_by(
            "organization__name"
        ),
    }
