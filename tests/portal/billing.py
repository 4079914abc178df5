"""Billing's test doubles and helpers: a Stripe API on loopback (`FakeStripe`), the settings
that turn billing on, signed webhook payloads and a subscribed organization. The fixtures
(`stripe_fake`, `billing`) are registered for every portal test in tests/portal/conftest.py."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest
from django.test import Client
from django.urls import reverse

from portal.accounts.models import Organization
from portal.billing import services
from portal.billing.models import BillingAccount, Meter, UsageReport

WEBHOOK_SECRET = "whsec_tailguard_test_only"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- A Stripe API on loopback -------------------------------------------------------------------


class FakeStripe:
    """Answers the few Stripe API calls billing makes and records what was sent.

    Like Stripe, it replays the stored answer for an Idempotency-Key it has seen, and bills a
    meter event once per identifier. `inject` queues faults: "error" answers 500 without doing
    anything; "lost" does the work, then answers 500 (a response lost on the way back).
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: dict[str, tuple[int, bytes]] = {}
        self.billed: dict[str, dict[str, str]] = {}
        self.faults: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                params = dict(parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True))
                status, body, headers = fake.handle(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, params
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(self, path: str, *faults: str) -> None:
        self.faults.setdefault(path, []).extend(faults)

    def calls(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]

    def handle(
        self, path: str, headers: dict[str, str], params: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        with self.lock:
            self.requests.append({"path": path, "headers": headers, "params": params})
            fault = self.faults.get(path, []).pop(0) if self.faults.get(path) else None
            if fault == "error":
                return 500, json.dumps({"error": {"type": "api_error", "message": "boom"}}).encode(), {}
            key = headers.get("idempotency-key")
            if key and key in self.replies:
                status, body = self.replies[key]
                return status, body, {"Idempotent-Replayed": "true"}
            status, reply = self._answer(path, params)
            body = json.dumps(reply).encode()
            if key:
                self.replies[key] = (status, body)
            if fault == "lost":
                return 500, json.dumps({"error": {"type": "api_error", "message": "lost"}}).encode(), {}
            return status, body, {}

    def _answer(self, path: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        n = len(self.requests)
        if path == "/v1/customers":
            return 200, {"id": "cus_test_acme", "object": "customer", "name": params.get("name")}
        if path == "/v1/checkout/sessions":
            return 200, {
                "id": f"cs_test_{n}",
                "object": "checkout.session",
                "mode": "subscription",
                "url": f"https://checkout.stripe.test/c/pay/cs_test_{n}",
            }
        if path == "/v1/billing_portal/sessions":
            return 200, {
                "id": f"bps_test_{n}",
                "object": "billing_portal.session",
                "url": f"https://billing.stripe.test/p/session/{n}",
            }
        if path == "/v1/billing/meter_events":
            timestamp = int(params["timestamp"])
            if timestamp < time.time() - 35 * 86400:
                return 400, {
                    "error": {
                        "type": "invalid_request_error",
                        "message": "Timestamp must be within the past 35 calendar days.",
                    }
                }
            identifier = params["identifier"]
            # A repeated identifier is not billed again (Stripe deduplicates for at least 24 h).
            self.billed.setdefault(
                identifier,
                {
                    "event_name": params["event_name"],
                    **{k: v for k, v in params.items() if k.startswith("payload")},
                },
            )
            return 200, {
                "object": "billing.meter_event",
                "event_name": params["event_name"],
                "identifier": identifier,
                "timestamp": timestamp,
                "created": int(time.time()),
                "livemode": False,
                "payload": {"stripe_customer_id": params.get("payload[stripe_customer_id]")},
            }
        if path == "/v1/invoiceitems":
            # A pending invoice item (negative for a credit) on the customer's next invoice.
            return 200, {
                "id": f"ii_test_{n}",
                "object": "invoiceitem",
                "customer": params.get("customer"),
                "amount": int(params["amount"]),
                "currency": params.get("currency"),
                "description": params.get("description"),
            }
        return 404, {"error": {"type": "invalid_request_error", "message": f"no route {path}"}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stripe_fake() -> Iterator[FakeStripe]:
    fake = FakeStripe()
    yield fake
    fake.close()


def enable_billing(settings: Any, api_base: str = "http://127.0.0.1:9") -> None:
    settings.STRIPE_SECRET_KEY = "sk_test_tailguard_fake"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_PRICE_PLANS = {"starter": "price_starter", "scale": "price_scale"}
    settings.STRIPE_PRICE_METERED = ["price_tuning_minutes", "price_endpoint_h200"]
    settings.STRIPE_API_BASE = api_base
    settings.STRIPE_MAX_NETWORK_RETRIES = 0
    settings.STRIPE_TIMEOUT_S = 5
    settings.BILLING_USAGE_SETTLE_S = 900
    settings.SITE_URL = "https://portal.test"


@pytest.fixture
def billing(settings: Any, stripe_fake: FakeStripe) -> FakeStripe:
    enable_billing(settings, stripe_fake.url)
    return stripe_fake


def sign(payload: str, *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> str:
    """The Stripe-Signature header, computed the way Stripe does (t=..., v1=HMAC-SHA256)."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def subscription_event(
    event_id: str,
    status: str,
    *,
    customer: str = "cus_test_acme",
    created: int | None = None,
    event_type: str = "customer.subscription.updated",
    subscription: str = "sub_test_1",
    start_date: int | None = None,
) -> str:
    now = int(time.time())
    return json.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "created": now if created is None else created,
            "data": {
                "object": {
                    "id": subscription,
                    "object": "subscription",
                    "customer": customer,
                    "status": status,
                    "start_date": start_date if start_date is not None else now - 7200,
                    "items": {
                        "object": "list",
                        "data": [
                            {"price": {"id": "price_starter"}, "current_period_end": now + 30 * 86400},
                            {"price": {"id": "price_tuning_minutes"}, "current_period_end": now + 30 * 86400},
                        ],
                    },
                }
            },
        }
    )


def post_webhook(payload: str, header: str | None) -> Any:
    extra = {"HTTP_STRIPE_SIGNATURE": header} if header is not None else {}
    return Client().post(reverse("billing:webhook"), payload, content_type="application/json", **extra)


def subscribe(
    org: Organization, *, status: str = "active", billed_from: datetime | None = None
) -> BillingAccount:
    """An organization whose checkout finished and whose subscription Stripe reported."""
    account, _ = BillingAccount.objects.get_or_create(organization=org)
    account.stripe_customer_id = account.stripe_customer_id or f"cus_test_{org.slug}"
    account.stripe_subscription_id = "sub_test_1"
    account.status = status
    account.usage_billed_from = billed_from or utc(2020, 1, 1)
    account.save()
    return account


def reported_usage(org: Organization) -> UsageReport:
    """A subscribed organization with four tuning minutes recorded and prepared as a usage report."""
    subscribe(org)
    hour = utc(2026, 3, 1, 9)
    services.usage_record(
        organization=org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=4),
        source="trial:r",
    )
    services.usage_reports_prepare(now=hour + timedelta(hours=2))
    return UsageReport.objects.get(organization=org)
