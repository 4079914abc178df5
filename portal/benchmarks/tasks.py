"""Celery task of the benchmarks app: ids only in the message, the work in the service."""

from __future__ import annotations

from celery import shared_task

from portal.benchmarks import services


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def benchmark_report_run(self, report_id: str) -> str:  # type: ignore[no-untyped-def]
    return services.benchmark_report_run(report_id=report_id, owner=str(self.request.id))
