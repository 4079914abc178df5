"""Sign-in throttling and the sign-in audit trail.

Failures are counted in three scopes, each with its own free allowance within
LOGIN_THROTTLE_WINDOW_S, beyond which attempts wait an exponential back-off after the scope's
latest failure (LOGIN_THROTTLE_BASE_DELAY_S doubling, capped at LOGIN_THROTTLE_MAX_DELAY_S):

- one account from one client address (the guessing attacker's own scope);
- one account from anywhere (guessing spread over many addresses), at a higher allowance;
- one client address for any account (one address trying many accounts), at a higher allowance.

No scope ever blocks for longer than the cap, so someone else's wrong guesses keep a correct
password out for at most LOGIN_THROTTLE_MAX_DELAY_S, and an attacker gets one guess per cap
per scope. An attempt refused by the throttle is not counted and its password is not checked.

The client address is the connection's, or behind a proxy listed in TRUSTED_PROXIES the nearest
untrusted address of X-Forwarded-For: every user behind the proxy keeps their own address.

Counting is atomic: the scopes' transaction-level advisory locks (PostgreSQL) are taken before
the failures are counted, and an attempt is recorded as a failure before its password is
checked (removed again when it succeeds), so parallel guesses cannot pass the allowance.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import Count, Max, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from compliance.models import LoginFailure
from compliance.services import audit_record

# Where the backend leaves the wait it imposed, for the sign-in form's message (a name shared
# with portal.accounts, defined there).
from portal.accounts.ports import RETRY_AFTER_ATTR


def email_digest(username: str | None) -> str:
    return hashlib.sha256((username or "").strip().lower().encode()).hexdigest()


def _networks(values: list[Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(str(value), strict=False) for value in values]


def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(value.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_address(request: HttpRequest | None) -> str | None:
    """The client's address: the connection's, unless the connection comes from a trusted proxy
    (TRUSTED_PROXIES), in which case X-Forwarded-For is read from the right, skipping trusted
    proxies, and the first address that is not one is the client's. A forged header from an
    untrusted connection is ignored."""
    if request is None:
        return None
    remote = _parse_ip(str(request.META.get("REMOTE_ADDR") or ""))
    if remote is None:
        return None
    trusted = _networks(list(getattr(settings, "TRUSTED_PROXIES", [])))

    def is_trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address.version == net.version and address in net for net in trusted)

    if not is_trusted(remote):
        return str(remote)
    hops = [hop for hop in str(request.META.get("HTTP_X_FORWARDED_FOR") or "").split(",") if hop.strip()]
    client = remote
    for hop in reversed(hops):
        address = _parse_ip(hop)
        if address is None:
            break  # garbage from beyond the last trusted proxy: the last good hop is the client
        client = address
        if not is_trusted(address):
            break
    return str(client)


@dataclass(frozen=True)
class Scope:
    """One throttling scope: which failures count, and how many are free."""

    name: str  # "account_address", "account" or "address"
    failures: QuerySet[LoginFailure]
    free: int


@dataclass(frozen=True)
class ThrottleState:
    retry_after_s: float  # 0 when an attempt may go ahead
    scope: str  # the scope that imposes the wait ("" when none)


def backoff_delay_s(excess: int) -> float:
    """The wait after `excess` failures beyond a scope's allowance (0 within it)."""
    if excess <= 0:
        return 0.0
    base = float(settings.LOGIN_THROTTLE_BASE_DELAY_S)
    cap = float(settings.LOGIN_THROTTLE_MAX_DELAY_S)
    return min(cap, base * 2.0 ** min(excess - 1, 62))


def _scopes(digest: str, ip: str | None, since: datetime) -> list[Scope]:
    recent = LoginFailure.objects.filter(at__gte=since)
    per_address = settings.LOGIN_THROTTLE_FAILURES
    scopes = [Scope("account", recent.filter(email_digest=digest), settings.LOGIN_THROTTLE_ACCOUNT_FAILURES)]
    if ip is not None:
        scopes.insert(0, Scope("account_address", recent.filter(email_digest=digest, ip=ip), per_address))
        scopes.append(Scope("address", recent.filter(ip=ip), settings.LOGIN_THROTTLE_ADDRESS_FAILURES))
    return scopes


