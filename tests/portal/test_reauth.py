"""Re-authentication before sensitive actions (issue 27: creating API tokens, deleting the
organization, changing two-factor). The attacker holds a signed-in session but not the
password (a stolen cookie, a screen left open), or an API token: each attempt is refused and
changes nothing; the person who knows the password (and code) goes ahead."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance import services as compliance_services
from compliance import totp
from compliance.middleware import TWO_FACTOR_KEY
from compliance.models import AuditEvent, TOTPDevice
from compliance.storage import unseal
from portal.accounts import services
from portal.accounts.models import ApiToken, Organization, User
from portal.accounts.reauth import SESSION_KEY
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _stale(client: Client | APIClient, user: User, *, age_s: float | None = None) -> None:
    """A session signed in long ago (or, with age_s, confirmed that many seconds ago)."""
    client.force_login(user)
    session = client.session
    session[TWO_FACTOR_KEY] = str(user.pk)
    if age_s is not None:
        session[SESSION_KEY] = {"user": str(user.pk), "at": time.time() - age_s}
    session.save()


def test_a_stale_session_cannot_create_a_token_until_the_password_is_given(alice: User) -> None:
    client = Client()
    _stale(client, alice, age_s=settings.REAUTH_MAX_AGE_S + 5)
    tokens = reverse("accounts:api_tokens")
    refused = client.post(tokens, {"name": "stolen"}, HTTP_REFERER="http://testserver" + tokens)
    assert refused.status_code == 302
    assert refused["Location"] == reverse("accounts:reauth") + "?next=%2Ftokens%2F"
    htmx = client.post(tokens, {"name": "stolen"}, HTTP_HX_REQUEST="true")
    assert htmx["HX-Redirect"].startswith(reverse("accounts:reauth"))
    assert not ApiToken.objects.exists()

    page = client.get(refused["Location"])
    assert page.status_code == 200 and b"Two-factor code" not in page.content
    wrong = client.post(reverse("accounts:reauth"), {"password": "not-it", "next": tokens})
    assert wrong.status_code == 400 and "That password is not right." in wrong.content.decode()
    assert client.post(tokens, {"name": "stolen"}).status_code == 302
    assert not ApiToken.objects.exists()
    # A foreign `next` is not followed.
    confirmed = client.post(reverse("accounts:reauth"), {"password": PASSWORD, "next": "https://evil.test/"})
    assert confirmed.status_code == 302 and confirmed["Location"] == reverse("accounts:dashboard")
    assert AuditEvent.objects.filter(action="auth.reauthenticate", actor=alice).count() == 1
    assert client.post(tokens, {"name": "mine"}).status_code == 200
    assert ApiToken.objects.filter(name="mine").count() == 1


def test_the_api_asks_a_session_to_confirm_and_refuses_tokens(alice: User, alice_org: Organization) -> None:
    api = APIClient()
    _stale(api, alice)
    refused = api.post("/api/v1/tokens/", {"name": "stolen"}, format="json")
    assert refused.status_code == 403 and "/api/v1/me/reauthenticate/" in refused.json()["detail"]
    wrong = api.post("/api/v1/me/reauthenticate/", {"password": "nope"}, format="json")
    assert wrong.status_code == 400 and "not right" in str(wrong.json())
    assert api.post("/api/v1/me/reauthenticate/", {"password": PASSWORD}, format="json").status_code == 200
    assert api.post("/api/v1/tokens/", {"name": "ci"}, format="json").status_code == 201

    # A leaked token mints no token, deletes nothing, and cannot confirm itself.
    secret = services.api_token_create(actor=alice, organization=alice_org, name="leaked").secret
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    minted = bearer.post("/api/v1/tokens/", {"name": "more"}, format="json")
    assert minted.status_code == 403 and "An API token cannot create an API token" in minted.json()["detail"]
    deleted = bearer.post(
        "/api/v1/compliance/delete-organization/", {"confirm": alice_org.slug}, format="json"
    )
    assert deleted.status_code == 403
    assert bearer.post("/api/v1/me/reauthenticate/", {"password": PASSWORD}, format="json").status_code == 403
    assert ApiToken.objects.count() == 2 and Organization.objects.filter(pk=alice_org.pk).exists()


def test_a_stale_session_cannot_delete_the_organization(alice: User, alice_org: Organization) -> None:
    client = Client()
    _stale(client, alice)
    response = client.post(reverse("compliance:organization_delete"), {"confirm": alice_org.slug})
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:reauth"))
    api = APIClient()
    _stale(api, alice)
    assert api.post("/api/v1/compliance/delete-organization/", {"confirm": alice_org.slug}).status_code == 403
    assert Organization.objects.filter(pk=alice_org.pk).exists()


def _enrol(user: User) -> str:
    compliance_services.totp_enroll_start(user=user)
    device = TOTPDevice.objects.get(user=user)
    secret = unseal(bytes(device.secret_encrypted), purpose="totp-secret").decode()
    assert compliance_services.totp_verify(user=user, code=totp.code_at(secret, int(time.time() // 30)))
    return secret


def test_with_an_authenticator_the_code_is_needed_too(alice: User) -> None:
    secret = _enrol(alice)
    client = Client()
    _stale(client, alice)
    page = client.get(reverse("accounts:reauth"))
    assert b"Two-factor code" in page.content
    no_code = client.post(reverse("accounts:reauth"), {"password": PASSWORD})
    assert no_code.status_code == 400 and "Enter the code" in no_code.content.decode()
    renew = client.post(reverse("compliance:two_factor"), {"action": "new_recovery_codes"})
    assert renew.status_code == 302 and renew["Location"].startswith(reverse("accounts:reauth"))
    # The next step's code (the current one was used to enrol).
    code = totp.code_at(secret, int(time.time() // 30) + 1)
    assert client.post(reverse("accounts:reauth"), {"password": PASSWORD, "code": code}).status_code == 302
    assert client.post(reverse("compliance:two_factor"), {"action": "new_recovery_codes"}).status_code == 200


def test_a_stale_password_only_session_cannot_enrol_its_own_authenticator(alice: User) -> None:
    client = Client()
    client.force_login(alice)  # signed in long ago, no authenticator yet
    assert client.get(reverse("compliance:two_factor")).status_code == 200
    # Making the key is refused until the password is given again (and the page made none).
    response = client.post(reverse("compliance:two_factor"), {"action": "new_key"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:reauth"))
    assert not TOTPDevice.objects.filter(user=alice).exists()
    # A key made earlier (by a fresh session) cannot be confirmed by a stale one either.
    compliance_services.totp_enroll_start(user=alice)
    device = TOTPDevice.objects.get(user=alice)
    secret = unseal(bytes(device.secret_encrypted), purpose="totp-secret").decode()
    step = int(time.time() // 30)
    response = client.post(reverse("compliance:two_factor"), {"code": totp.code_at(secret, step)})
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:reauth"))
    assert TOTPDevice.objects.get(user=alice).confirmed_at is None
    # With the password given, the same person enrols.
    assert client.post(reverse("accounts:reauth"), {"password": PASSWORD}).status_code == 302
    enrolled = client.post(reverse("compliance:two_factor"), {"code": totp.code_at(secret, step)})
    assert enrolled.status_code == 200 and TOTPDevice.objects.get(user=alice).confirmed_at is not None


def test_an_owner_who_must_enrol_signs_in_again_when_the_session_is_stale(
    alice: User, alice_org: Organization
) -> None:
    from tests.compliance.helpers import baa_recorded

    baa_recorded(alice, alice_org)  # the owner of an organization with a BAA must use two-factor
    client = Client()
    client.force_login(alice)  # signed in long ago; two-factor not done (only its page is reachable)
    assert client.get(reverse("compliance:two_factor")).status_code == 200
    response = client.post(reverse("compliance:two_factor"), {"action": "new_key"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login"))
    assert not TOTPDevice.objects.filter(user=alice).exists()
    client.force_login(alice)  # signed in long ago again, and a key made meanwhile
    compliance_services.totp_enroll_start(user=alice)
    device = TOTPDevice.objects.get(user=alice)
    secret = unseal(bytes(device.secret_encrypted), purpose="totp-secret").decode()
    response = client.post(
        reverse("compliance:two_factor"), {"code": totp.code_at(secret, int(time.time() // 30))}
    )
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login"))
    assert TOTPDevice.objects.get(user=alice).confirmed_at is None
    # Signed out: the stale session is gone, and signing in with the password is the way back.
    assert client.get(reverse("accounts:dashboard")).status_code == 302
    signed_in = client.post(reverse("accounts:login"), {"username": alice.email, "password": PASSWORD})
    assert signed_in.status_code == 302
    enrolled = client.post(
        reverse("compliance:two_factor"), {"code": totp.code_at(secret, int(time.time() // 30))}
    )
    assert enrolled.status_code == 200 and TOTPDevice.objects.get(user=alice).confirmed_at is not None
