"""The SLA sections of the compliance evidence pack: the period's closed SLA reports (edge figure,
engine figure, credit) and the agreements in force, with both signatures and their dates."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from compliance import sla
from compliance.pack import evidence_pack
from portal.accounts.models import Organization, User
from portal.billing.selectors import invoice_credit_list
from portal.sla.models import SLAAgreement, SLAPeriod


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def sla_sections(*, organization: Organization, start: datetime, end: datetime) -> dict[str, bytes]:
    periods = [
        {
            "endpoint": str(p.endpoint_id),
            "window_start": p.window_start.isoformat(),
            "version": p.agreement.version,
            "credit_pct": p.credit_pct,
            "credit_cents": p.credit_cents,
            "result": p.result,
        }
        for p in SLAPeriod.objects.filter(
            organization=organization, window_start__gte=start, window_start__lt=end
        )
        .select_related("agreement")
        .order_by("window_start", "endpoint_id")
    ]
    agreements: list[dict[str, Any]] = [
        {
            "id": str(a.id),
            "endpoint": str(a.endpoint_id),
            "version": a.version,
            "status": a.status,
            "terms": a.terms(),
            "proposed_by_side": a.proposed_by_side,
            "provider_signed_by": a.provider_signed_by.email if a.provider_signed_by else None,
            "provider_signed_at": _iso(a.provider_signed_at),
            "customer_signed_by": a.customer_signed_by.email if a.customer_signed_by else None,
            "customer_signed_at": _iso(a.customer_signed_at),
            "in_force_from": _iso(a.in_force_from),
            "in_force_until": _iso(a.in_force_until),
        }
        for a in SLAAgreement.objects.filter(organization=organization)
        .exclude(in_force_until__lt=start)
        .select_related("provider_signed_by", "customer_signed_by")
        .order_by("endpoint_id", "version")
    ]
    credits = [
        {
            "key": c.key,
            "amount_cents": c.amount_cents,
            "currency": c.currency,
            "status": c.status,
            "stripe_invoice_item_id": c.stripe_invoice_item_id,
            "period_start": c.period_start.isoformat(),
        }
        for c in invoice_credit_list(organization=organization).filter(
            period_start__gte=start, period_start__lt=end
        )
    ]
    dump = lambda value: json.dumps(value, indent=1, sort_keys=True).encode()  # noqa: E731
    return {
        "sla/agreements.json": dump({"agreements": agreements}),
        "sla/periods.json": dump({"periods": periods}),
        "sla/credits.json": dump({"credits": credits}),
    }


def evidence_pack_build(*, actor: User, organization: Organization, month: datetime) -> tuple[str, bytes]:
    start, end = sla.month_window(month)
    return evidence_pack(
        actor=actor,
        organization=organization,
        period_start=start,
        period_end=end,
        sections=sla_sections(organization=organization, start=start, end=end),
    )
