"""Celery tasks of the jobs app: one trial per task, ids only in messages."""

from __future__ import annotations

from celery import shared_task

from portal.jobs import services


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def tuning_job_step(self, job_id: str, pool: str | None = None) -> str:  # type: ignore[no-untyped-def]
    # The lease owner names this delivery, for the record; see services.tuning_job_step.
    # `pool` only routes the message to the pool's queue (portal.pools.routing).
    return services.tuning_job_step(job_id=job_id, owner=str(self.request.id))


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def tuning_trial_run(self, trial_id: str, pool: str | None = None) -> str:  # type: ignore[no-untyped-def]
    # One trial of a batch measured at once on a pool's hosts; `pool` routes it to the pool's queue.
    return services.tuning_trial_run(trial_id=int(trial_id), owner=str(self.request.id))
