"""Two-factor authentication: TOTP devices, recovery codes and the throttle on failures."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from compliance import selectors
from compliance.services.audit import audit_record
from portal.accounts.models import User

logger = logging.getLogger(__name__)

# --- Two-factor (TOTP) ------------------------------------------------------------------------

_TOTP_PURPOSE = "totp-secret"


def _totp_new_device(*, user: User) -> str:
    from compliance import totp
    from compliance.models import TOTPDevice
    from compliance.storage import seal

    secret = totp.new_secret()
    TOTPDevice.objects.update_or_create(
        user=user,
        defaults={"secret_encrypted": seal(secret.encode(), purpose=_TOTP_PURPOSE), "last_step": -1},
    )
    return secret


def totp_enroll_start(*, user: User) -> str:
    """A new, unconfirmed authenticator secret for `user` (replacing an unconfirmed one).

    Only an explicit request (a POST, behind a fresh re-authentication: portal.accounts.reauth)
    calls this; showing the enrolment page only reads the pending secret
    (`selectors.totp_pending_secret`), so a page load, a reload, a prefetch or a subresource
    bounced to the page never makes or swaps the key a person is typing codes from."""
    if selectors.totp_confirmed(user=user):
        raise ValidationError({"code": "An authenticator is already set up."})
    with transaction.atomic():
        replaced = selectors.totp_pending_secret(user=user) is not None
        secret = _totp_new_device(user=user)
        audit_record(actor=user, action="two_factor.new_key", data={"replaced": replaced})
    return secret


# Recovery codes: 16 characters from an alphabet without look-alikes (79 bits), shown once, kept
# only as SHA-256 digests (random codes of that strength need no slow hash), each used once.
RECOVERY_CODE_COUNT = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
_RECOVERY_LENGTH = 16


def _recovery_digest(*, user: User, code: str) -> str:
    normalized = code.strip().lower().replace("-", "").replace(" ", "")
    return hashlib.sha256(f"{user.pk}:{normalized}".encode()).hexdigest()


def _looks_like_recovery_code(code: str) -> bool:
    normalized = code.strip().lower().replace("-", "").replace(" ", "")
    return len(normalized) == _RECOVERY_LENGTH and all(c in _RECOVERY_ALPHABET for c in normalized)


def totp_recovery_codes_create(*, user: User) -> list[str]:
    """A fresh set of one-time recovery codes for `user` (the old ones stop working). The codes
    are returned once, to be shown once; only their digests are stored."""
    from compliance.models import TOTPRecoveryCode

    if not selectors.totp_confirmed(user=user):
        raise ValidationError({"code": "Set up an authenticator first."})
    codes = []
    for _ in range(RECOVERY_CODE_COUNT):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(_RECOVERY_LENGTH))
        codes.append("-".join(raw[i : i + 4] for i in range(0, _RECOVERY_LENGTH, 4)))
    with transaction.atomic():
        TOTPRecoveryCode.objects.filter(user=user).delete()
        TOTPRecoveryCode.objects.bulk_create(
            [TOTPRecoveryCode(user=user, code_digest=_recovery_digest(user=user, code=c)) for c in codes]
        )
        audit_record(actor=user, action="two_factor.recovery_codes", data={"count": len(codes)})
    return codes


def _recovery_code_use(*, user: User, code: str) -> bool:
    from compliance.models import TOTPRecoveryCode

    with transaction.atomic():
        # Conditional update: the same code sent twice at once passes once.
        used = TOTPRecoveryCode.objects.filter(
            user=user, code_digest=_recovery_digest(user=user, code=code), used_at__isnull=True
        ).update(used_at=timezone.now())
        if used:
            left = TOTPRecoveryCode.objects.filter(user=user, used_at__isnull=True).count()
            audit_record(actor=user, action="two_factor.recovery_code_used", data={"left": left})
    return bool(used)


def _totp_throttled(user: User) -> bool:
    from compliance.models import LoginFailure

    since = timezone.now() - timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S)
    key = f"totp:{user.pk}"
    return (
        LoginFailure.objects.filter(email_digest=key, at__gte=since).count()
        >= settings.LOGIN_THROTTLE_FAILURES
    )


def _totp_failure_record(*, user: User, device: Any, kind: str) -> None:
    """A wrong second factor is sign-in activity: audited (never the code itself)."""
    with transaction.atomic():
        audit_record(actor=None, action="auth.two_factor_failed", target=user, data={"kind": kind})


def totp_verify(*, user: User, code: str, now_s: float | None = None) -> bool:
    """Checks a code against the user's authenticator (confirming it on first success), or a
    recovery code once the authenticator is confirmed. Replays and too many failures are
    refused."""
    import time

    from compliance import totp
    from compliance.models import LoginFailure, TOTPDevice
    from compliance.storage import unseal

    device = TOTPDevice.objects.filter(user=user).first()
    if device is None:
        raise ValidationError({"code": "Set up an authenticator first."})
    if _totp_throttled(user):
        raise ValidationError({"code": "Too many wrong codes; wait a few minutes and try again."})
    if device.confirmed_at is not None and _looks_like_recovery_code(code):
        if _recovery_code_use(user=user, code=code):
            LoginFailure.objects.filter(email_digest=f"totp:{user.pk}").delete()
            return True
        LoginFailure.objects.create(email_digest=f"totp:{user.pk}")
        _totp_failure_record(user=user, device=device, kind="recovery code")
        return False
    secret = unseal(bytes(device.secret_encrypted), purpose=_TOTP_PURPOSE).decode()
    step = totp.matching_step(
        secret, code, now_s=time.time() if now_s is None else now_s, after_step=device.last_step
    )
    if step is None:
        LoginFailure.objects.create(email_digest=f"totp:{user.pk}")
        _totp_failure_record(user=user, device=device, kind="authenticator code")
        return False
    with transaction.atomic():
        # Conditional update: two requests with the same code cannot both pass.
        claimed = TOTPDevice.objects.filter(pk=device.pk, last_step__lt=step).update(last_step=step)
        if not claimed:
            return False
        if device.confirmed_at is None:
            TOTPDevice.objects.filter(pk=device.pk).update(confirmed_at=timezone.now())
            audit_record(actor=user, action="two_factor.enroll", target=device)
    LoginFailure.objects.filter(email_digest=f"totp:{user.pk}").delete()
    return True
