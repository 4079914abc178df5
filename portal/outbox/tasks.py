"""Celery task of the outbox: the beat that sends what the broker never took."""

from __future__ import annotations

from celery import shared_task

from portal.outbox import services


@shared_task
def outbox_redispatch() -> dict[str, int]:
    # Scheduled (CELERY_BEAT_SCHEDULE["outbox-redispatch"]); safe to run twice at once.
    return services.outbox_redispatch()
