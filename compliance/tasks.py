"""Scheduled compliance work (thin: each task calls one service)."""

from __future__ import annotations

from celery import shared_task

from compliance import services


@shared_task
def retention_enforce() -> dict[str, int]:
    return services.retention_enforce()
