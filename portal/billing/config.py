"""The billing configuration, read from settings on every call (tests override settings).

Billing is off unless STRIPE_SECRET_KEY is set; `portal.settings` refuses a half-configured
setup at start-up, so here "a key is set" means "billing is fully configured".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

HOW_TO_ENABLE = (
    "Billing is off. To turn it on, set STRIPE_SECRET_KEY, STRIPE_WEBHOOK_SECRET and "
    "STRIPE_PRICE_PLANS (name=price_id pairs, e.g. 'starter=price_123,scale=price_456'); "
    "optionally STRIPE_PRICE_METERED (the metered prices of the usage meters) and point a Stripe "
    "webhook at /billing/webhook/."
)

# What a customer is told instead: the environment is the operator's business, not theirs.
BILLING_OFF_NOTICE = (
    "Billing is off on this installation: nothing is charged and no usage is reported. "
    "The operator who runs Tailguard for you can turn it on."
)


@dataclass(frozen=True)
class BillingConfig:
    secret_key: str = field(repr=False)
    webhook_secret: str = field(repr=False)
    # Plan name -> Stripe price id of its recurring fee.
    plans: dict[str, str]
    # Metered price ids added to every subscription, so reported meter events are billed.
    metered_prices: list[str]
    api_base: str
    timeout_s: int
    max_network_retries: int
    webhook_tolerance_s: int
    meter_event_tuning: str
    meter_event_endpoint_prefix: str
    # How long after an hour ends its usage is reported (late records still arrive).
    usage_settle_s: int
    trial_lookback_h: int


def billing_config() -> BillingConfig | None:
    secret_key = getattr(settings, "STRIPE_SECRET_KEY", None)
    if not secret_key:
        return None
    return BillingConfig(
        secret_key=secret_key,
        webhook_secret=settings.STRIPE_WEBHOOK_SECRET or "",
        plans=dict(settings.STRIPE_PRICE_PLANS),
        metered_prices=list(settings.STRIPE_PRICE_METERED),
        api_base=settings.STRIPE_API_BASE,
        timeout_s=settings.STRIPE_TIMEOUT_S,
        max_network_retries=settings.STRIPE_MAX_NETWORK_RETRIES,
        webhook_tolerance_s=settings.STRIPE_WEBHOOK_TOLERANCE_S,
        meter_event_tuning=settings.STRIPE_METER_EVENT_TUNING,
        meter_event_endpoint_prefix=settings.STRIPE_METER_EVENT_ENDPOINT_PREFIX,
        usage_settle_s=settings.BILLING_USAGE_SETTLE_S,
        trial_lookback_h=settings.BILLING_TRIAL_LOOKBACK_H,
    )


def billing_enabled() -> bool:
    return billing_config() is not None
