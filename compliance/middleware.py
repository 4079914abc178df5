"""Request id, idle-session timeout and the audit of staff access, in one middleware.

- Every request gets an id (a well-formed incoming X-Request-ID, or a new one) that audit
  events record and the response echoes.
- A signed-in session ends after SESSION_IDLE_TIMEOUT_S without activity. Background requests
  do not count as activity: htmx GETs (polling partials), and anything marked
  `X-Tailguard-Background: 1`. So a page left open that polls still times out.
- Staff users working in the Django admin are audited request by request (method and path, not
  the query string or the body), on the platform chain.
- Two-factor: a session of someone who must use it (an owner of an organization with an
  effective BAA, or anyone who enrolled) reaches nothing but the two-factor page until a code
  has been verified in this session. API tokens are a separate credential and are not affected.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse

from compliance import context
from portal.accounts import ports

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")
LAST_ACTIVITY_KEY = "_tailguard_last_activity"
# The id of the user whose code this session verified (a name shared with portal.accounts).
TWO_FACTOR_KEY = ports.TWO_FACTOR_KEY
_TWO_FACTOR_EXEMPT_URLS = ("compliance:two_factor", "accounts:logout", "accounts:login", "healthz")
# Assets hold nothing of a tenant's. Redirecting them is worse than useless: a browser fetches
# /favicon.ico by itself, and each bounce loaded the two-factor page again.
_TWO_FACTOR_EXEMPT_PATHS = ("/favicon.ico", "/robots.txt")
_TWO_FACTOR_EXEMPT_PREFIXES = ("/vendor/",)
# Activity is written to the session at most this often, not on every request.
_ACTIVITY_RESOLUTION_S = 30


def is_background(request: HttpRequest) -> bool:
    if request.headers.get("X-Tailguard-Background") == "1":
        return True
    return request.method == "GET" and request.headers.get("HX-Request") == "true"


class ComplianceMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        token = context.request_id.set(request_id)
        try:
            expired = self._idle_check(request) or self._two_factor_check(request)
            if expired is not None:
                response = expired
            else:
                self._audit_staff(request)
                response = self.get_response(request)
        finally:
            context.request_id.reset(token)
        response["X-Request-ID"] = request_id
        return response

    def _idle_check(self, request: HttpRequest) -> HttpResponse | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not hasattr(request, "session"):
            return None
        now = time.time()
        last = request.session.get(LAST_ACTIVITY_KEY)
        if last is not None and now - float(last) > settings.SESSION_IDLE_TIMEOUT_S:
            logout(request)
            login = reverse(settings.LOGIN_URL)
            if request.path.startswith("/api/"):
                return None  # the API view now sees an anonymous user and answers 401/403
            if request.headers.get("HX-Request") == "true":
                response = HttpResponse(status=200)
                response["HX-Redirect"] = login
                return response
            return HttpResponseRedirect(f"{login}?{urlencode({'next': request.get_full_path()})}")
        if not is_background(request) and (last is None or now - float(last) >= _ACTIVITY_RESOLUTION_S):
            request.session[LAST_ACTIVITY_KEY] = now
        return None

    def _two_factor_check(self, request: HttpRequest) -> HttpResponse | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not hasattr(request, "session"):
            return None
        if request.session.get(TWO_FACTOR_KEY) == str(user.pk):
            return None
        page = reverse("compliance:two_factor")
        exempt = {reverse(name) for name in _TWO_FACTOR_EXEMPT_URLS}
        if (
            request.path in exempt
            or request.path in _TWO_FACTOR_EXEMPT_PATHS
            or request.path.startswith((settings.STATIC_URL, *_TWO_FACTOR_EXEMPT_PREFIXES))
        ):
            return None
        from compliance.selectors import two_factor_required

        if not two_factor_required(user=user):
            return None
        if request.path.startswith("/api/"):
            return JsonResponse(
                {
                    "detail": "Two-factor verification is required: verify a code on the two-factor page first."
                },
                status=403,
            )
        if request.headers.get("HX-Request") == "true":
            response = HttpResponse(status=200)
            response["HX-Redirect"] = page
            return response
        return HttpResponseRedirect(f"{page}?{urlencode({'next': request.get_full_path()})}")

    def _audit_staff(self, request: HttpRequest) -> None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not user.is_staff:
            return
        if not request.path.startswith("/admin/") or request.path.startswith("/admin/jsi18n/"):
            return
        from compliance.services import audit_record

        audit_record(
            actor=user,
            action="staff.access",
            data={"method": request.method, "path": request.path[:256]},
        )
