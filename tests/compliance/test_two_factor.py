"""TOTP two-factor: required for owners of an organization with a BAA; codes work once."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from compliance import services, totp
from compliance.models import AuditEvent, TOTPDevice
from compliance.storage import unseal

pytestmark = pytest.mark.django_db


def test_rfc6238_reference_vector() -> None:
    # RFC 6238 appendix B, SHA-1 secret "12345678901234567890", T = 59 s -> 94287082 (8 digits).
    import base64

    secret = base64.b32encode(b"12345678901234567890").decode()
    assert totp.code_at(secret, 59 // 30) == "287082"  # the last 6 digits
    assert totp.matching_step(secret, "287082", now_s=59) == 1
    assert totp.matching_step(secret, "287082", now_s=59, after_step=1) is None  # never twice
    assert totp.matching_step(secret, "28708", now_s=59) is None


def _baa(alice, org) -> None:  # type: ignore[no-untyped-def]
    today = timezone.now().date()
    services.baa_record_create(
        actor=alice,
        organization=org,
        counterparty="Tailguard Inc.",
        version="v1",
        signed_on=today - timedelta(days=1),
        effective_on=today,
    )


def _secret(user) -> str:  # type: ignore[no-untyped-def]
    return unseal(bytes(TOTPDevice.objects.get(user=user).secret_encrypted), purpose="totp-secret").decode()


def test_owner_of_an_organization_with_a_baa_must_enrol(alice, alice_org, alice_client, bob_client) -> None:  # type: ignore[no-untyped-def]
    dashboard = reverse("accounts:dashboard")
    assert alice_client.get(dashboard).status_code == 200
    _baa(alice, alice_org)
    response = alice_client.get(dashboard)
    assert response.status_code == 302 and response["Location"].startswith(reverse("compliance:two_factor"))
    assert alice_client.get("/api/v1/me/").status_code == 403
    assert alice_client.get(dashboard, HTTP_HX_REQUEST="true")["HX-Redirect"] == reverse(
        "compliance:two_factor"
    )
    # Bob is a viewer there, not an owner: not required (he may still enrol).
    assert bob_client.get(dashboard).status_code == 200

    page = alice_client.get(reverse("compliance:two_factor"))
    assert page.status_code == 200 and "otpauth://totp/" in page.content.decode()
    secret = _secret(alice)
    assert secret in page.content.decode()
    assert secret.encode() not in bytes(TOTPDevice.objects.get(user=alice).secret_encrypted)
    wrong = alice_client.post(reverse("compliance:two_factor"), {"code": "000000"})
    assert wrong.status_code == 400 and "not right" in wrong.content.decode()
    code = totp.code_at(secret, int(time.time() // 30))
    response = alice_client.post(reverse("compliance:two_factor") + f"?next={dashboard}", {"code": code})
    assert response.status_code == 302 and response["Location"] == dashboard
    assert alice_client.get(dashboard).status_code == 200
    assert TOTPDevice.objects.get(user=alice).confirmed_at is not None
    assert AuditEvent.objects.filter(action="two_factor.enroll", actor=alice).exists()


def test_a_code_works_once_and_guessing_is_throttled(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOGIN_THROTTLE_FAILURES = 3
    services.totp_enroll_start(user=alice)
    secret = _secret(alice)
    now = time.time()
    code = totp.code_at(secret, int(now // 30))
    assert services.totp_verify(user=alice, code=code, now_s=now)
    assert not services.totp_verify(user=alice, code=code, now_s=now)  # replay
    for _ in range(2):
        assert not services.totp_verify(user=alice, code="123456", now_s=now)
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="Too many wrong codes"):
        services.totp_verify(user=alice, code=totp.code_at(secret, int(now // 30) + 1), now_s=now + 30)
