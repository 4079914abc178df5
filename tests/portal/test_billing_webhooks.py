"""The Stripe webhook: real signatures (t=..., v1=HMAC-SHA256), rejected forgeries, timestamps
outside the tolerance in both directions, each event id applied once, and state from events."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from compliance.models import AuditEvent
from portal.accounts.models import Organization
from portal.billing.models import BillingAccount, SubscriptionStatus, WebhookEvent
from tests.portal.billing import enable_billing, post_webhook, sign, subscription_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def account(settings: Any, alice_org: Organization) -> BillingAccount:
    enable_billing(settings)
    return BillingAccount.objects.create(organization=alice_org, stripe_customer_id="cus_test_acme")


def _state(account: BillingAccount) -> tuple[Any, ...]:
    account.refresh_from_db()
    return (
        account.status,
        account.stripe_subscription_id,
        account.plan,
        WebhookEvent.objects.count(),
        AuditEvent.objects.filter(action__startswith="billing.").count(),
    )


def test_a_signed_event_is_applied_and_audited(account: BillingAccount) -> None:
    payload = subscription_event("evt_ok", "active", event_type="customer.subscription.created")
    response = post_webhook(payload, sign(payload))
    assert response.status_code == 200
    assert response.json() == {"received": True, "outcome": "applied"}
    assert _state(account)[:3] == (SubscriptionStatus.ACTIVE, "sub_test_1", "starter")
    event = AuditEvent.objects.get(action="billing.subscription.active")
    assert event.organization_id == account.organization_id
    assert event.data["from"] == "none" and event.data["event"] == "evt_ok"


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda p: (p.replace("active", "trialing"), sign(p)), id="tampered-body"),
        pytest.param(lambda p: (p, sign(p, secret="whsec_someone_else")), id="wrong-secret"),
        pytest.param(lambda p: (p, None), id="no-header"),
        pytest.param(lambda p: (p, "garbage"), id="malformed-header"),
        pytest.param(lambda p: (p, sign(p).replace("v1=", "v0=")), id="other-scheme"),
        pytest.param(lambda p: (p, sign(p, timestamp=int(time.time()) - 301)), id="too-old"),
        pytest.param(lambda p: (p, sign(p, timestamp=int(time.time()) + 301)), id="from-the-future"),
    ],
)
def test_forged_or_mistimed_deliveries_are_rejected_and_change_nothing(
    account: BillingAccount, forge: Any
) -> None:
    before = _state(account)
    payload, header = forge(subscription_event("evt_forged", "active"))
    response = post_webhook(payload, header)
    assert response.status_code == 400
    assert _state(account) == before
    assert not WebhookEvent.objects.filter(stripe_event_id="evt_forged").exists()


def test_timestamps_inside_the_tolerance_are_accepted_either_side(account: BillingAccount) -> None:
    for n, skew in enumerate((-290, 290)):
        payload = subscription_event(f"evt_skew_{n}", "active", created=int(time.time()) + n)
        assert post_webhook(payload, sign(payload, timestamp=int(time.time()) + skew)).status_code == 200
    assert WebhookEvent.objects.count() == 2


def test_a_replayed_event_is_processed_once(account: BillingAccount) -> None:
    payload = subscription_event("evt_once", "past_due")
    header = sign(payload)
    assert post_webhook(payload, header).json()["outcome"] == "applied"
    after_first = _state(account)
    # The same delivery again, and the same event re-signed later (Stripe's own retry).
    assert post_webhook(payload, header).json()["outcome"] == "duplicate"
    assert (
        post_webhook(payload, sign(payload, timestamp=int(time.time()) + 5)).json()["outcome"] == "duplicate"
    )
    assert _state(account) == after_first
    assert AuditEvent.objects.filter(action="billing.subscription.past_due").count() == 1


def test_subscription_lifecycle_and_out_of_order_events(account: BillingAccount) -> None:
    now = int(time.time())
    for event_id, status, created, expected in [
        ("evt_a", "active", now - 30, SubscriptionStatus.ACTIVE),
        ("evt_b", "past_due", now - 20, SubscriptionStatus.PAST_DUE),
        ("evt_c", "active", now - 10, SubscriptionStatus.ACTIVE),
    ]:
        payload = subscription_event(event_id, status, created=created)
        post_webhook(payload, sign(payload))
        account.refresh_from_db()
        assert account.status == expected
    # A delayed older event does not undo the newer state.
    payload = subscription_event("evt_late", "past_due", created=now - 25)
    assert post_webhook(payload, sign(payload)).json()["outcome"] == "stale"
    account.refresh_from_db()
    assert account.status == SubscriptionStatus.ACTIVE
    payload = subscription_event("evt_del", "active", created=now, event_type="customer.subscription.deleted")
    post_webhook(payload, sign(payload))
    account.refresh_from_db()
    assert (account.status, account.stripe_status) == (SubscriptionStatus.CANCELED, "canceled")
    actions = list(
        AuditEvent.objects.filter(action__startswith="billing.subscription.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "billing.subscription.active",
        "billing.subscription.past_due",
        "billing.subscription.active",
        "billing.subscription.canceled",
    ]


def test_checkout_completion_unknown_customers_and_other_events(account: BillingAccount) -> None:
    completed = json.dumps(
        {
            "id": "evt_cs",
            "type": "checkout.session.completed",
            "created": int(time.time()),
            "data": {
                "object": {
                    "id": "cs_1",
                    "mode": "subscription",
                    "customer": "cus_test_acme",
                    "subscription": "sub_new",
                }
            },
        }
    )
    assert post_webhook(completed, sign(completed)).json()["outcome"] == "applied"
    account.refresh_from_db()
    assert account.stripe_subscription_id == "sub_new"
    assert AuditEvent.objects.filter(action="billing.checkout.completed").count() == 1
    stranger = subscription_event("evt_stranger", "active", customer="cus_unknown")
    assert post_webhook(stranger, sign(stranger)).json()["outcome"] == "unknown-customer"
    other = json.dumps(
        {"id": "evt_inv", "type": "invoice.created", "created": int(time.time()), "data": {"object": {}}}
    )
    assert post_webhook(other, sign(other)).json()["outcome"] == "ignored"
    not_event = json.dumps({"hello": "world"})
    assert post_webhook(not_event, sign(not_event)).status_code == 400
    assert Client().get(reverse("billing:webhook")).status_code == 405
