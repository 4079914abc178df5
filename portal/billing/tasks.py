"""Celery tasks of billing: thin, take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from portal.billing import services


@shared_task(acks_late=True)
def usage_report() -> dict[str, int]:
    # Scheduled (CELERY_BEAT_SCHEDULE["billing-usage-report"]); safe to run twice at once.
    return services.usage_report_run()


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def billing_status_notify(account_id: str, status: str) -> int:
    return services.billing_status_notify(account_id=account_id, status=status)


@shared_task(acks_late=True)
def invoice_credit_send(credit_id: str) -> str:
    return services.invoice_credit_send(credit_id=credit_id)
