"""Celery tasks of the traffic app. Arguments are ids only: no file content travels the broker."""

from __future__ import annotations

from celery import shared_task

from portal.traffic import services


@shared_task(acks_late=True)
def traffic_sample_ingest(sample_id: str) -> str:
    return services.traffic_sample_ingest(sample_id=sample_id)


@shared_task
def workloads_sweep() -> int:
    return len(services.workloads_sweep())
