"""Celery tasks of the traffic app. Arguments are ids only: no file content travels the broker."""

from __future__ import annotations

from celery import Task, shared_task
from django.conf import settings

from portal.traffic import services


# The ingest stops itself at TRAFFIC_INGEST_MAX_S; the hard limit is the backstop for a read
# stuck outside its checks (the worker process is replaced and `jobs_redispatch` recovers it).
@shared_task(
    bind=True, acks_late=True, time_limit=settings.TRAFFIC_INGEST_MAX_S + settings.TRAFFIC_INGEST_GRACE_S
)
def traffic_sample_ingest(self: Task, sample_id: str) -> str:
    return services.traffic_sample_ingest(sample_id=sample_id, owner=str(self.request.id))


@shared_task
def workloads_sweep() -> int:
    # Hourly: workload files no sample owns, and decrypted uploads no ingest is reading.
    return len(services.workloads_sweep()) + len(services.staging_sweep())
