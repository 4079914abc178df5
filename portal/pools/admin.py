"""The admin console's pages for pools and engine hosts: health, facts, what runs where.

Pools are written through the services (the same checks and audit as the API); hosts are what
their agents report, read-only here.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils.html import format_html_join

from portal.pools import selectors, services
from portal.pools.models import Host, Pool


class PoolAdminForm(forms.ModelForm):
    class Meta:
        model = Pool
        fields = (
            "name",
            "owned_by",
            "region",
            "accelerator",
            "devices_per_host",
            "price_per_device_hour_usd",
            "endpoint_url_template",
            "bind_address",
            "runner",
            "k8s_namespace",
            "k8s_region",
            "k8s_kubeconfig",
            "enabled",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            services._clean({k: data[k] for k in services._EDITABLE if k in data})
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return data


class HostInline(admin.TabularInline):
    model = Host
    extra = 0
    can_delete = False
    fields = ("name", "health", "quarantine_reason", "current_task", "last_heartbeat_at")
    readonly_fields = fields

    @admin.display(description="Health")
    def health(self, host: Host) -> str:
        return selectors.host_health(host)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    form = PoolAdminForm
    list_display = (
        "name",
        "owner",
        "region",
        "accelerator",
        "devices_per_host",
        "price",
        "live_hosts",
        "queue",
        "enabled",
    )
    list_filter = ("enabled", "region", "accelerator")
    inlines = (HostInline,)

    @admin.display(description="Price per device-hour")
    def price(self, pool: Pool) -> str:
        # Like the catalog and the job pages: an empty price is "not priced", never "$0".
        price = pool.price_per_device_hour_usd
        return "not priced" if price is None else f"{price.normalize():f} USD"

    @admin.display(description="Owner")
    def owner(self, pool: Pool) -> str:
        return str(pool.owned_by) if pool.owned_by_id else "platform (shared)"

    @admin.display(description="Celery queue (routing)")
    def queue(self, pool: Pool) -> str:
        return pool.queue

    @admin.display(description="Live hosts")
    def live_hosts(self, pool: Pool) -> int:
        return selectors.hosts_live(pool=pool).count()

    def get_readonly_fields(self, request: HttpRequest, obj: Pool | None = None) -> tuple[str, ...]:
        # The name is the queue's name: agents listen on it, so it is fixed once created.
        return ("name", "owned_by") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Pool, form: forms.ModelForm, change: bool) -> None:
        data = form.cleaned_data
        if change:
            saved = services.pool_update(
                actor=request.user,  # type: ignore[arg-type]
                pool=Pool.objects.get(pk=obj.pk),
                **{k: data[k] for k in services._EDITABLE if k in data},
            )
        else:
            saved = services.pool_create(
                actor=request.user,  # type: ignore[arg-type]
                name=data["name"],
                owned_by=data.get("owned_by"),
                **{k: data[k] for k in services._EDITABLE if k in data and k != "enabled"},
            )
        obj.pk = saved.pk
        obj._state.adding = False


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "pool",
        "health",
        "quarantine_reason",
        "hardware",
        "current_task",
        "endpoints_here",
        "queues",
        "last_heartbeat_at",
    )
    list_filter = ("pool", "state")
    readonly_fields = (
        "pool",
        "name",
        "state",
        "health",
        "quarantine_reason",
        "hardware",
        "facts",
        "agent_pid",
        "started_at",
        "last_heartbeat_at",
        "current_task",
        "current_task_since",
        "last_task",
        "tasks_done",
        "endpoints_here",
        "queues",
    )
    exclude = ()

    @admin.display(description="Health")
    def health(self, host: Host) -> str:
        return selectors.host_health(host)

    @admin.display(description="Hardware")
    def hardware(self, host: Host) -> str:
        facts = host.facts or {}
        gpus = facts.get("gpus") or []
        gpu = f"{len(gpus)} x {gpus[0].get('name')}" if gpus else "no GPU"
        return (
            f"{facts.get('cpu_model', '?')} ({facts.get('num_cpus', '?')} CPUs; {', '.join(facts.get('isa') or []) or 'no listed ISA'}); "
            f"{gpu}; vLLM {facts.get('vllm_version') or 'not installed'}; "
            f"{facts.get('memory_available_mib', '?')} MiB free"
        )

    @admin.display(description="Consumes (Celery queues)")
    def queues(self, host: Host) -> str:
        return f"{host.pool.queue}, {host.queue}"

    @admin.display(description="Endpoints on this host")
    def endpoints_here(self, host: Host) -> str:
        rows = host.endpoints.filter(status__in=["starting", "healthy", "restarting", "degraded"])
        return format_html_join(", ", "{} ({})", ((e.name, e.status) for e in rows)) or "none"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # hosts join by starting an agent

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
