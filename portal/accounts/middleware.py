"""Every web request in one transaction whose row-level security scope is set before the view.

The request's tenant is the session's current organization (chosen among the signed-in user's
own memberships, which the membership table's second policy shows once the user is declared).
An API request signed with a token has no session user here; `ApiTokenAuthentication` declares
the token's organization when it accepts the token. Staff in Django's admin act platform-wide;
the other staff tools (benchmark reports, the SLA console) declare it in their own checks. A
request that is none of these (signed out, no organization yet) sees no tenant rows at all.

The transaction spans the view and the rendering of its response (templates evaluate querysets
lazily), so nothing of the request runs outside its scope. A response with a server error
rolls the request's writes back: no half-written record survives a crash in a view.

Only on PostgreSQL: SQLite has no row-level security, and the embedded setup keeps Django's
default autocommit there.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse

from portal.accounts import acting, rls
from portal.accounts.tenancy import current_membership

ADMIN_PREFIX = "/admin/"


class RequestScopeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # An API token's role cap (set when the token is accepted) ends with its request.
        cap = acting.begin_request()
        try:
            if connection.vendor != "postgresql":
                return self.get_response(request)
            with transaction.atomic():
                request_scope(request)
                response = self.get_response(request)
                if response.status_code >= 500:
                    transaction.set_rollback(True)
            return response
        finally:
            acting.end_request(cap)


def request_scope(request: HttpRequest) -> None:
    """Declare the request's user and tenant (or the platform scope) in its open transaction."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return
    if user.is_staff and request.path.startswith(ADMIN_PREFIX):
        rls.scope_transaction(platform=True, user_id=user.pk)
        return
    rls.scope_transaction(user_id=user.pk)
    membership = current_membership(request)
    if membership is not None:
        rls.scope_transaction(organization_id=membership.organization_id)
