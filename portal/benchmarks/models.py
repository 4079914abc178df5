"""Benchmark reports: a prospect's traffic replayed against their provider and a tuned endpoint.

A report belongs to the prospect's organization (the owner of the traffic sample), is built by
staff (sales engineers), and is shown to the customer through expiring, revocable share links.
Target API keys are stored sealed (AES-GCM, `compliance.storage.seal`) and never shown again.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models

from portal.leases import Leased


class BenchmarkReport(Leased):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Finished"
        FAILED = "failed", "Failed"

    class TrafficSource(models.TextChoices):
        # Where the sample's requests came from, for the report's attribution line.
        PROSPECT = "prospect", "The prospect's own traffic"
        AZURE2023_CONV = "azure2023_conv", "Public: Azure LLM inference trace 2023 (conversation)"
        MOONCAKE_SYNTHETIC = "mooncake_synthetic", "Public: Mooncake FAST'25 synthetic trace"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # The prospect's organization: the owner of the traffic sample.
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="benchmark_reports"
    )
    name = models.CharField(max_length=120)
    # Kept nullable: retention may delete the sample; the report keeps what it needs below.
    traffic_sample = models.ForeignKey(
        "traffic.TrafficSample", null=True, on_delete=models.SET_NULL, related_name="benchmark_reports"
    )
    sample_name = models.CharField(max_length=120)
    # The sample's profile headline numbers when the report was made (requests, duration, peak).
    sample_summary = models.JSONField(default=dict)
    traffic_source = models.CharField(
        max_length=32, choices=TrafficSource.choices, default=TrafficSource.PROSPECT
    )
    # The sample's busiest 60 s rate; each load level replays `peak_rps * multiplier`.
    peak_rps = models.FloatField()
    load_multipliers = models.JSONField()  # e.g. [0.5, 1.0, 1.25]
    duration_s = models.FloatField()  # per load level and target
    request_timeout_s = models.FloatField(default=60.0)
    max_prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    # {"conditions": {...}, "levels": [{"multiplier", "rate_rps", "cells": {target_id: cell}}]};
    # a cell is written as soon as its replay ends, so a resumed run skips it.
    results = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    # The run's worker holds the report (`Leased`: owner and heartbeat, kept fresh while it runs);
    # a run whose heartbeat is older than `lease_s` (a killed worker) is taken over.
    attempts = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        indexes: ClassVar = [models.Index(fields=["organization", "-created_at"])]

    def __str__(self) -> str:
        return self.name

    @property
    def is_pending(self) -> bool:
        return self.status in {self.Status.QUEUED, self.Status.RUNNING}

    @property
    def lease_s(self) -> float:
        """How long one replay may go without a heartbeat before another worker takes over."""
        return self.duration_s + self.request_timeout_s + 300.0


class BenchmarkTarget(models.Model):
    class Pricing(models.TextChoices):
        HOURLY = "hourly", "Dedicated endpoint ($/hour)"
        PER_TOKEN = "per_token", "Per-token provider ($/M input, $/M output tokens)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    report = models.ForeignKey(BenchmarkReport, on_delete=models.CASCADE, related_name="targets")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=80)
    base_url = models.CharField(max_length=500)
    model = models.CharField(max_length=200)
    # AES-GCM sealed with the storage key, bound to this target's id; empty when no key.
    api_key_sealed = models.BinaryField(blank=True, default=b"", editable=False)
    pricing = models.CharField(max_length=16, choices=Pricing.choices)
    price_per_hour_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    price_input_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    price_output_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # vLLM's `ignore_eos`: outputs as long as the trace says. Providers that refuse unknown
    # request fields (OpenAI does) must have it off.
    send_ignore_eos = models.BooleanField(default=False)

    class Meta:
        ordering: ClassVar = ["position"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["report", "position"], name="benchmark_target_position_unique")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_sealed)

    @property
    def price_label(self) -> str:
        if self.pricing == self.Pricing.HOURLY:
            return f"${self.price_per_hour_usd:,.2f}/hour"
        return (
            f"${self.price_input_per_mtok_usd:,.2f}/M input, ${self.price_output_per_mtok_usd:,.2f}/M output"
        )


class BenchmarkShareLink(models.Model):
    """A read-only link to one report for a customer: no login, an expiry, revocable."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    report = models.ForeignKey(BenchmarkReport, on_delete=models.CASCADE, related_name="share_links")
    # sha256 of the secret in the link; the secret itself is shown once, to its creator.
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    view_count = models.PositiveIntegerField(default=0)
    last_viewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]

    def __str__(self) -> str:
        return f"share link of {self.report_id} until {self.expires_at:%Y-%m-%d %H:%M}"
