"""Reads of the compliance app."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from compliance.models import AuditEvent


def audit_event_list(*, organization: Any) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(organization=organization).select_related("actor")
