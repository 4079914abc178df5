"""Reads of billing. Everything is filtered by organization here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet, Sum

from portal.accounts.models import Organization
from portal.billing.config import BILLING_OFF_NOTICE, HOW_TO_ENABLE
from portal.billing.models import BillingAccount, InvoiceCredit, Meter, UsageRecord, UsageReport
from portal.billing.usage import billable_minutes, month_start, next_month


@dataclass(frozen=True)
class UsageLine:
    """One meter (and hardware type) over one month, in the units Stripe is sent."""

    meter: str
    meter_label: str
    dimension: str
    # Exact recorded usage.
    duration_ms: int
    # Minutes that are or will be billed: rounded per hourly bucket, from the subscription on.
    billable_minutes: int
    # Minutes already accepted by Stripe.
    reported_minutes: int
    # Minutes of usage before the subscription started, which are never billed.
    unbilled_minutes: int

    @property
    def pending_minutes(self) -> int:
        return max(self.billable_minutes - self.reported_minutes, 0)

    @property
    def display(self) -> str:
        if self.meter == Meter.ENDPOINT_HOURS:
            return f"{self.billable_minutes / 60:.2f} endpoint-hours"
        return f"{self.billable_minutes} trial-minutes"


def billing_account_get(*, organization: Organization) -> BillingAccount | None:
    return BillingAccount.objects.filter(organization=organization).first()


def usage_month(*, organization: Organization, month: datetime) -> list[UsageLine]:
    """What the month (UTC) holds per meter and hardware type, and how much of it is billed."""
    start = month_start(month)
    end = next_month(start)
    account = billing_account_get(organization=organization)
    billed_from = account.usage_billed_from if account is not None else None
    buckets = (
        UsageRecord.objects.filter(organization=organization, hour__gte=start, hour__lt=end)
        .values("meter", "dimension", "hour")
        .annotate(ms=Sum("duration_ms"))
        .order_by("meter", "dimension", "hour")
    )
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for bucket in buckets:
        line = totals.setdefault(
            (bucket["meter"], bucket["dimension"]), {"ms": 0, "billable": 0, "reported": 0, "unbilled": 0}
        )
        minutes = billable_minutes(bucket["ms"])
        line["ms"] += bucket["ms"]
        if billed_from is not None and bucket["hour"] >= billed_from:
            line["billable"] += minutes
        else:
            line["unbilled"] += minutes
    reported = (
        UsageReport.objects.filter(
            organization=organization, hour__gte=start, hour__lt=end, status=UsageReport.Status.SENT
        )
        .values("meter", "dimension")
        .annotate(q=Sum("quantity"))
    )
    for row in reported:
        line = totals.setdefault(
            (row["meter"], row["dimension"]), {"ms": 0, "billable": 0, "reported": 0, "unbilled": 0}
        )
        line["reported"] += row["q"] or 0
    labels = dict(Meter.choices)
    return [
        UsageLine(
            meter=meter,
            meter_label=str(labels.get(meter, meter)),
            dimension=dimension,
            duration_ms=values["ms"],
            billable_minutes=values["billable"],
            reported_minutes=values["reported"],
            unbilled_minutes=values["unbilled"],
        )
        for (meter, dimension), values in sorted(totals.items())
    ]


def usage_report_list(*, organization: Organization) -> QuerySet[UsageReport]:
    return UsageReport.objects.filter(organization=organization).order_by(
        "-hour", "meter", "dimension", "sequence"
    )


def usage_report_get(*, organization: Organization, report_id: uuid.UUID | str) -> UsageReport | None:
    return UsageReport.objects.filter(organization=organization, id=report_id).first()


def billing_operator(*, user: Any) -> bool:
    """Whoever runs the installation (superusers, staff): they may see its configuration."""
    return bool(getattr(user, "is_superuser", False) or getattr(user, "is_staff", False))


def billing_off_notice(*, user: Any) -> str:
    """Why billing is off, as `user` should read it: the settings to set for an operator, a plain
    sentence for a customer (who can neither see nor change the server's environment)."""
    return HOW_TO_ENABLE if billing_operator(user=user) else BILLING_OFF_NOTICE


def invoice_credit_list(*, organization: Organization) -> QuerySet[InvoiceCredit]:
    """The organization's credits, newest period first (SLA service credits and any others)."""
    return InvoiceCredit.objects.filter(organization=organization).order_by("-period_start", "key")
