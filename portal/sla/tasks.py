"""Celery tasks of SLA agreements: thin, call one service."""

from __future__ import annotations

from celery import shared_task

from portal.sla import services


@shared_task(acks_late=True)
def sla_periods_close() -> int:
    # Scheduled (CELERY_BEAT_SCHEDULE["sla-periods-close"]); idempotent.
    return services.sla_periods_close()


@shared_task(acks_late=True)
def sla_alerts_check() -> int:
    # Scheduled (CELERY_BEAT_SCHEDULE["sla-alerts-check"]); at most one alert per kind and hour.
    return services.sla_alerts_check()
