"""Dedicated endpoints: a tuned configuration serving at a stable address, and its history."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models


class Endpoint(models.Model):
    class Status(models.TextChoices):
        STARTING = "starting", "Starting"
        HEALTHY = "healthy", "Healthy"
        RESTARTING = "restarting", "Restarting"
        DEGRADED = "degraded", "Degraded"
        FAILED = "failed", "Failed to start"
        STOPPED = "stopped", "Stopped"

    ACTIVE: ClassVar[set[str]] = {Status.STARTING, Status.HEALTHY, Status.RESTARTING, Status.DEGRADED}

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="endpoints"
    )
    name = models.CharField(max_length=120)
    served_model = models.ForeignKey("jobs.ServedModel", on_delete=models.PROTECT, related_name="endpoints")
    job = models.ForeignKey(
        "jobs.TuningJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="endpoints"
    )
    config = models.JSONField()  # the EngineConfig mapping now serving (no key in it)
    port = models.IntegerField(unique=True)  # the stable address's port on the serving host
    api_key_prefix = models.CharField(max_length=16)
    api_key_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STARTING, db_index=True)
    status_detail = models.TextField(blank=True)  # the runner's last error, if any
    supervisor_pid = models.IntegerField(null=True, blank=True)
    # The engine's last /metrics text: the next scrape's interval is computed against it.
    last_metrics_text = models.TextField(blank=True)
    last_metrics_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class EndpointRevision(models.Model):
    """One step of the optimization history: what was deployed, why, and what it measured."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="revisions")
    generation = models.IntegerField()
    config = models.JSONField()
    reason = models.TextField()
    job = models.ForeignKey(
        "jobs.TuningJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    trial_number = models.IntegerField(null=True, blank=True)
    # What the tuning job measured for this configuration at the target load.
    measured_ttft_p50_ms = models.FloatField(null=True, blank=True)
    measured_ttft_p95_ms = models.FloatField(null=True, blank=True)
    measured_tokens_per_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["generation"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["endpoint", "generation"], name="revision_generation_unique")
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} generation {self.generation}"


class MetricSnapshot(models.Model):
    """One scrape of the endpoint's engine. A failed scrape is stored as a gap, never as zeros."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="snapshots")
    taken_at = models.DateTimeField(db_index=True)
    gap = models.BooleanField(default=False)
    gap_reason = models.CharField(max_length=300, blank=True)
    # Over the interval since the previous snapshot (null when unknown).
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    requests_per_s = models.FloatField(null=True, blank=True)
    prompt_tokens_per_s = models.FloatField(null=True, blank=True)
    generation_tokens_per_s = models.FloatField(null=True, blank=True)
    prefix_cache_hit_rate = models.FloatField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-taken_at"]
        indexes: ClassVar = [models.Index(fields=["endpoint", "-taken_at"])]

    def __str__(self) -> str:
        return f"{self.endpoint_id} at {self.taken_at:%Y-%m-%d %H:%M:%S}"
