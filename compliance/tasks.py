"""Scheduled compliance work (thin: each task calls one service)."""

from __future__ import annotations

import logging

from celery import shared_task

from compliance import services

logger = logging.getLogger(__name__)


@shared_task
def retention_enforce() -> dict[str, int]:
    return services.retention_enforce()


@shared_task
def audit_verify() -> int:
    """Re-checks every chain; a broken one is logged as an error (alerting picks it up)."""
    broken = services.audit_verify()
    for link in broken:
        logger.error("audit trail broken: %s", link)
    return len(broken)


@shared_task
def audit_anchor() -> dict[str, int]:
    """Writes every chain's moved head to the object store (compliance.anchor)."""
    from compliance.anchor import audit_anchor_write

    return audit_anchor_write()