def throttle_state(*, digest: str, ip: str | None, now: datetime | None = None) -> ThrottleState:
    """How long an attempt for account `digest` from `ip` must still wait, and why."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S)
    worst = ThrottleState(0.0, "")
    for scope in _scopes(digest, ip, since):
        stats = scope.failures.aggregate(n=Count("id"), latest=Max("at"))
        count, latest = int(stats["n"] or 0), stats["latest"]
        if latest is None:
            continue
        wait = (latest + timedelta(seconds=backoff_delay_s(count - scope.free + 1)) - now).total_seconds()
        if wait > worst.retry_after_s:
            worst = ThrottleState(wait, scope.name)
    return worst


def _lock_scopes(digest: str, ip: str | None) -> None:
    """Serialise attempts sharing a scope until the transaction ends (PostgreSQL advisory locks,
    taken in one order so two attempts never wait on each other's)."""
    if connection.vendor != "postgresql":
        return  # SQLite (embedded setup) serialises writers itself
    keys = sorted({f"login:account:{digest}", *([f"login:address:{ip}"] if ip else [])})
    with connection.cursor() as cursor:
        for key in keys:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])


class ThrottledLogin(PermissionDenied):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__("too many failed sign-ins; try again shortly")
        self.retry_after_s = retry_after_s


def login_attempt_begin(*, digest: str, ip: str | None) -> LoginFailure:
    """Claims one attempt: refused (ThrottledLogin, audited) while a scope makes it wait;
    otherwise recorded as a failure before the password is checked."""
    with transaction.atomic():
        _lock_scopes(digest, ip)
        state = throttle_state(digest=digest, ip=ip)
        if state.retry_after_s <= 0:
            return LoginFailure.objects.create(email_digest=digest, ip=ip)
        audit_record(
            actor=None,
            action="auth.login_throttled",
            data={
                "email_digest": digest,
                "address": ip,
                "scope": state.scope,
                "retry_after_s": round(state.retry_after_s, 1),
            },
        )
    # Raised after the block, so that the audit event is kept.
    raise ThrottledLogin(state.retry_after_s)


def login_attempt_failed(*, digest: str, ip: str | None, user: Any | None) -> None:
    """The attempt (already counted) had a wrong password or an unknown address: audited."""
    with transaction.atomic():
        audit_record(
            actor=None,
            action="auth.login_failed",
            target=user,
            data={"email_digest": digest, "address": ip},
        )


def login_attempt_succeeded(*, attempt: LoginFailure, digest: str, ip: str | None) -> None:
    """A correct password: this attempt is not a failure, and the account's failures from this
    address are forgiven (other addresses' and the address's other accounts' stay counted)."""
    with transaction.atomic():
        LoginFailure.objects.filter(pk=attempt.pk).delete()
        if ip is not None:
            LoginFailure.objects.filter(email_digest=digest, ip=ip).delete()


def sign_in_record(*, user: Any, request: HttpRequest | None) -> None:
    """A session started with a password (the audit trail's "auth.login")."""
    with transaction.atomic():
        audit_record(actor=user, action="auth.login", data={"address": client_address(request)})


def sign_out_record(*, user: Any, request: HttpRequest | None) -> None:
    with transaction.atomic():
        audit_record(actor=user, action="auth.logout", data={"address": client_address(request)})


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
        digest, ip = email_digest(username), client_address(request)
        try:
            attempt = login_attempt_begin(digest=digest, ip=ip)
        except ThrottledLogin as exc:
            if request is not None:
                setattr(request, RETRY_AFTER_ATTR, exc.retry_after_s)
            raise
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            UserModel = self._user_model()
            known = UserModel._default_manager.filter(email__iexact=(username or "").strip()).first()
            login_attempt_failed(digest=digest, ip=ip, user=known)
            # Stops Django from asking the next backend (ModelBackend) the same question.
            raise PermissionDenied("invalid credentials")
        login_attempt_succeeded(attempt=attempt, digest=digest, ip=ip)
        return user

    @staticmethod
    def _user_model() -> Any:
        from django.contrib.auth import get_user_model

        return get_user_model()
