"""Writes of billing: customers and checkout, usage recording and reporting, Stripe webhooks.

Every state change writes its audit event in the same transaction. Calls to Stripe happen
outside row locks where possible and always carry a key derived from the business event, so
repeating any of them (a double click, a retried task, a redelivered webhook) changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import stripe
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q, Sum
from django.urls import reverse
from django.utils import timezone

from compliance.services import audit_record
from portal.accounts.models import Membership, Organization, Role, User
from portal.billing import stripe_api
from portal.billing.config import BILLING_OFF_NOTICE, BillingConfig, billing_config
from portal.billing.models import (
    BillingAccount,
    InvoiceCredit,
    Meter,
    SubscriptionStatus,
    UsageRecord,
    UsageReport,
    WebhookEvent,
)
from portal.billing.usage import (
    billable_minutes,
    hour_ceil,
    hour_floor,
    idempotency_key,
    normalize_dimension,
    split_by_hour,
)
from portal.endpoints.models import Endpoint
from portal.jobs.models import Trial
from portal.outbox.services import outbox_enqueue

logger = logging.getLogger(__name__)

# A sender holds a report this long; longer than one Stripe call with its retries.
_SEND_LEASE = timedelta(minutes=5)

# Stripe's subscription statuses, folded into ours.
_STATUS_FROM_STRIPE = {
    "active": SubscriptionStatus.ACTIVE,
    "trialing": SubscriptionStatus.ACTIVE,
    "past_due": SubscriptionStatus.PAST_DUE,
    "unpaid": SubscriptionStatus.PAST_DUE,
    # A paused subscription (trial ended without a payment method) is not paying either.
    "paused": SubscriptionStatus.PAST_DUE,
    "incomplete": SubscriptionStatus.INCOMPLETE,
    "incomplete_expired": SubscriptionStatus.CANCELED,
    "canceled": SubscriptionStatus.CANCELED,
}


class BillingError(Exception):
    """A billing action that could not be done; the message tells the person why."""


class WebhookRejected(Exception):
    """A webhook delivery that is not provably from Stripe (or not now); answered with 400."""


def _require_config() -> BillingConfig:
    config = billing_config()
    if config is None:
        # Shown to customers (a checkout attempt): a sentence, not the operator's settings.
        raise ValidationError(BILLING_OFF_NOTICE)
    return config


def _require_billing_admin(actor: User, organization: Organization) -> None:
    membership = Membership.objects.filter(user=actor, organization=organization).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organization.")
    if not membership.has_role(Role.ADMIN):
        raise PermissionDenied(f"Only an admin or above can manage billing; your role is {membership.role}.")


def _site_url(path: str) -> str:
    return settings.SITE_URL + path


# --- Gate used by other apps ------------------------------------------------------------------


def billing_assert_can_start_jobs(*, organization: Organization) -> None:
    """Refuses new tuning jobs while the subscription is past due. Running work is untouched."""
    if billing_config() is None:
        return
    status = BillingAccount.objects.filter(organization=organization).values_list("status", flat=True).first()
    if status == SubscriptionStatus.PAST_DUE:
        raise ValidationError(
            "Your subscription is past due, so new tuning jobs cannot start. Running jobs and "
            "endpoints keep running. An admin can update the payment method on the Billing page."
        )


# --- Customer, checkout and the customer portal -------------------------------------------------


def billing_account_ensure(*, organization: Organization) -> BillingAccount:
    account, _ = BillingAccount.objects.get_or_create(organization=organization)
    return account


def _ensure_customer(*, actor: User, organization: Organization, config: BillingConfig) -> BillingAccount:
    billing_account_ensure(organization=organization)
    with transaction.atomic():
        # The row lock makes concurrent first subscriptions wait for one customer; the derived
        # idempotency key covers a crash between Stripe's answer and this commit.
        account = BillingAccount.objects.select_for_update().get(organization=organization)
        if account.stripe_customer_id:
            return account
        try:
            customer_id = stripe_api.customer_create(
                config,
                name=organization.name,
                organization_id=str(organization.id),
                idempotency_key=f"tg:customer:{organization.id}",
            )
        except stripe_api.StripeCallError as exc:
            raise BillingError(str(exc)) from None
        account.stripe_customer_id = customer_id
        account.save(update_fields=["stripe_customer_id", "updated_at"])
        audit_record(
            actor=actor,
            organization=organization,
            action="billing.customer.create",
            target=account,
            data={"stripe_customer_id": customer_id},
        )
    return account


def billing_checkout_start(*, actor: User, organization: Organization, plan: str) -> str:
    """Returns the Stripe Checkout URL to send the person to."""
    _require_billing_admin(actor, organization)
    config = _require_config()
    price = config.plans.get(plan)
    if price is None:
        raise ValidationError({"plan": f"Choose one of: {', '.join(sorted(config.plans))}."})
    account = BillingAccount.objects.filter(organization=organization).first()
    if account is not None and account.is_subscribed:
        raise ValidationError(
            "This organization already has a subscription; change it in the customer portal."
        )
    account = _ensure_customer(actor=actor, organization=organization, config=config)
    overview = reverse("billing:overview")
    try:
        url = stripe_api.checkout_session_create(
            config,
            customer_id=str(account.stripe_customer_id),
            plan_price=price,
            organization_id=str(organization.id),
            plan=plan,
            success_url=_site_url(overview + "?checkout=success"),
            cancel_url=_site_url(overview + "?checkout=cancelled"),
        )
    except stripe_api.StripeCallError as exc:
        raise BillingError(str(exc)) from None
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=organization,
            action="billing.checkout.start",
            target=account,
            data={"plan": plan, "price": price},
        )
    return url


def billing_portal_start(*, actor: User, organization: Organization) -> str:
    """Returns the Stripe customer portal URL (payment methods, plan changes, cancellation)."""
    _require_billing_admin(actor, organization)
    config = _require_config()
    account = BillingAccount.objects.filter(organization=organization).first()
    if account is None or not account.stripe_customer_id:
        raise ValidationError(
            "Subscribe to a plan first; the customer portal manages an existing subscription."
        )
    try:
        url = stripe_api.portal_session_create(
            config, customer_id=account.stripe_customer_id, return_url=_site_url(reverse("billing:overview"))
        )
    except stripe_api.StripeCallError as exc:
        raise BillingError(str(exc)) from None
    with transaction.atomic():
        audit_record(actor=actor, organization=organization, action="billing.portal.open", target=account)
    return url


# --- Usage: recording ----------------------------------------------------------------------------


def usage_record(
    *,
    organization: Organization,
    meter: str,
    started_at: datetime,
    ended_at: datetime,
    source: str,
    dimension: str = "",
) -> int:
    """Records usage as it happened, one row per UTC hour it touches. Returns rows stored.

    Idempotent per (meter, source, hour): recording the same business event again stores
    nothing. An endpoint runner records each closed running segment with
    `meter=Meter.ENDPOINT_HOURS`, `dimension=<hardware type>` and a `source` naming the segment
    (e.g. `endpoint:<id>:<segment start>`).
    """
    if meter not in Meter.values:
        raise ValidationError({"meter": f"Unknown meter {meter!r}; use one of {', '.join(Meter.values)}."})
    if meter == Meter.ENDPOINT_HOURS:
        try:
            dimension = normalize_dimension(dimension)
        except ValueError as exc:
            raise ValidationError({"dimension": str(exc)}) from None
    elif dimension:
        raise ValidationError({"dimension": "Tuning minutes carry no hardware type."})
    source = (source or "").strip()
    if not source or len(source) > 200:
        raise ValidationError({"source": "Name the usage's source in 1 to 200 characters."})
    try:
        slices = split_by_hour(started_at, ended_at)
    except ValueError as exc:
        raise ValidationError({"ended_at": str(exc)}) from None
    rows = [
        UsageRecord(
            organization=organization,
            meter=meter,
            dimension=dimension,
            source=source,
            hour=s.hour,
            started_at=s.started_at,
            ended_at=s.ended_at,
            duration_ms=s.duration_ms,
        )
        for s in slices
        if s.duration_ms > 0
    ]
    before = UsageRecord.objects.filter(meter=meter, source=source).count()
    UsageRecord.objects.bulk_create(rows, ignore_conflicts=True)
    return UsageRecord.objects.filter(meter=meter, source=source).count() - before


def usage_collect_trials(*, now: datetime | None = None, lookback: timedelta | None = None) -> int:
    """Records trial-minutes of finished trials not recorded yet. Returns trials recorded.

    A trial's minutes run from its start to its finish (a trial re-run after a worker died is
    billed from its first start: the row keeps one start time).
    """
    now = now or timezone.now()
    if lookback is None:
        config = billing_config()
        lookback = timedelta(hours=config.trial_lookback_h if config else 48)
    trials = list(
        Trial.objects.filter(
            status=Trial.Status.DONE, finished_at__isnull=False, finished_at__gte=now - lookback
        ).values("id", "organization_id", "started_at", "finished_at")
    )
    sources = {f"trial:{t['id']}": t for t in trials}
    seen = set(
        UsageRecord.objects.filter(meter=Meter.TUNING_MINUTES, source__in=list(sources)).values_list(
            "source", flat=True
        )
    )
    recorded = 0
    for source, trial in sources.items():
        finished_at = trial["finished_at"]
        if source in seen or finished_at is None or finished_at < trial["started_at"]:
            continue  # (finished_at is never None here: the query excludes it)
        rows = [
            UsageRecord(
                organization_id=trial["organization_id"],
                meter=Meter.TUNING_MINUTES,
                dimension="",
                source=source,
                hour=s.hour,
                started_at=s.started_at,
                ended_at=s.ended_at,
                duration_ms=s.duration_ms,
            )
            for s in split_by_hour(trial["started_at"], finished_at)
            if s.duration_ms > 0
        ]
        UsageRecord.objects.bulk_create(rows, ignore_conflicts=True)
        recorded += 1
    return recorded


def _endpoint_hardware(spec: object) -> str:
    hardware = (spec or {}).get("hardware") if isinstance(spec, dict) else None
    try:
        return normalize_dimension(str(hardware or "unspecified"))
    except ValueError:
        return "unspecified"


def usage_collect_endpoints(*, now: datetime | None = None, lookback: timedelta | None = None) -> int:
    """Records endpoint hours by hardware type (the tuning job's `hardware`). Returns rows stored.

    A running endpoint is recorded for each hour once that hour is over; a stopped one up to its
    stop. Each (endpoint, hour) is recorded once (the source is the endpoint), so running this
    every few minutes bills every hour exactly once. An endpoint that failed to start never
    served and is not billed.
    """

    now = now or timezone.now()
    if lookback is None:
        config = billing_config()
        lookback = timedelta(hours=config.trial_lookback_h if config else 48)
    horizon = hour_floor(now - lookback)
    endpoints = Endpoint.objects.filter(
        Q(status__in=Endpoint.ACTIVE) | Q(status=Endpoint.Status.STOPPED, stopped_at__gte=horizon)
    ).values("id", "organization_id", "status", "created_at", "stopped_at", "job__spec")
    stored = 0
    for endpoint in endpoints:
        stopped = endpoint["status"] == Endpoint.Status.STOPPED
        end = endpoint["stopped_at"] if stopped else hour_floor(now)
        start = max(endpoint["created_at"], horizon)
        if end is None or end <= start:
            continue
        source = f"endpoint:{endpoint['id']}"
        rows = [
            UsageRecord(
                organization_id=endpoint["organization_id"],
                meter=Meter.ENDPOINT_HOURS,
                dimension=_endpoint_hardware(endpoint["job__spec"]),
                source=source,
                hour=s.hour,
                started_at=s.started_at,
                ended_at=s.ended_at,
                duration_ms=s.duration_ms,
            )
            for s in split_by_hour(start, end)
            if s.duration_ms > 0
        ]
        before = UsageRecord.objects.filter(meter=Meter.ENDPOINT_HOURS, source=source).count()
        UsageRecord.objects.bulk_create(rows, ignore_conflicts=True)
        stored += UsageRecord.objects.filter(meter=Meter.ENDPOINT_HOURS, source=source).count() - before
    return stored


# --- Usage: reporting -----------------------------------------------------------------------------


def _event_name(config: BillingConfig, meter: str, dimension: str) -> str:
    if meter == Meter.TUNING_MINUTES:
        return config.meter_event_tuning
    return f"{config.meter_event_endpoint_prefix}{dimension.replace('-', '_')}"


def usage_reports_prepare(*, now: datetime | None = None) -> int:
    """Turns unreported usage of settled hours into reports. Returns reports created.

    An hour is settled `usage_settle_s` after it ends. Usage recorded after its hour was
    reported becomes a further report of the difference (sequence 1, 2, ...). Only hours from
    the subscription's start are billed, and only while the organization is subscribed.
    """
    config = _require_config()
    now = now or timezone.now()
    cutoff = hour_floor(now - timedelta(seconds=config.usage_settle_s))
    created = 0
    account_ids = BillingAccount.objects.filter(
        status__in=[SubscriptionStatus.ACTIVE, SubscriptionStatus.PAST_DUE],
        stripe_customer_id__isnull=False,
        usage_billed_from__isnull=False,
    ).values_list("id", flat=True)
    for account_id in account_ids:
        with transaction.atomic():
            # One preparer per organization at a time: the sequence numbers stay dense.
            account = BillingAccount.objects.select_for_update().get(id=account_id)
            if not account.is_subscribed or account.usage_billed_from is None:
                continue
            organization_id = account.organization_id
            unreported = UsageRecord.objects.filter(
                organization_id=organization_id,
                report__isnull=True,
                hour__lt=cutoff,
                hour__gte=account.usage_billed_from,
            )
            buckets = (
                unreported.values("meter", "dimension", "hour")
                .distinct()
                .order_by("hour", "meter", "dimension")
            )
            for bucket in list(buckets):
                in_bucket = {
                    "organization_id": organization_id,
                    "meter": bucket["meter"],
                    "dimension": bucket["dimension"],
                    "hour": bucket["hour"],
                }
                total_ms = UsageRecord.objects.filter(**in_bucket).aggregate(ms=Sum("duration_ms"))["ms"] or 0
                prior = UsageReport.objects.filter(**in_bucket).aggregate(
                    q=Sum("quantity"), n=Max("sequence")
                )
                # Rounded over the whole bucket, minus what earlier reports of it already billed.
                quantity = max(billable_minutes(total_ms) - (prior["q"] or 0), 0)
                sequence = 0 if prior["n"] is None else prior["n"] + 1
                report = UsageReport.objects.create(
                    **in_bucket,
                    sequence=sequence,
                    quantity=quantity,
                    idempotency_key=idempotency_key(
                        organization_id=organization_id,
                        meter=bucket["meter"],
                        dimension=bucket["dimension"],
                        hour=bucket["hour"],
                        sequence=sequence,
                    ),
                    event_name=_event_name(config, bucket["meter"], bucket["dimension"]),
                    status=UsageReport.Status.PENDING if quantity else UsageReport.Status.EMPTY,
                )
                unreported.filter(
                    meter=bucket["meter"], dimension=bucket["dimension"], hour=bucket["hour"]
                ).update(report=report)
                created += 1
    return created


def usage_report_send(*, report_id: uuid.UUID | str, now: datetime | None = None) -> str:
    """Sends one pending report to Stripe. Returns "sent", "retry", "failed" or "busy-or-done".

    The report is claimed with a conditional update first, so a duplicated task sends nothing;
    a sender that died mid-call loses its claim after `_SEND_LEASE` and the next run re-sends
    with the same idempotency key, which Stripe answers without billing again.
    """
    config = _require_config()
    now = now or timezone.now()
    claimed = (
        UsageReport.objects.filter(id=report_id, status=UsageReport.Status.PENDING)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + _SEND_LEASE)
    )
    if not claimed:
        return "busy-or-done"
    report = UsageReport.objects.select_related("organization").get(id=report_id)
    UsageReport.objects.filter(id=report_id).update(attempts=report.attempts + 1)
    account = BillingAccount.objects.get(organization_id=report.organization_id)
    try:
        stripe_api.meter_event_create(
            config,
            event_name=report.event_name,
            customer_id=str(account.stripe_customer_id),
            value=report.quantity,
            timestamp=int(report.hour.timestamp()),
            key=report.idempotency_key,
            dimensions={"hardware": report.dimension} if report.dimension else {},
        )
    except stripe_api.StripeCallError as exc:
        if not exc.permanent:
            UsageReport.objects.filter(id=report_id).update(claimed_until=None, error=str(exc))
            logger.warning("usage report %s not sent yet: %s", report_id, exc)
            return "retry"
        with transaction.atomic():
            UsageReport.objects.filter(id=report_id).update(
                status=UsageReport.Status.FAILED, claimed_until=None, error=str(exc)
            )
            audit_record(
                actor=None,
                organization=report.organization,
                action="billing.usage_report.failed",
                target=report,
                data={"key": report.idempotency_key, "quantity": report.quantity, "error": str(exc)[:300]},
            )
        return "failed"
    with transaction.atomic():
        UsageReport.objects.filter(id=report_id, status=UsageReport.Status.PENDING).update(
            status=UsageReport.Status.SENT, sent_at=timezone.now(), claimed_until=None, error=""
        )
        audit_record(
            actor=None,
            organization=report.organization,
            action="billing.usage_report.sent",
            target=report,
            data={
                "meter": report.meter,
                "dimension": report.dimension,
                "hour": report.hour.isoformat(),
                "quantity": report.quantity,
                "key": report.idempotency_key,
            },
        )
    return "sent"


def usage_report_run(*, now: datetime | None = None) -> dict[str, int]:
    """The scheduled job: record trials and endpoint hours, prepare settled hours, send them."""
    if billing_config() is None:
        return {"enabled": 0}
    now = now or timezone.now()
    outcome: dict[str, int] = {
        "enabled": 1,
        "trials_recorded": usage_collect_trials(now=now),
        "endpoint_hours_recorded": usage_collect_endpoints(now=now),
        "reports_prepared": usage_reports_prepare(now=now),
    }
    pending = UsageReport.objects.filter(status=UsageReport.Status.PENDING).order_by("hour", "sequence")
    for report_id in list(pending.values_list("id", flat=True)):
        result = usage_report_send(report_id=report_id, now=now)
        outcome[result] = outcome.get(result, 0) + 1
    outcome.update(invoice_credits_send_pending(now=now))
    return outcome


# --- Credits on the invoice --------------------------------------------------------------------

# The most one credit may take off an invoice (a typo in a fee must not wipe out a year's billing).
CREDIT_MAX_CENTS = 100_000_000


def invoice_credit_add(
    *,
    organization: Organization,
    key: str,
    amount_cents: int,
    currency: str,
    description: str,
    period_start: datetime,
    period_end: datetime,
    data: dict[str, Any] | None = None,
) -> InvoiceCredit:
    """Records a credit owed (idempotent by `key`: the same key returns the first record) and
    sends it to Stripe after the commit. Call inside the transaction that decided the credit."""
    key = (key or "").strip()
    errors: dict[str, str] = {}
    if not key or len(key) > 100:
        errors["key"] = "Name the credit's business event in 1 to 100 characters."
    if not 0 < int(amount_cents) <= CREDIT_MAX_CENTS:
        errors["amount_cents"] = f"A credit must be between 1 and {CREDIT_MAX_CENTS} cents."
    if not re.fullmatch(r"[a-z]{3}", currency or ""):
        errors["currency"] = "Use a three-letter ISO currency code in lower case, e.g. usd."
    if period_end <= period_start:
        errors["period_end"] = "The period ends before it starts."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        credit, created = InvoiceCredit.objects.get_or_create(
            key=key,
            defaults={
                "organization": organization,
                "amount_cents": int(amount_cents),
                "currency": currency,
                "description": description[:300],
                "period_start": period_start,
                "period_end": period_end,
            },
        )
        if created:
            audit_record(
                actor=None,
                organization=organization,
                action="billing.credit.record",
                target=credit,
                data={
                    "key": key,
                    "amount_cents": credit.amount_cents,
                    "currency": currency,
                    "period_start": period_start.isoformat(),
                    **(data or {}),
                },
            )
            # Sent after the commit, or by the outbox's beat if the broker is down then (the
            # scheduled billing run also retries every credit Stripe has not taken).
            outbox_enqueue(
                task="portal.billing.tasks.invoice_credit_send",
                kwargs={"credit_id": str(credit.id)},
                key=f"invoice_credit.send:{credit.id}",
            )
    return credit


def invoice_credit_send(*, credit_id: uuid.UUID | str, now: datetime | None = None) -> str:
    """Sends one pending credit to Stripe as a negative invoice item. Returns "sent", "held",
    "retry", "failed" or "busy-or-done"; claimed first, so a duplicated task sends nothing."""
    now = now or timezone.now()
    config = billing_config()
    credit = InvoiceCredit.objects.filter(id=credit_id).select_related("organization").first()
    if credit is None:
        return "busy-or-done"
    account = BillingAccount.objects.filter(organization_id=credit.organization_id).first()
    if config is None or account is None or not account.stripe_customer_id:
        InvoiceCredit.objects.filter(id=credit_id, status=InvoiceCredit.Status.PENDING).update(
            status=InvoiceCredit.Status.HELD
        )
        return "held"
    claimed = (
        InvoiceCredit.objects.filter(
            id=credit_id, status__in=[InvoiceCredit.Status.PENDING, InvoiceCredit.Status.HELD]
        )
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + _SEND_LEASE, attempts=credit.attempts + 1)
    )
    if not claimed:
        return "busy-or-done"
    try:
        item_id = stripe_api.credit_invoice_item_create(
            config,
            customer_id=account.stripe_customer_id,
            amount_cents=credit.amount_cents,
            currency=credit.currency,
            description=credit.description,
            metadata={"tailguard_credit": credit.key, "organization_id": str(credit.organization_id)},
            key=f"tg:credit:{credit.key}",
        )
    except stripe_api.StripeCallError as exc:
        if not exc.permanent:
            InvoiceCredit.objects.filter(id=credit_id).update(claimed_until=None, error=str(exc))
            return "retry"
        with transaction.atomic():
            InvoiceCredit.objects.filter(id=credit_id).update(
                status=InvoiceCredit.Status.FAILED, claimed_until=None, error=str(exc)
            )
            audit_record(
                actor=None,
                organization=credit.organization,
                action="billing.credit.failed",
                target=credit,
                data={"key": credit.key, "error": str(exc)[:300]},
            )
        return "failed"
    with transaction.atomic():
        InvoiceCredit.objects.filter(id=credit_id).update(
            status=InvoiceCredit.Status.SENT,
            stripe_invoice_item_id=item_id,
            sent_at=timezone.now(),
            claimed_until=None,
            error="",
        )
        audit_record(
            actor=None,
            organization=credit.organization,
            action="billing.credit.sent",
            target=credit,
            data={"key": credit.key, "amount_cents": credit.amount_cents, "invoice_item": item_id},
        )
    return "sent"


def invoice_credits_send_pending(*, now: datetime | None = None) -> dict[str, int]:
    outcome: dict[str, int] = {}
    waiting = InvoiceCredit.objects.filter(
        status__in=[InvoiceCredit.Status.PENDING, InvoiceCredit.Status.HELD]
    ).order_by("created_at")
    for credit_id in list(waiting.values_list("id", flat=True)[:500]):
        result = invoice_credit_send(credit_id=credit_id, now=now)
        outcome[f"credit_{result}"] = outcome.get(f"credit_{result}", 0) + 1
    return outcome


# --- Webhooks --------------------------------------------------------------------------------------


# Stripe's timestamps are Unix seconds; anything outside these years is not a real delivery
# (and a huge integer would overflow the float and datetime arithmetic below).
_EARLIEST_TIMESTAMP = 946_684_800  # 2000-01-01T00:00:00Z
_LATEST_TIMESTAMP = 32_503_680_000  # 3000-01-01T00:00:00Z
_TIMESTAMP = re.compile(r"[0-9]{1,11}")


def _signature_timestamp(header: str) -> int:
    """The header's `t=` value: one timestamp of ASCII digits in the accepted years."""
    values = [
        value.strip()
        for key, _, value in (part.strip().partition("=") for part in header.split(","))
        if key == "t"
    ]
    if not values:
        raise WebhookRejected("The Stripe-Signature header has no timestamp (t=...).")
    if len(values) > 1:
        raise WebhookRejected("The Stripe-Signature header has more than one timestamp (t=...).")
    if not _TIMESTAMP.fullmatch(values[0]):
        raise WebhookRejected("The Stripe-Signature timestamp (t=...) is not a Unix time in seconds.")
    timestamp = int(values[0])
    if not _EARLIEST_TIMESTAMP <= timestamp < _LATEST_TIMESTAMP:
        raise WebhookRejected("The Stripe-Signature timestamp (t=...) is not a time in years 2000-2999.")
    return timestamp


def webhook_verify(*, payload: bytes, signature_header: str | None) -> dict[str, Any]:
    """The event, if the payload is signed with the configured secret at about this moment.

    Anything else is `WebhookRejected` with the reason (answered 400), never an exception that
    would answer 500: Stripe retries 5xx for days, and a 400 tells a sender what is wrong."""
    config = _require_config()
    tolerance = config.webhook_tolerance_s
    if not signature_header:
        raise WebhookRejected("Signature verification failed: the Stripe-Signature header is missing.")
    # The timestamp is checked before the SDK sees it: the SDK accepts any integer, and one far
    # in the future is refused here too, so a signature cannot be prepared now and replayed later.
    timestamp = _signature_timestamp(signature_header)
    skew = timestamp - int(time.time())
    if abs(skew) > tolerance:
        raise WebhookRejected(f"Signature timestamp is {skew:+d} s from now (tolerance {tolerance} s).")
    try:
        text = payload.decode("utf-8")
        stripe.WebhookSignature.verify_header(text, signature_header, config.webhook_secret, tolerance)
    except (stripe.SignatureVerificationError, UnicodeDecodeError, ValueError) as exc:
        raise WebhookRejected(f"Signature verification failed: {exc}") from None
    try:
        event = json.loads(text)
        if not isinstance(event, dict):
            raise ValueError("not an object")
        for key in ("id", "type", "created"):
            if key not in event:
                raise ValueError(f"missing {key!r}")
        if not isinstance(event["id"], str) or not 0 < len(event["id"]) <= 255:
            raise ValueError("'id' must be a string of 1 to 255 characters")
        created = event["created"]
        if not isinstance(created, int) or isinstance(created, bool) or not isinstance(event["type"], str):
            raise ValueError("'created' must be a timestamp and 'type' a string")
        if not _EARLIEST_TIMESTAMP <= created < _LATEST_TIMESTAMP:
            raise ValueError("'created' is not a Unix time in years 2000-2999")
        data = event.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
            raise ValueError("missing data.object")
    except ValueError as exc:
        raise WebhookRejected(f"Not a Stripe event: {exc}") from None
    return event


def _plan_of(subscription: dict[str, Any], config: BillingConfig) -> str:
    by_price = {price: name for name, price in config.plans.items()}
    for item in (subscription.get("items") or {}).get("data") or []:
        price = (item.get("price") or {}).get("id")
        if price in by_price:
            return by_price[price]
    return ""


def _period_end(subscription: dict[str, Any]) -> datetime | None:
    # Newer API versions keep the period on each item rather than on the subscription.
    ends = [subscription.get("current_period_end")]
    ends += [item.get("current_period_end") for item in (subscription.get("items") or {}).get("data") or []]
    values = [int(e) for e in ends if isinstance(e, int | float)]
    return datetime.fromtimestamp(max(values), tz=UTC) if values else None


def _notify_admins(account: BillingAccount) -> None:
    """Records the notice of the account's new state (sent after the commit, or by the outbox's
    beat), once per change of state: the key names the change."""
    outbox_enqueue(
        task="portal.billing.tasks.billing_status_notify",
        kwargs={"account_id": str(account.id), "status": account.status},
        key=f"billing.status_notify:{account.id}:{account.status}:{account.status_changed_at:%Y%m%dT%H%M%S.%f}",
    )


def _apply_subscription(
    account: BillingAccount,
    subscription: dict[str, Any],
    event: dict[str, Any],
    created: datetime,
    config: BillingConfig,
) -> str:
    if account.state_event_created is not None and created < account.state_event_created:
        return "stale"
    subscription_id = str(subscription.get("id") or "")
    if (
        account.stripe_subscription_id
        and subscription_id != account.stripe_subscription_id
        and account.is_subscribed
        and _STATUS_FROM_STRIPE.get(str(subscription.get("status"))) == SubscriptionStatus.CANCELED
    ):
        # The end of an older subscription says nothing about the current one.
        return "ignored"
    stripe_status = (
        "canceled" if event["type"] == "customer.subscription.deleted" else str(subscription.get("status"))
    )
    new_status = _STATUS_FROM_STRIPE.get(stripe_status)
    if new_status is None:
        return "ignored"
    previous = account.status
    account.stripe_subscription_id = subscription_id
    account.stripe_status = stripe_status
    account.plan = _plan_of(subscription, config) or account.plan
    account.current_period_end = _period_end(subscription)
    account.state_event_created = created
    if new_status == SubscriptionStatus.ACTIVE and (
        account.usage_billed_from is None
        or previous in {SubscriptionStatus.CANCELED, SubscriptionStatus.NONE}
    ):
        # Bill usage from the first full hour of the subscription, never before it.
        start = subscription.get("start_date")
        started = datetime.fromtimestamp(int(start), tz=UTC) if isinstance(start, int) else created
        account.usage_billed_from = hour_ceil(started)
    if new_status != previous:
        account.status = new_status
        account.status_changed_at = timezone.now()
    account.save()
    if new_status != previous:
        audit_record(
            actor=None,
            organization=account.organization,
            action=f"billing.subscription.{new_status}",
            target=account,
            data={
                "from": previous,
                "to": new_status,
                "stripe_status": stripe_status,
                "plan": account.plan,
                "subscription": subscription_id,
                "event": event["id"],
            },
        )
        if new_status in {SubscriptionStatus.PAST_DUE, SubscriptionStatus.CANCELED}:
            _notify_admins(account)
    return "applied"


def webhook_event_process(*, event: dict[str, Any]) -> str:
    """Applies one verified Stripe event, exactly once per event id. Returns the outcome."""
    config = _require_config()
    event_type = str(event["type"])
    obj: dict[str, Any] = event["data"]["object"]
    created = datetime.fromtimestamp(int(event["created"]), tz=UTC)
    with transaction.atomic():
        try:
            with transaction.atomic():
                record = WebhookEvent.objects.create(
                    stripe_event_id=str(event["id"]), event_type=event_type, outcome="processing"
                )
        except IntegrityError:
            # Delivered before (or being applied by a concurrent delivery that holds the row).
            return "duplicate"
        outcome = "ignored"
        account = None
        customer = obj.get("customer")
        if event_type.startswith("customer.subscription.") or event_type == "checkout.session.completed":
            account = (
                BillingAccount.objects.select_for_update()
                .select_related("organization")
                .filter(stripe_customer_id=customer)
                .first()
                if isinstance(customer, str)
                else None
            )
            if account is None:
                outcome = "unknown-customer"
            elif event_type == "checkout.session.completed":
                if obj.get("mode") == "subscription" and obj.get("subscription"):
                    if not account.is_subscribed:
                        account.stripe_subscription_id = str(obj["subscription"])
                        account.save(update_fields=["stripe_subscription_id", "updated_at"])
                    audit_record(
                        actor=None,
                        organization=account.organization,
                        action="billing.checkout.completed",
                        target=account,
                        data={"subscription": str(obj["subscription"]), "event": event["id"]},
                    )
                    outcome = "applied"
            else:
                outcome = _apply_subscription(account, obj, event, created, config)
        record.outcome = outcome
        record.organization = account.organization if account is not None else None
        record.save(update_fields=["outcome", "organization"])
    return outcome


# --- Notices ------------------------------------------------------------------------------------------


def billing_status_notify(*, account_id: str, status: str) -> int:
    """Emails the organization's owners and admins that its subscription needs attention.

    Once per change of state: the notice claims the account's change first (a duplicated or
    re-sent task finds it claimed and sends nothing). Returns how many people were emailed."""
    account = BillingAccount.objects.select_related("organization").filter(id=account_id).first()
    if account is None or account.status != status:
        # The state moved on before the notice went out; the newer state sends its own.
        return 0
    previous_notice = account.status_notified_at
    claimed = (
        BillingAccount.objects.filter(id=account_id, status=status, status_notified_at=previous_notice)
        .filter(Q(status_notified_at__isnull=True) | Q(status_notified_at__lt=F("status_changed_at")))
        .update(status_notified_at=timezone.now())
    )
    if not claimed:
        return 0
    recipients = list(
        Membership.objects.filter(organization=account.organization, role__in=[Role.OWNER, Role.ADMIN])
        .values_list("user__email", flat=True)
        .order_by("user__email")
    )
    if not recipients:
        return 0
    name = account.organization.name
    if status == SubscriptionStatus.PAST_DUE:
        subject = f"Payment needed for {name} on Tailguard"
        body = (
            f"The last payment for {name} did not go through, so the subscription is past due.\n\n"
            "Running tuning jobs and endpoints keep running, but new tuning jobs cannot start until "
            f"the payment method is updated: {_site_url(reverse('billing:overview'))}"
        )
    else:
        subject = f"The Tailguard subscription of {name} has ended"
        body = (
            f"The subscription of {name} was cancelled. Usage is no longer reported for billing.\n\n"
            f"Subscribe again at any time: {_site_url(reverse('billing:overview'))}"
        )
    try:
        send_mail(subject=subject, message=body, from_email=None, recipient_list=recipients)
    except Exception:
        # Release the claim so the task's retry sends it.
        BillingAccount.objects.filter(id=account_id).update(status_notified_at=previous_notice)
        raise
    return len(recipients)
