"""Billing: one Stripe customer per organization, locally recorded usage, and what was reported.

Usage is recorded here first (the source of truth) and reported to Stripe afterwards, one
report per (organization, meter, hardware, UTC hour). Rows are never deleted by billing code;
the audit trail says who changed what.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models


class SubscriptionStatus(models.TextChoices):
    # Our own coarse states; Stripe's raw status is kept beside them.
    NONE = "none", "Not subscribed"
    INCOMPLETE = "incomplete", "Awaiting first payment"
    ACTIVE = "active", "Active"
    PAST_DUE = "past_due", "Past due"
    CANCELED = "canceled", "Cancelled"


class BillingAccount(models.Model):
    """The organization's Stripe customer and the state of its subscription."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.OneToOneField(
        "accounts.Organization", on_delete=models.CASCADE, related_name="billing_account"
    )
    stripe_customer_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    stripe_subscription_id = models.CharField(max_length=255, blank=True)
    # The configured plan name whose price the subscription carries ("" when unknown).
    plan = models.CharField(max_length=64, blank=True)
    status = models.CharField(
        max_length=16, choices=SubscriptionStatus.choices, default=SubscriptionStatus.NONE
    )
    # Stripe's own word for the state (trialing, unpaid, incomplete_expired, ...).
    stripe_status = models.CharField(max_length=32, blank=True)
    current_period_end = models.DateTimeField(null=True, blank=True)
    # Usage from this UTC hour on is reported; usage before the subscription started is not billed.
    usage_billed_from = models.DateTimeField(null=True, blank=True)
    # `created` of the newest Stripe event applied to the state, so an older event delivered
    # late never overwrites a newer state.
    state_event_created = models.DateTimeField(null=True, blank=True)
    status_changed_at = models.DateTimeField(null=True, blank=True)
    # When the admins were last told of a change of state (billing_status_notify): a notice is
    # owed while this is older than `status_changed_at`, so a duplicated one sends nothing.
    status_notified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"billing of {self.organization_id} ({self.status})"

    @property
    def is_subscribed(self) -> bool:
        return self.status in {SubscriptionStatus.ACTIVE, SubscriptionStatus.PAST_DUE}


class Meter(models.TextChoices):
    # Values are short on purpose: they are part of the idempotency key (at most 100 characters).
    TUNING_MINUTES = "tuning_minutes", "Tuning trial-minutes"
    ENDPOINT_HOURS = "endpoint_hours", "Endpoint hours"


class UsageReport(models.Model):
    """One report of one (organization, meter, hardware, UTC hour) bucket to Stripe.

    `sequence` is 0 for the first report of a bucket; usage recorded after the bucket was
    reported goes out as a further report (1, 2, ...) carrying only the difference, so nothing
    is billed twice and nothing late is lost. The idempotency key is derived from these fields,
    so a retried send is answered by Stripe from its idempotency cache instead of billing again.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        SENT = "sent", "Reported to Stripe"
        # Rounded to zero billable units: nothing to send.
        EMPTY = "empty", "Nothing to bill"
        # Stripe refused it for good (e.g. older than Stripe accepts); kept for the record.
        FAILED = "failed", "Refused by Stripe"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    meter = models.CharField(max_length=16, choices=Meter.choices)
    # Hardware type for endpoint hours; "" for tuning.
    dimension = models.CharField(max_length=32, blank=True)
    hour = models.DateTimeField()
    sequence = models.PositiveIntegerField(default=0)
    # Whole billable units sent in this report: minutes (trial-minutes or endpoint-minutes).
    quantity = models.BigIntegerField()
    idempotency_key = models.CharField(max_length=100, unique=True)
    event_name = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    # A sender holds the report until this moment; a crashed sender's hold simply runs out.
    claimed_until = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-hour", "meter", "dimension", "sequence"]
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["organization", "meter", "dimension", "hour", "sequence"],
                name="usage_report_bucket_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.meter}/{self.dimension or '-'} {self.hour:%Y-%m-%d %H}:00 #{self.sequence}"


class UsageRecord(models.Model):
    """Usage inside one UTC hour, as it happened. Longer intervals are stored as one row per hour.

    `source` names the business event (e.g. `trial:42`, `endpoint:<id>:<segment start>`); with
    the hour it is unique, so recording the same thing twice stores it once.
    """

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    meter = models.CharField(max_length=16, choices=Meter.choices)
    dimension = models.CharField(max_length=32, blank=True)
    source = models.CharField(max_length=200)
    hour = models.DateTimeField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    # Exact duration inside the hour; billable units are rounded per hourly bucket, not per row.
    duration_ms = models.BigIntegerField()
    report = models.ForeignKey(
        UsageReport, null=True, blank=True, on_delete=models.PROTECT, related_name="records"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["hour", "started_at"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["meter", "source", "hour"], name="usage_record_source_unique")
        ]
        indexes: ClassVar = [
            models.Index(fields=["organization", "hour"]),
            models.Index(fields=["organization", "report"]),
        ]

    def __str__(self) -> str:
        return f"{self.meter} {self.source} {self.hour:%Y-%m-%d %H}:00 {self.duration_ms} ms"


class WebhookEvent(models.Model):
    """A Stripe event id seen by the webhook: stored in the transaction that applies it, so
    each event changes state exactly once however often Stripe delivers it."""

    stripe_event_id = models.CharField(max_length=255, unique=True)
    event_type = models.CharField(max_length=100)
    organization = models.ForeignKey(
        "accounts.Organization", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # What processing did: "applied", "stale", "ignored", "unknown-customer".
    outcome = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.stripe_event_id} {self.event_type} ({self.outcome})"


class InvoiceCredit(models.Model):
    """A credit owed to the customer (e.g. an SLA period's service credit), sent to Stripe as a
    negative invoice item on the customer's next invoice.

    `key` names the business event ("sla:<endpoint id>:2026-11"): it is unique, so a period's
    credit is recorded once however often the period is closed, and it derives the Stripe
    idempotency key, so a retried send never credits twice.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        SENT = "sent", "On the next invoice"
        # Billing is off, or the organization has no Stripe customer: kept, shown, not sent.
        HELD = "held", "Held (no Stripe customer)"
        FAILED = "failed", "Refused by Stripe"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=100, unique=True)
    # Positive: what is taken off the invoice, in the currency's smallest unit.
    amount_cents = models.BigIntegerField()
    currency = models.CharField(max_length=3, default="usd")
    description = models.CharField(max_length=300)
    # The period it is for (the credit's own window), for the billing page and the evidence pack.
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    stripe_invoice_item_id = models.CharField(max_length=255, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    claimed_until = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-period_start", "key"]

    def __str__(self) -> str:
        return f"credit {self.key}: {self.amount}"

    @property
    def amount(self) -> str:
        # Two decimals suit the currencies Stripe bills here (zero-decimal ones would need more).
        return f"{self.amount_cents / 100:,.2f} {self.currency.upper()}"
