"""Which organization a request acts in, and tenant-scoped object access for HTML views.

The current organization lives in the session; it is re-checked against the user's memberships
on every request, so a removed member loses access at once. Objects of another organization
answer 404, exactly like missing ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.decorators import login_required
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.shortcuts import redirect

from portal.accounts.models import Membership, Organization

SESSION_KEY = "organization_id"
M = TypeVar("M", bound=Model)
R = TypeVar("R", bound=HttpResponseBase)


def current_membership(request: HttpRequest) -> Membership | None:
    cached = getattr(request, "_tailguard_membership", False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    membership = None
    user = request.user
    if user.is_authenticated:
        memberships = Membership.objects.select_related("organization").filter(user=user)
        wanted = request.session.get(SESSION_KEY)
        if wanted:
            membership = memberships.filter(organization_id=wanted).first()
        if membership is None:
            membership = memberships.order_by("organization__name").first()
            if membership is not None:
                request.session[SESSION_KEY] = str(membership.organization_id)
    request._tailguard_membership = membership  # type: ignore[attr-defined]
    return membership


def set_current_organization(request: HttpRequest, organization: Organization) -> None:
    request.session[SESSION_KEY] = str(organization.id)
    request._tailguard_membership = False  # type: ignore[attr-defined]


def member_required(view: Callable[..., R]) -> Callable[..., R | HttpResponseRedirect]:
    """Login plus a membership; people without an organization are sent to create one."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> R | HttpResponseRedirect:
        membership = current_membership(request)
        if membership is None:
            return redirect("accounts:organization_create")
        request.membership = membership  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper


def get_object_for_member(request: HttpRequest, queryset: QuerySet[M], object_id: object) -> M:
    """The object with this id in the request's current organization, or 404."""
    membership = current_membership(request)
    if membership is None:
        raise Http404
    try:
        uuid.UUID(str(object_id))
    except ValueError:
        raise Http404 from None
    obj = queryset.filter(organization=membership.organization, pk=object_id).first()
    if obj is None:
        raise Http404
    return obj
