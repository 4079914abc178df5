from __future__ import annotations

from celery import shared_task

from portal.endpoints import services


@shared_task(acks_late=True)
def endpoint_start(endpoint_id: str) -> str:
    return services.endpoint_start(endpoint_id=endpoint_id)


@shared_task
def endpoints_watch() -> int:
    return services.endpoints_watch()
