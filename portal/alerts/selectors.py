"""Reads of alerts."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from portal.accounts.models import Organization
from portal.alerts.models import Alert, AlertAttempt, AlertChannel, AlertDelivery


def alert_channel_list(*, organization: Organization) -> QuerySet[AlertChannel]:
    return AlertChannel.objects.filter(organization=organization).order_by("name")


def alert_recent(*, organization: Organization, limit: int = 50) -> list[Alert]:
    """The newest alerts with their deliveries and each delivery's last attempts (the log)."""
    deliveries = AlertDelivery.objects.select_related("channel").prefetch_related(
        Prefetch("log", queryset=AlertAttempt.objects.order_by("-at"))
    )
    return list(
        Alert.objects.filter(organization=organization)
        .prefetch_related(Prefetch("deliveries", queryset=deliveries))
        .order_by("-created_at")[: max(1, min(limit, 200))]
    )
