"""Celery tasks of SLA agreements: thin, call one service."""

from __future__ import annotations

from celery import shared_task

from portal.sla import services


@shared_task(acks_late=True)
def sla_periods_close() -> dict[str, int]:
    # Scheduled (CELERY_BEAT_SCHEDULE["sla-periods-close"]); idempotent. Closes months first, then
    # purges the edge records of months long closed.
    return {"closed": services.sla_periods_close(), "purged": services.edge_records_purge()}


@shared_task(acks_late=True)
def edge_intervals_settle() -> int:
    # Scheduled (CELERY_BEAT_SCHEDULE["sla-edge-settle"]): summaries of settled intervals.
    return services.edge_intervals_settle()


@shared_task(acks_late=True)
def sla_alerts_check() -> int:
    # Scheduled (CELERY_BEAT_SCHEDULE["sla-alerts-check"]); at most one alert per kind and hour.
    return services.sla_alerts_check()


@shared_task
def sla_windows_close() -> int:
    # Scheduled (CELERY_BEAT_SCHEDULE["compliance-sla-close"]); idempotent: freezes the months of
    # each endpoint's own monitoring targets once they have ended.
    return services.sla_windows_close()
