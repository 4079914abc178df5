"""Celery tasks of the accounts app: thin, take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from portal.accounts import services


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def invitation_send(invitation_id: str) -> bool:
    return services.invitation_send_email(invitation_id=invitation_id)


@shared_task
def invitations_expire() -> int:
    return services.invitations_expire()
