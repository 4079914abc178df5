"""Hardware pools (named sets of engine hosts of one kind) and the hosts whose agents serve them.

A pool is where trials run and endpoints serve: a region (a data-residency code), an
accelerator (a tuning hardware target, e.g. `local-cpu`), the devices each host brings and the
price per device-hour. Each engine host runs `tailguard agent --pool NAME`, a Celery worker on
the pool's queue; its heartbeats keep the `Host` row current.

Not a tenant table: a pool is either the platform's (shared with every organization,
`owned_by` empty) or one organization's own, so its owner column is deliberately not named
`organization` (row-level security would hide every shared pool from every tenant). The
selectors scope pools to an organization by construction.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from portal.pools.routing import host_queue, pool_queue


class Pool(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # A DNS-label-like name: it names the pool's Celery queue and appears in commands.
    name = models.CharField(max_length=63, unique=True)
    # Empty: the platform's shared pool; set: only this organization may use it.
    owned_by = models.ForeignKey(
        "accounts.Organization", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    region = models.CharField(
        max_length=32, help_text="Data-residency code of the hosts, e.g. us, eu, local."
    )
    accelerator = models.CharField(
        max_length=64, help_text="A tuning hardware target (tuning.search.job.HARDWARE), e.g. local-cpu."
    )
    devices_per_host = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    # Empty: not priced, like the operator's own machine: no trial or endpoint on the pool has a
    # cost, and selection ranks on latency alone. A set price is above 0 (the services and the
    # constraint refuse 0: "free" would rank every configuration as equally cheap).
    price_per_device_hour_usd = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        default=None,
        validators=[MaxValueValidator(Decimal("10000"))],
        help_text="USD per device-hour, above 0; leave empty for a pool that is not priced.",
    )
    # How clients reach an endpoint served by this pool: a URL with `{port}` (a host's public
    # address or a load balancer) or `{endpoint}` (an ingress per endpoint); TLS ends at the proxy.
    endpoint_url_template = models.CharField(max_length=300, default="http://127.0.0.1:{port}")
    # The address endpoint routers listen on, on the pool's hosts (0.0.0.0 behind a firewall/proxy).
    bind_address = models.CharField(max_length=64, default="127.0.0.1")
    # How the pool's endpoints run: the local supervisor on its hosts (started by their agents)
    # or Kubernetes (the k8s_* fields say where; applied by this deployment's workers).
    runner = models.CharField(
        max_length=16,
        choices=[("local", "Local supervisor on the pool's hosts"), ("kubernetes", "Kubernetes")],
        default="local",
    )
    k8s_namespace = models.CharField(max_length=63, blank=True)
    k8s_region = models.CharField(
        max_length=64, blank=True, help_text="Provider region as the catalog lists it."
    )
    k8s_kubeconfig = models.CharField(
        max_length=300, blank=True, help_text="Path on the workers; blank: in-cluster or $KUBECONFIG."
    )
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar = ["name"]
        constraints: ClassVar = [
            models.CheckConstraint(
                condition=models.Q(price_per_device_hour_usd__isnull=True)
                | models.Q(price_per_device_hour_usd__gt=0),
                name="pool_price_empty_or_positive",
                violation_error_message="A price must be above 0 USD per device-hour; leave it empty for a pool that is not priced.",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def price_per_host_hour_usd(self) -> float | None:
        """What one of the pool's hosts costs per hour (a trial's or an endpoint's price), or None
        when the pool is not priced."""
        price = self.price_per_device_hour_usd
        return None if price is None or price <= 0 else float(price) * self.devices_per_host

    @property
    def queue(self) -> str:
        """The Celery queue of the pool's measuring work (trials, endpoint starts)."""
        return pool_queue(self.name)

    @property
    def is_shared(self) -> bool:
        return self.owned_by_id is None


class Host(models.Model):
    """One engine host, as its agent reports it."""

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        QUARANTINED = "quarantined", "Quarantined"
        STOPPED = "stopped", "Agent stopped"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="hosts")
    name = models.CharField(max_length=200)  # the agent's --name (default: the host name)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE, db_index=True)
    # Why the host does not take work (its hardware contradicts the pool's accelerator, ...).
    quarantine_reason = models.TextField(blank=True)
    # `portal.pools.agent.host_facts()`: CPU model and ISA, GPUs, vLLM version, free memory.
    facts = models.JSONField(default=dict, blank=True)
    agent_pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # What the agent is running now ("tuning_job_step job 1f3a..."), empty when idle.
    current_task = models.CharField(max_length=300, blank=True)
    current_task_since = models.DateTimeField(null=True, blank=True)
    last_task = models.CharField(max_length=300, blank=True)
    tasks_done = models.IntegerField(default=0)

    class Meta:
        ordering: ClassVar = ["pool__name", "name"]
        constraints: ClassVar = [models.UniqueConstraint(fields=["pool", "name"], name="host_name_per_pool")]

    def __str__(self) -> str:
        return f"{self.name} ({self.pool.name})"

    @property
    def queue(self) -> str:
        """This host's own queue: operations on what runs here (an endpoint's config, stop, scrape)."""
        return host_queue(str(self.id))
