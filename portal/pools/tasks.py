"""Celery tasks of the pools app: ids (and the command line's work dir) only in messages."""

from __future__ import annotations

from celery import shared_task

from portal.pools import trials


@shared_task(acks_late=True, reject_on_worker_lost=True)
def cli_trial_run(work_dir: str, number: int, pool: str | None = None) -> str:
    # `pool` only routes the message to the pool's queue (portal.pools.routing).
    return trials.cli_trial_run(work_dir=work_dir, number=number)
