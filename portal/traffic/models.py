"""Traffic samples: an uploaded log of real requests and the profile learned from it.

No prompt text is stored here, ever: the profile and chart data are numbers, and the uploaded
file itself is deleted once it has been read.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models

from portal.leases import Leased


class TrafficSample(Leased):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        VALIDATING = "validating", "Validating"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    class Format(models.TextChoices):
        AUTO = "auto", "Detect automatically"
        OPENAI = "openai", "OpenAI-style request log (JSONL)"
        MOONCAKE = "mooncake", "Mooncake trace (JSONL)"
        AZURE = "azure", "Azure LLM inference trace (CSV)"
        BURSTGPT = "burstgpt", "BurstGPT (CSV)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="traffic_samples"
    )
    name = models.CharField(max_length=120)
    requested_format = models.CharField(max_length=16, choices=Format.choices, default=Format.AUTO)
    detected_format = models.CharField(max_length=16, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    size_bytes = models.BigIntegerField(default=0)
    # Bytes read so far while validating (the page shows progress from it).
    progress_bytes = models.BigIntegerField(default=0)
    # The reason a sample failed: a line number and a problem, never file content.
    error = models.TextField(blank=True)
    # The DESIGN.md profile contract plus the library's extras (`WorkloadProfile.to_json_dict`).
    profile = models.JSONField(null=True, blank=True)
    # Small chart series (`ChartData.to_json_dict`), bounded in size whatever the trace length.
    charts = models.JSONField(null=True, blank=True)
    # Where the upload waits to be read, relative to the staging folder; cleared once read.
    staging_name = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # How many ingests have claimed the sample (each under the lease of `Leased`: a sample still
    # validating under a stale lease lost its worker and is recovered by the redispatch).
    ingest_attempts = models.PositiveSmallIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        indexes: ClassVar = [models.Index(fields=["organization", "-created_at"])]

    def __str__(self) -> str:
        return self.name

    @property
    def is_pending(self) -> bool:
        return self.status in {self.Status.QUEUED, self.Status.VALIDATING}

    @property
    def progress_percent(self) -> int:
        if not self.size_bytes:
            return 0
        return min(100, int(100 * self.progress_bytes / self.size_bytes))
