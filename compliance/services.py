"""Writes of the compliance app. Callers run these inside their own `transaction.atomic()`."""

from __future__ import annotations

from typing import Any

from django.db import models

from compliance.models import AuditEvent


def audit_record(
    *,
    actor: Any,
    action: str,
    organization: Any = None,
    target: models.Model | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. `actor` is a user, or None for the system."""
    label = "system" if actor is None else str(getattr(actor, "email", actor))
    return AuditEvent.objects.create(
        organization=organization,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=label,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        data=data or {},
    )
