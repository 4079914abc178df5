"""Access: idle-session timeout (polling does not count), sign-in throttling, staff audit."""

from __future__ import annotations

import hashlib
import time

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client
from django.urls import reverse

from compliance.middleware import LAST_ACTIVITY_KEY
from compliance.models import AuditEvent, LoginFailure
from portal.accounts.models import User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _set_last_activity(client: Client, seconds_ago: float) -> None:
    session = client.session
    session[LAST_ACTIVITY_KEY] = time.time() - seconds_ago
    session.save()


def test_idle_session_expires_and_polling_does_not_keep_it_alive(alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SESSION_IDLE_TIMEOUT_S = 600
    dashboard = reverse("accounts:dashboard")
    assert alice_client.get(dashboard).status_code == 200
    assert LAST_ACTIVITY_KEY in alice_client.session

    # Nine minutes idle, then an htmx poll: still signed in, but the clock is not reset.
    _set_last_activity(alice_client, 540)
    stamp = alice_client.session[LAST_ACTIVITY_KEY]
    assert alice_client.get(dashboard, HTTP_HX_REQUEST="true").status_code == 200
    assert alice_client.session[LAST_ACTIVITY_KEY] == stamp

    # Past the limit, the next poll ends the session and tells htmx to go to the sign-in page.
    _set_last_activity(alice_client, 601)
    response = alice_client.get(dashboard, HTTP_HX_REQUEST="true")
    assert response["HX-Redirect"] == reverse("accounts:login")
    assert SESSION_KEY not in alice_client.session
    response = alice_client.get(dashboard)
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login"))


def test_real_activity_keeps_the_session(alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SESSION_IDLE_TIMEOUT_S = 600
    _set_last_activity(alice_client, 540)
    assert alice_client.get(reverse("accounts:dashboard")).status_code == 200
    assert time.time() - alice_client.session[LAST_ACTIVITY_KEY] < 5
    # A plain page load after a long idle period goes to sign-in with `next`.
    _set_last_activity(alice_client, 601)
    response = alice_client.get(reverse("accounts:members"))
    assert response.status_code == 302
    assert "next=" in response["Location"]


def test_sign_in_is_throttled_after_repeated_failures(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOGIN_THROTTLE_FAILURES = 3
    # A back-off long enough that the test's own pace never outlasts it.
    settings.LOGIN_THROTTLE_BASE_DELAY_S = 60
    client = Client()
    url = reverse("accounts:login")
    for _ in range(3):
        response = client.post(url, {"username": alice.email, "password": "wrong password!"})
        assert response.status_code == 200 and SESSION_KEY not in client.session
    # Even the right password is refused now, without being checked.
    response = client.post(url, {"username": alice.email, "password": PASSWORD})
    assert SESSION_KEY not in client.session
    # The address is stored hashed only.
    digests = set(LoginFailure.objects.values_list("email_digest", flat=True))
    assert digests == {hashlib.sha256(alice.email.encode()).hexdigest()}
    # Another person is not affected, and a successful sign-in clears the person's failures.
    LoginFailure.objects.all().delete()
    response = client.post(url, {"username": alice.email, "password": PASSWORD})
    assert response.status_code == 302 and SESSION_KEY in client.session


def test_staff_access_to_the_admin_is_audited(alice) -> None:  # type: ignore[no-untyped-def]
    staff = User.objects.create_superuser(email="ops@tailguard.test", password=PASSWORD)
    client = Client()
    client.force_login(staff)
    response = client.get("/admin/traffic/trafficsample/?q=secret")
    assert response.status_code == 200
    event = AuditEvent.objects.get(action="staff.access")
    assert event.actor_label == "ops@tailguard.test"
    assert event.data == {"method": "GET", "path": "/admin/traffic/trafficsample/"}
    assert event.organization_id is None
    # Ordinary members' requests are not staff access.
    member = Client()
    member.force_login(alice)
    member.get(reverse("accounts:dashboard"))
    assert AuditEvent.objects.filter(action="staff.access").count() == 1
