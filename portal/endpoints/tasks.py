"""Celery tasks of the endpoints app: ids only in messages; `pool`/`host` only route them
(portal.pools.routing) to where the endpoint runs."""

from __future__ import annotations

from celery import shared_task

from portal.endpoints import services


@shared_task(acks_late=True)
def endpoint_start(endpoint_id: str, pool: str | None = None, host: str | None = None) -> str:
    return services.endpoint_start(endpoint_id=endpoint_id)


@shared_task(acks_late=True)
def endpoint_stop(endpoint_id: str, pool: str | None = None, host: str | None = None) -> str:
    return services.endpoint_stop_run(endpoint_id=endpoint_id)


@shared_task
def endpoint_apply(endpoint_id: str, pool: str | None = None, host: str | None = None) -> bool:
    return services.endpoint_config_sync(endpoint_id=endpoint_id)


@shared_task
def endpoint_watch(endpoint_id: str, pool: str | None = None, host: str | None = None) -> None:
    services.endpoint_watch_one(endpoint_id=endpoint_id)


@shared_task
def endpoints_watch() -> int:
    return services.endpoints_watch()
