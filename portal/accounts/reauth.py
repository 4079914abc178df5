"""Re-authentication before sensitive actions ("sudo mode").

A stolen session cookie, or a session left open on a shared screen, must not be enough to mint
an API token, delete the organization or change the second factor. Those actions need the
person's password (and their two-factor code, once they have an authenticator) within the last
REAUTH_MAX_AGE_S: signing in counts, and so does the re-authentication page
(`accounts:reauth`, or `POST /api/v1/me/reauthenticate/` for an API client with a session).

The policy is one table (SENSITIVE_ACTIONS) checked by `ReauthMiddleware` in `process_view`,
after the CSRF check, so the views that carry these actions need no change of their own:

- a session that is not fresh is sent to the re-authentication page and back to the page the
  form was on (the POST is not replayed: the person submits it again, now confirmed);
- setting up an authenticator for the first time happens before the session's two-factor step,
  where only the sign-in page is reachable: a stale session signs in again instead;
- an API token is a credential of its own, never a person's confirmation: a request signed with
  one is refused these actions outright.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from portal.accounts import ports

SESSION_KEY = "_tailguard_reauth"


@dataclass(frozen=True)
class SensitiveAction:
    doing: str  # what the person is about to do, for the messages ("create an API token")
    methods: frozenset[str]
    # Where the person goes back to after confirming, when the request names no page of ours.
    back_to: str
    # Whether this particular request is the sensitive one (e.g. one action of a form).
    applies: Callable[[HttpRequest], bool] = lambda request: True


def _two_factor_change(request: HttpRequest) -> bool:
    action = request.POST.get("action", "verify")
    if action in ("new_key", "new_recovery_codes"):
        return True
    # Confirming a first authenticator binds the account to it: it needs a fresh password.
    return action == "verify" and not ports.compliance().second_factor_confirmed(user=request.user)


SENSITIVE_ACTIONS: dict[str, SensitiveAction] = {
    "accounts:api_tokens": SensitiveAction("create an API token", frozenset({"POST"}), "accounts:api_tokens"),
    "api:tokens": SensitiveAction("create an API token", frozenset({"POST"}), "accounts:api_tokens"),
    "compliance:organization_delete": SensitiveAction(
        "delete the organization", frozenset({"POST"}), "compliance:overview"
    ),
    "api:compliance_organization_delete": SensitiveAction(
        "delete the organization", frozenset({"POST", "DELETE"}), "compliance:overview"
    ),
    "compliance:two_factor": SensitiveAction(
        "change your two-factor authenticator",
        frozenset({"POST"}),
        "compliance:two_factor",
        _two_factor_change,
    ),
}


def mark_fresh(request: HttpRequest, user: Any = None) -> None:
    """The person (the request's user unless named) just proved who they are: signed in, or
    re-authenticated."""
    person = user if user is not None else request.user
    request.session[SESSION_KEY] = {"user": str(person.pk), "at": time.time()}


def is_fresh(request: HttpRequest) -> bool:
    record = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
    if not isinstance(record, dict) or record.get("user") != str(request.user.pk):
        return False
    try:
        age_s = time.time() - float(record["at"])
    except (KeyError, TypeError, ValueError):
        return False
    return 0 <= age_s <= settings.REAUTH_MAX_AGE_S


def safe_next(request: HttpRequest, candidate: str, default: str) -> str:
    if candidate and url_has_allowed_host_and_scheme(
        candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return candidate
    return default


def _back_to(request: HttpRequest, action: SensitiveAction) -> str:
    referer = request.headers.get("Referer", "")
    parts = urlsplit(referer)
    if referer and parts.netloc == request.get_host() and parts.path:
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return reverse(action.back_to)


def _uses_api_token(request: HttpRequest) -> bool:
    return request.headers.get("Authorization", "").strip().lower().startswith("bearer ")


class ReauthMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponse | None:
        match = getattr(request, "resolver_match", None)
        action = SENSITIVE_ACTIONS.get(match.view_name) if match is not None else None
        if action is None or request.method not in action.methods:
            return None
        is_api = request.path.startswith("/api/")
        if is_api and _uses_api_token(request):
            return JsonResponse(
                {
                    "detail": f"An API token cannot {action.doing}: sign in as a person and "
                    "confirm your password (and two-factor code) first."
                },
                status=403,
            )
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None  # the view refuses it (or the API authenticates it some other way)
        if not action.applies(request) or is_fresh(request):
            return None
        minutes = max(1, settings.REAUTH_MAX_AGE_S // 60)
        if is_api:
            return JsonResponse(
                {
                    "detail": f"Confirm it is you to {action.doing}: POST your password (and "
                    f"two-factor code) to {reverse('api:reauthenticate')}, then repeat this "
                    f"request within {minutes} minutes."
                },
                status=403,
            )
        back = _back_to(request, action)
        verified = request.session.get(ports.TWO_FACTOR_KEY) == str(user.pk)
        if not verified and ports.compliance().second_factor_required(user=user):
            # Before the session's two-factor step only signing in is reachable: sign in again.
            logout(request)
            messages.info(request, f"Sign in again to {action.doing}.")
            return HttpResponseRedirect(f"{reverse(settings.LOGIN_URL)}?{urlencode({'next': back})}")
        messages.info(request, f"Confirm it is you to {action.doing}, then send the form again.")
        target = f"{reverse('accounts:reauth')}?{urlencode({'next': back})}"
        if request.headers.get("HX-Request") == "true":
            response = HttpResponse(status=200)
            response["HX-Redirect"] = target
            return response
        return HttpResponseRedirect(target)
