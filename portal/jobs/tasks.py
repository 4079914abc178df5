"""Celery tasks of the jobs app: one trial per task, ids only in messages."""

from __future__ import annotations

from celery import shared_task

from portal.jobs import services


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def tuning_job_step(self, job_id: str) -> str:  # type: ignore[no-untyped-def]
    # The lease owner names this delivery, for the record; see services.tuning_job_step.
    return services.tuning_job_step(job_id=job_id, owner=str(self.request.id))
