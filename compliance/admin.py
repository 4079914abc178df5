"""Platform admins see every tenant's compliance records here, read-only; every page they open
is itself audited (compliance.middleware). Records change only through the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from compliance.models import AuditEvent, BAARecord, ResidencyPolicy, RetentionPolicy, StoredObject


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(_ReadOnly):
    list_display = ("created_at", "chain", "seq", "actor_label", "action", "target_type", "request_id")
    list_filter = ("action",)
    search_fields = ("actor_label", "action", "target_id", "request_id", "chain")
    ordering = ("-created_at", "-id")


@admin.register(BAARecord)
class BAARecordAdmin(_ReadOnly):
    list_display = ("organization", "counterparty", "version", "effective_on", "ends_on", "recorded_at")


@admin.register(ResidencyPolicy)
class ResidencyPolicyAdmin(_ReadOnly):
    list_display = ("organization", "allowed_regions", "updated_at")


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(_ReadOnly):
    list_display = ("organization", "sample_retention_days", "retain_prompt_text", "updated_at")


@admin.register(StoredObject)
class StoredObjectAdmin(_ReadOnly):
    list_display = ("organization", "kind", "region", "size_bytes", "contains_phi", "created_at")
    list_filter = ("kind", "region", "contains_phi")
