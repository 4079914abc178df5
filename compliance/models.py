"""Compliance records. The audit trail is append-only: services write it, nothing updates it."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """One thing a person (or a token, or the system) did, recorded in the same transaction."""

    # Null for events about the platform itself (e.g. a signup before any organization exists).
    organization = models.ForeignKey(
        "accounts.Organization", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Who acted, kept as text too so the record survives the actor's deletion.
    actor_label = models.CharField(max_length=254, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    # Structured details; never prompt text or secrets.
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering: ClassVar = ["-created_at", "-id"]
        indexes: ClassVar = [models.Index(fields=["organization", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action}"
