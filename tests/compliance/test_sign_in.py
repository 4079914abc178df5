"""Issue 27, findings 1, 10 and 14: sign-in throttling keyed by account and by (trusted) client
address, with a capped back-off instead of a lock-out, atomic under parallel guesses; sign-in
activity in the audit trail."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import SESSION_KEY
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from compliance.auth import backoff_delay_s, client_address, email_digest, throttle_state
from compliance.models import AuditEvent, LoginFailure
from tests.conftest import PASSWORD

PROXY = "10.0.0.2"


@pytest.fixture
def throttle(settings):  # type: ignore[no-untyped-def]
    settings.LOGIN_THROTTLE_FAILURES = 3
    settings.LOGIN_THROTTLE_ACCOUNT_FAILURES = 12
    settings.LOGIN_THROTTLE_ADDRESS_FAILURES = 12
    # Long enough that the test's own pace never outlasts a wait.
    settings.LOGIN_THROTTLE_BASE_DELAY_S = 30
    settings.LOGIN_THROTTLE_MAX_DELAY_S = 60
    settings.TRUSTED_PROXIES = ["10.0.0.0/24"]
    return settings


@pytest.fixture
def fast_hashing(settings):  # type: ignore[no-untyped-def]
    """Quick password hashing (requested before `alice`, so her password uses it too)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _post(client: Client, email: str, password: str, *, client_ip: str):  # type: ignore[no-untyped-def]
    """A sign-in through the TLS proxy, which names the client in X-Forwarded-For."""
    return client.post(
        reverse("accounts:login"),
        {"username": email, "password": password},
        REMOTE_ADDR=PROXY,
        HTTP_X_FORWARDED_FOR=f"{client_ip}, {PROXY}",
    )


@pytest.mark.django_db
def test_one_address_guessing_many_accounts_does_not_lock_others_out(fast_hashing, alice, throttle) -> None:  # type: ignore[no-untyped-def]
    attacker = Client()
    for n in range(25):
        _post(attacker, f"victim{n}@acme.test", "wrong password!", client_ip="203.0.113.9")
    # Alice signs in through the same proxy, from her own address: not held back at all.
    alice_browser = Client()
    response = _post(alice_browser, alice.email, PASSWORD, client_ip="198.51.100.7")
    assert response.status_code == 302 and SESSION_KEY in alice_browser.session

    # The attacker's address is held back, with the reason, but never for longer than the cap.
    response = _post(attacker, alice.email, PASSWORD, client_ip="203.0.113.9")
    assert SESSION_KEY not in attacker.session
    assert b"Too many failed sign-ins. Try again in" in response.content
    state = throttle_state(digest=email_digest(alice.email), ip="203.0.113.9")
    assert state.scope == "address" and 0 < state.retry_after_s <= 60
    later = timezone.now() + timedelta(seconds=61)
    assert throttle_state(digest=email_digest(alice.email), ip="203.0.113.9", now=later).retry_after_s == 0


@pytest.mark.django_db
def test_guessing_one_account_holds_back_the_guesser_not_the_owner(fast_hashing, alice, throttle) -> None:  # type: ignore[no-untyped-def]
    attacker = Client()
    for _ in range(3):
        _post(attacker, alice.email, "wrong password!", client_ip="203.0.113.9")
    # The fourth guess is refused without checking the password, and not counted.
    _post(attacker, alice.email, PASSWORD, client_ip="203.0.113.9")
    assert SESSION_KEY not in attacker.session
    assert LoginFailure.objects.filter(ip="203.0.113.9").count() == 3
    # Alice, elsewhere, signs in; a successful sign-in from her address forgives only her own.
    alice_browser = Client()
    assert _post(alice_browser, alice.email, PASSWORD, client_ip="198.51.100.7").status_code == 302
    assert LoginFailure.objects.filter(ip="203.0.113.9").count() == 3


def test_back_off_doubles_up_to_the_cap(settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOGIN_THROTTLE_BASE_DELAY_S = 1
    settings.LOGIN_THROTTLE_MAX_DELAY_S = 60
    assert [backoff_delay_s(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay_s(10_000) == 60


def test_forwarded_address_is_trusted_only_from_listed_proxies(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TRUSTED_PROXIES = ["10.0.0.0/24"]
    factory = RequestFactory()
    forged = factory.post("/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert client_address(forged) == "203.0.113.9"
    # A client's own X-Forwarded-For is left of what the proxy appended: the proxy's view wins.
    spoofed = factory.post("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.7")
    assert client_address(spoofed) == "198.51.100.7"
    chained = factory.post("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.7, 10.0.0.3")
    assert client_address(chained) == "198.51.100.7"
    garbage = factory.post("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="not-an-ip")
    assert client_address(garbage) == PROXY
    settings.TRUSTED_PROXIES = []
    assert client_address(spoofed) == PROXY


@pytest.mark.django_db(transaction=True)
def test_parallel_guesses_cannot_exceed_the_allowance(alice, throttle) -> None:  # type: ignore[no-untyped-def]
    # Real (slow) password hashing: the window in which a check-then-count throttle let every
    # parallel guess through.
    guesses = 8
    barrier = threading.Barrier(guesses)

    def guess() -> None:
        try:
            barrier.wait()
            _post(Client(), alice.email, "wrong password!", client_ip="203.0.113.9")
        finally:
            connection.close()

    threads = [threading.Thread(target=guess) for _ in range(guesses)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert LoginFailure.objects.filter(email_digest=email_digest(alice.email)).count() == 3


@pytest.mark.django_db
def test_sign_in_activity_is_audited(fast_hashing, alice, throttle) -> None:  # type: ignore[no-untyped-def]
    browser = Client()
    for _ in range(3):
        _post(browser, alice.email, "wrong password!", client_ip="203.0.113.9")
    _post(browser, alice.email, PASSWORD, client_ip="203.0.113.9")  # throttled
    assert _post(browser, alice.email, PASSWORD, client_ip="198.51.100.7").status_code == 302
    assert browser.post(reverse("accounts:logout")).status_code == 302

    events = list(AuditEvent.objects.filter(action__startswith="auth.").order_by("created_at", "seq"))
    assert [e.action for e in events] == ["auth.login_failed"] * 3 + [
        "auth.login_throttled",
        "auth.login",
        "auth.logout",
    ]
    failed = events[0]
    # The person is named by reference; the attempted address only as a digest.
    assert failed.target_id == str(alice.pk) and failed.actor_id is None
    assert failed.data == {"email_digest": email_digest(alice.email), "address": "203.0.113.9"}
    assert events[3].data["scope"] == "account_address"
    assert events[4].actor_id == alice.pk and events[4].data == {"address": "198.51.100.7"}
    assert events[5].actor_id == alice.pk
