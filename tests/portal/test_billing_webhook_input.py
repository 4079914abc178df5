"""The Stripe webhook answers every malformed delivery with a 400 that names the problem (never a
500, which Stripe would retry for days) and changes nothing: timestamps that are missing, not
digits, huge, negative or repeated, and events whose `created`, `id` or `data` are not what
Stripe sends."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest

from portal.accounts.models import Organization
from portal.billing.models import BillingAccount, WebhookEvent
from tests.portal.billing import WEBHOOK_SECRET, enable_billing, post_webhook, sign, subscription_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def account(settings: Any, alice_org: Organization) -> BillingAccount:
    enable_billing(settings)
    return BillingAccount.objects.create(organization=alice_org, stripe_customer_id="cus_test_acme")


def _signed_with(payload: str, t: str) -> str:
    # A correct HMAC over whatever the timestamp text is, so only the timestamp is wrong.
    mac = hmac.new(WEBHOOK_SECRET.encode(), f"{t}.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


@pytest.mark.parametrize(
    ("header", "says"),
    [
        pytest.param(lambda p: "", "header is missing", id="empty-header"),
        pytest.param(lambda p: _signed_with(p, "")[2:].replace(",", "", 1), "no timestamp", id="no-t"),
        pytest.param(lambda p: _signed_with(p, "abc"), "not a Unix time", id="letters"),
        pytest.param(lambda p: _signed_with(p, "9" * 400), "not a Unix time", id="huge"),
        pytest.param(
            lambda p: _signed_with(p, str(int(time.time())) + "0" * 30), "not a Unix time", id="overflow"
        ),
        pytest.param(lambda p: _signed_with(p, "-1"), "not a Unix time", id="negative"),
        pytest.param(lambda p: _signed_with(p, "\uff11\uff12\uff13"), "not a Unix time", id="unicode-digits"),
        pytest.param(lambda p: _signed_with(p, "12"), "years 2000-2999", id="1970"),
        pytest.param(lambda p: f"t=1,{sign(p)}", "more than one timestamp", id="two-t"),
    ],
)
def test_bad_signature_timestamps_are_a_clear_400(account: BillingAccount, header: Any, says: str) -> None:
    payload = subscription_event("evt_bad_t", "active")
    response = post_webhook(payload, header(payload))
    assert response.status_code == 400
    assert says in response.content.decode()
    assert not WebhookEvent.objects.exists()
    account.refresh_from_db()
    assert account.status == "none"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        pytest.param({"created": 10**30}, "'created' is not a Unix time", id="created-huge"),
        pytest.param({"created": -5}, "'created' is not a Unix time", id="created-negative"),
        pytest.param({"created": True}, "'created' must be a timestamp", id="created-bool"),
        pytest.param({"created": "1700000000"}, "'created' must be a timestamp", id="created-text"),
        pytest.param({"id": {"x": 1}}, "'id' must be a string", id="id-object"),
        pytest.param({"data": ["object"]}, "missing data.object", id="data-list"),
    ],
)
def test_signed_events_with_bad_fields_are_a_clear_400(
    account: BillingAccount, change: dict[str, Any], says: str
) -> None:
    event = json.loads(subscription_event("evt_bad_field", "active"))
    event.update(change)
    payload = json.dumps(event)
    response = post_webhook(payload, sign(payload))
    assert response.status_code == 400
    assert says in response.content.decode()
    assert not WebhookEvent.objects.exists()
