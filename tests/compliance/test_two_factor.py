"""TOTP two-factor: required for owners of an organization with a BAA; codes work once."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from compliance import services, totp
from compliance.models import AuditEvent, TOTPDevice
from compliance.storage import unseal
from tests.compliance.helpers import baa_recorded
from tests.conftest import _client_for

pytestmark = pytest.mark.django_db


def test_rfc6238_reference_vector() -> None:
    # RFC 6238 appendix B, SHA-1 secret "12345678901234567890", T = 59 s -> 94287082 (8 digits).
    import base64

    secret = base64.b32encode(b"12345678901234567890").decode()
    assert totp.code_at(secret, 59 // 30) == "287082"  # the last 6 digits
    assert totp.matching_step(secret, "287082", now_s=59) == 1
    assert totp.matching_step(secret, "287082", now_s=59, after_step=1) is None  # never twice
    assert totp.matching_step(secret, "28708", now_s=59) is None


def _secret(user) -> str:  # type: ignore[no-untyped-def]
    return unseal(bytes(TOTPDevice.objects.get(user=user).secret_encrypted), purpose="totp-secret").decode()


def test_owner_of_an_organization_with_a_baa_must_enrol(alice, alice_org, alice_client, bob_client) -> None:  # type: ignore[no-untyped-def]
    dashboard = reverse("accounts:dashboard")
    assert alice_client.get(dashboard).status_code == 200
    baa_recorded(alice, alice_org)
    response = alice_client.get(dashboard)
    assert response.status_code == 302 and response["Location"].startswith(reverse("compliance:two_factor"))
    assert alice_client.get("/api/v1/me/").status_code == 403
    assert alice_client.get(dashboard, HTTP_HX_REQUEST="true")["HX-Redirect"] == reverse(
        "compliance:two_factor"
    )
    # Bob is a viewer there, not an owner: not required (he may still enrol).
    assert bob_client.get(dashboard).status_code == 200

    # Opening the page makes no key; the person asks for one (a POST), then sees it.
    assert "otpauth://totp/" not in alice_client.get(reverse("compliance:two_factor")).content.decode()
    assert alice_client.post(reverse("compliance:two_factor"), {"action": "new_key"}).status_code == 302
    page = alice_client.get(reverse("compliance:two_factor"))
    assert page.status_code == 200 and "otpauth://totp/" in page.content.decode()
    secret = _secret(alice)
    assert secret in page.content.decode()
    assert secret.encode() not in bytes(TOTPDevice.objects.get(user=alice).secret_encrypted)
    wrong = alice_client.post(reverse("compliance:two_factor"), {"code": "000000"})
    assert wrong.status_code == 400 and "not right" in wrong.content.decode()
    code = totp.code_at(secret, int(time.time() // 30))
    response = alice_client.post(reverse("compliance:two_factor") + f"?next={dashboard}", {"code": code})
    # Enrolment confirmed: the recovery codes are shown on this response, then on to `next`.
    assert response.status_code == 200 and len(response.context["codes"]) == 10
    assert f'href="{dashboard}"' in response.content.decode()
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
    # Each wrong or replayed code is sign-in activity in the audit trail (the code itself never is).
    failed = AuditEvent.objects.filter(action="auth.two_factor_failed", target_id=str(alice.pk))
    assert failed.count() == 3 and all(
        e.data == {"kind": "authenticator code"} for e in failed
    )  # the replay too
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="Too many wrong codes"):
        services.totp_verify(user=alice, code=totp.code_at(secret, int(now // 30) + 1), now_s=now + 30)


def test_the_enrolment_key_survives_page_loads_until_a_new_one_is_asked_for(
    alice, alice_org, alice_client
) -> None:  # type: ignore[no-untyped-def]
    baa_recorded(alice, alice_org)
    page = reverse("compliance:two_factor")
    assert alice_client.get(page).context["secret"] is None  # nothing made by looking
    assert alice_client.post(page, {"action": "new_key"}).status_code == 302
    first = alice_client.get(page).context["secret"]
    # What a browser does around the page: its favicon, a static asset, a reload.
    assert alice_client.get("/favicon.ico").status_code != 302
    assert alice_client.get("/static/css/app.css").status_code != 302
    assert alice_client.get(page).context["secret"] == first == _secret(alice)
    # Only an explicit POST makes a new key.
    assert alice_client.post(page, {"action": "new_key"}).status_code == 302
    second = alice_client.get(page).context["secret"]
    assert second != first and second == _secret(alice)
    code = totp.code_at(second, int(time.time() // 30))
    assert alice_client.post(page, {"code": code}).status_code == 200
    assert TOTPDevice.objects.get(user=alice).confirmed_at is not None


def test_recovery_codes_are_hashed_shown_once_and_work_once(alice, alice_org, alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    from compliance.models import TOTPRecoveryCode

    settings.LOGIN_THROTTLE_FAILURES = 50
    baa_recorded(alice, alice_org)
    page = reverse("compliance:two_factor")
    alice_client.post(page, {"action": "new_key"})
    secret = alice_client.get(page).context["secret"]
    enrolled = alice_client.post(page, {"code": totp.code_at(secret, int(time.time() // 30))})
    codes = enrolled.context["codes"]
    assert len(set(codes)) == 10
    stored = list(TOTPRecoveryCode.objects.filter(user=alice).values_list("code_digest", flat=True))
    assert len(stored) == 10 and not any(c in d or c.replace("-", "") in d for c in codes for d in stored)
    assert codes[0] not in alice_client.get(page).content.decode()  # never shown again

    # A new session (the phone is lost): a recovery code signs in, once.
    again = _client_for(alice)  # signed in with the password (fresh for changing two-factor)
    assert again.get(reverse("accounts:dashboard")).status_code == 302
    assert again.post(page, {"code": codes[0].upper()}).status_code == 302
    assert again.get(reverse("accounts:dashboard")).status_code == 200
    third = Client()
    third.force_login(alice)
    assert third.post(page, {"code": codes[0]}).status_code == 400
    assert third.get(reverse("accounts:dashboard")).status_code == 302
    assert AuditEvent.objects.filter(action="two_factor.recovery_code_used", actor=alice).count() == 1

    # A verified session can replace the set: the old codes stop working.
    renewed = again.post(page, {"action": "new_recovery_codes"})
    assert renewed.status_code == 200 and set(renewed.context["codes"]).isdisjoint(codes)
    assert not services.totp_verify(user=alice, code=codes[1])
    assert services.totp_verify(user=alice, code=renewed.context["codes"][0])
