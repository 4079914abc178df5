"""Request types for views behind `login_required` / `member_required`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest

if TYPE_CHECKING:
    from django_htmx.middleware import HtmxDetails

    from portal.accounts.models import Membership, User


class AuthenticatedRequest(HttpRequest):
    """An `HttpRequest` whose user is signed in (the view is behind `login_required`).

    For type checking only: Django still passes a plain `HttpRequest`; the login check is what
    guarantees `user` is a `User` and never an `AnonymousUser`.
    """

    user: User
    htmx: HtmxDetails  # set by django-htmx's middleware on every request


class MemberRequest(AuthenticatedRequest):
    """A request behind `member_required`: the signed-in user's membership of the organization
    the request acts in (set by the organization middleware). For type checking only."""

    membership: Membership
