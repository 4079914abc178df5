"""Celery task of the outbox: the one beat that recovers background work and sends what the
broker never took."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from portal.outbox import services


@shared_task
def redispatch() -> dict[str, Any]:
    # Scheduled (CELERY_BEAT_SCHEDULE["redispatch"]); safe to run twice at once.
    return services.redispatch()
