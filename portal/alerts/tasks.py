"""Celery tasks of alerts: thin, take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from portal.alerts import services, watch


@shared_task(acks_late=True)
def alert_delivery_send(delivery_id: str) -> str:
    return services.alert_delivery_send(delivery_id=delivery_id)


@shared_task(acks_late=True)
def alerts_scan() -> dict[str, int]:
    # Scheduled (CELERY_BEAT_SCHEDULE["alerts-scan"]).
    return watch.alerts_scan()
