"""Two-factor enrolment changes nothing on GET (issue 27 finding 14): opening the page, however
often, makes no key and writes no audit event; the key is made by a POST that carries the CSRF
token and comes from a freshly re-authenticated session."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from compliance import totp
from compliance.models import AuditEvent, TOTPDevice
from compliance.storage import unseal
from portal.accounts.models import Organization, User
from portal.accounts.reauth import SESSION_KEY as REAUTH_KEY
from tests.compliance.helpers import baa_recorded
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

PAGE = "compliance:two_factor"


def _signed_in(user: User, *, fresh: bool, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    if fresh:
        session = client.session
        session[REAUTH_KEY] = {"user": str(user.pk), "at": time.time()}
        session.save()
    return client


def test_opening_the_enrolment_page_makes_no_key(alice: User, alice_org: Organization) -> None:
    baa_recorded(alice, alice_org)  # the owner must enrol: the page is where every request goes
    client = _signed_in(alice, fresh=True)
    events = AuditEvent.objects.count()
    for _ in range(3):
        page = client.get(reverse(PAGE))
        assert page.status_code == 200 and page.context["secret"] is None
        assert b'id="start-enrol-form"' in page.content and b"otpauth://" not in page.content
    assert client.head(reverse(PAGE)).status_code == 200
    # What a browser fetches beside the page, bounced to it before enrolment.
    client.get(reverse("accounts:dashboard"))
    client.get("/favicon.ico")
    assert not TOTPDevice.objects.filter(user=alice).exists()
    assert AuditEvent.objects.count() == events


def test_the_key_is_made_only_by_a_post_with_the_csrf_token(alice: User) -> None:
    client = _signed_in(alice, fresh=True, csrf=True)
    page = client.get(reverse(PAGE))
    forged = client.post(reverse(PAGE), {"action": "new_key"})
    assert forged.status_code == 403 and not TOTPDevice.objects.filter(user=alice).exists()

    token = page.context["csrf_token"]
    made = client.post(reverse(PAGE), {"action": "new_key", "csrfmiddlewaretoken": str(token)})
    assert made.status_code == 302 and made["Location"] == reverse(PAGE)
    secret = unseal(
        bytes(TOTPDevice.objects.get(user=alice).secret_encrypted), purpose="totp-secret"
    ).decode()
    shown = client.get(reverse(PAGE))
    assert shown.context["secret"] == secret and secret in shown.content.decode()
    assert client.get(reverse(PAGE)).context["secret"] == secret  # a reload keeps it
    assert AuditEvent.objects.filter(action="two_factor.new_key", actor=alice).count() == 1
    assert TOTPDevice.objects.get(user=alice).confirmed_at is None


def test_a_stale_session_re_authenticates_before_a_key_is_made(alice: User) -> None:
    client = _signed_in(alice, fresh=False)
    session = client.session
    session[REAUTH_KEY] = {"user": str(alice.pk), "at": time.time() - settings.REAUTH_MAX_AGE_S - 5}
    session.save()
    refused = client.post(reverse(PAGE), {"action": "new_key"})
    assert refused.status_code == 302 and refused["Location"].startswith(reverse("accounts:reauth"))
    assert not TOTPDevice.objects.filter(user=alice).exists()
    wrong = client.post(reverse("accounts:reauth"), {"password": "not-it"})
    assert wrong.status_code == 400
    assert client.post(reverse(PAGE), {"action": "new_key"}).status_code == 302
    assert not TOTPDevice.objects.filter(user=alice).exists()

    assert client.post(reverse("accounts:reauth"), {"password": PASSWORD}).status_code == 302
    assert client.post(reverse(PAGE), {"action": "new_key"}).status_code == 302
    secret = client.get(reverse(PAGE)).context["secret"]
    enrolled = client.post(reverse(PAGE), {"code": totp.code_at(secret, int(time.time() // totp.STEP_S))})
    assert enrolled.status_code == 200 and TOTPDevice.objects.get(user=alice).confirmed_at is not None


def test_a_code_without_a_key_is_refused_and_makes_none(alice: User) -> None:
    client = _signed_in(alice, fresh=True)
    response = client.post(reverse(PAGE), {"code": "000000"})
    assert response.status_code == 400 and "Set up an authenticator first" in response.content.decode()
    assert not TOTPDevice.objects.filter(user=alice).exists()
