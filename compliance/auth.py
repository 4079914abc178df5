"""Sign-in throttling: after too many failures for one address (or from one IP address) within
the window, further attempts are refused without checking the password."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils import timezone

from compliance.models import LoginFailure


def _email_digest(username: str | None) -> str:
    return hashlib.sha256((username or "").strip().lower().encode()).hexdigest()


def _client_ip(request: HttpRequest | None) -> str | None:
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


class ThrottledModelBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if username is None:
            username = kwargs.get("email")
        digest, ip = _email_digest(username), _client_ip(request)
        since = timezone.now() - timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S)
        recent = LoginFailure.objects.filter(at__gte=since)
        limit = settings.LOGIN_THROTTLE_FAILURES
        # Per address, and per IP at a higher bar (one office shares an address).
        if recent.filter(email_digest=digest).count() >= limit or (
            ip and recent.filter(ip=ip).count() >= 4 * limit
        ):
            raise PermissionDenied("too many failed sign-ins; try again later")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            LoginFailure.objects.create(email_digest=digest, ip=ip)
            # Stops Django from asking the next backend (ModelBackend) the same question.
            raise PermissionDenied("invalid credentials")
        LoginFailure.objects.filter(email_digest=digest).delete()
        return user
