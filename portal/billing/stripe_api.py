"""The few Stripe API calls billing makes, through the official SDK, each with a timeout.

Callers get `StripeCallError` with a message a person can act on; `permanent` tells whether
repeating the same request can ever succeed (a refused request) or may (network, 5xx, 429).
"""

from __future__ import annotations

from typing import Any

import stripe

from portal.billing.config import BillingConfig


class StripeCallError(Exception):
    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def _client(config: BillingConfig) -> stripe.StripeClient:
    return stripe.StripeClient(
        config.secret_key,
        base_addresses={"api": config.api_base},
        max_network_retries=config.max_network_retries,
        http_client=stripe.RequestsClient(timeout=config.timeout_s),
    )


def _call(what: str, fn: Any, params: dict[str, Any], options: dict[str, Any]) -> Any:
    try:
        return fn(params, options)
    except (stripe.InvalidRequestError, stripe.IdempotencyError, stripe.PermissionError) as exc:
        raise StripeCallError(f"Stripe refused to {what}: {exc.user_message or exc}", permanent=True) from exc
    except stripe.AuthenticationError as exc:
        raise StripeCallError(
            f"Stripe did not accept the configured STRIPE_SECRET_KEY while trying to {what}.", permanent=False
        ) from exc
    except stripe.StripeError as exc:
        # Connection errors, 5xx and rate limits: the same request (same idempotency key) may
        # succeed later.
        raise StripeCallError(
            f"Could not reach Stripe to {what}: {exc.user_message or exc}", permanent=False
        ) from exc


def customer_create(config: BillingConfig, *, name: str, organization_id: str, idempotency_key: str) -> str:
    customer = _call(
        "create the customer",
        _client(config).v1.customers.create,
        {"name": name, "metadata": {"organization_id": organization_id}},
        {"idempotency_key": idempotency_key},
    )
    return str(customer.id)


def checkout_session_create(
    config: BillingConfig,
    *,
    customer_id: str,
    plan_price: str,
    organization_id: str,
    plan: str,
    success_url: str,
    cancel_url: str,
) -> str:
    line_items: list[dict[str, Any]] = [{"price": plan_price, "quantity": 1}]
    # Metered prices take no quantity: usage reported to their meters is what gets billed.
    line_items += [{"price": price} for price in config.metered_prices]
    session = _call(
        "start checkout",
        _client(config).v1.checkout.sessions.create,
        {
            "mode": "subscription",
            "customer": customer_id,
            "client_reference_id": organization_id,
            "line_items": line_items,
            "success_url": success_url,
            "cancel_url": cancel_url,
            "metadata": {"organization_id": organization_id, "plan": plan},
            "subscription_data": {"metadata": {"organization_id": organization_id, "plan": plan}},
        },
        {},
    )
    return str(session.url)


def portal_session_create(config: BillingConfig, *, customer_id: str, return_url: str) -> str:
    session = _call(
        "open the customer portal",
        _client(config).v1.billing_portal.sessions.create,
        {"customer": customer_id, "return_url": return_url},
        {},
    )
    return str(session.url)


def meter_event_create(
    config: BillingConfig,
    *,
    event_name: str,
    customer_id: str,
    value: int,
    timestamp: int,
    key: str,
    dimensions: dict[str, str],
) -> None:
    # The same key is both the HTTP idempotency key and the meter event's identifier: Stripe
    # deduplicates on either, so a retry after a lost response is not billed twice.
    _call(
        "report usage",
        _client(config).v1.billing.meter_events.create,
        {
            "event_name": event_name,
            "identifier": key,
            "timestamp": timestamp,
            "payload": {"stripe_customer_id": customer_id, "value": str(value), **dimensions},
        },
        {"idempotency_key": key},
    )


def credit_invoice_item_create(
    config: BillingConfig,
    *,
    customer_id: str,
    amount_cents: int,
    currency: str,
    description: str,
    metadata: dict[str, str],
    key: str,
) -> str:
    # A negative pending invoice item: Stripe takes it off the customer's next invoice. The key
    # derived from the business event makes a retry after a lost response a replay, not a second
    # credit.
    item = _call(
        "add the credit to the invoice",
        _client(config).v1.invoice_items.create,
        {
            "customer": customer_id,
            "amount": -abs(int(amount_cents)),
            "currency": currency,
            "description": description,
            "metadata": metadata,
        },
        {"idempotency_key": key},
    )
    return str(item.id)
