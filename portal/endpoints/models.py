"""Dedicated endpoints: a tuned configuration serving at a stable address, and its history."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone


class Endpoint(models.Model):
    class Status(models.TextChoices):
        STARTING = "starting", "Starting"
        HEALTHY = "healthy", "Healthy"
        RESTARTING = "restarting", "Restarting"
        DEGRADED = "degraded", "Degraded"
        FAILED = "failed", "Failed to start"
        STOPPING = "stopping", "Stopping"
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
    # The hardware pool it serves on, and the host of that pool whose agent started it (its
    # operations go to that host's queue). Both empty: served by this deployment's own workers.
    pool = models.ForeignKey(
        "pools.Pool", null=True, blank=True, on_delete=models.PROTECT, related_name="endpoints"
    )
    host = models.ForeignKey(
        "pools.Host", null=True, blank=True, on_delete=models.SET_NULL, related_name="endpoints"
    )
    config = models.JSONField()  # the EngineConfig mapping now serving (no key in it)
    # The tuned fused-MoE tables it serves with (vLLM file name -> table JSON; issue 25), from
    # the job whose winner it serves; empty: vLLM's own tables. The note says why a job's tables
    # were not shipped (another device, say), or is empty.
    moe_tables = models.JSONField(default=dict, blank=True)
    moe_tables_note = models.TextField(blank=True)
    # The stable address's port on the host that serves it, as that host's agent picked it when
    # it started the endpoint (only the host knows which of its ports are free; two hosts may
    # well use the same number). Empty until the host reports it (and for Kubernetes endpoints,
    # which are reached through their Service).
    port = models.IntegerField(null=True, blank=True)
    api_key_prefix = models.CharField(max_length=16)
    api_key_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STARTING, db_index=True)
    status_detail = models.TextField(blank=True)  # the runner's last error, if any
    # How the endpoint runs: the runner's kind ("local" supervisor on a host, "kubernetes"), its
    # handle (`serving.runner.base.RunnerHandle.to_dict()`: where it runs, how to find it) and its
    # last reported state. The portal keeps nothing else about the process.
    runner_kind = models.CharField(max_length=16, default="local")
    runner_handle = models.JSONField(null=True, blank=True)
    runner_state = models.JSONField(null=True, blank=True)
    # Where clients reach it: from the pool's configured public address (no /v1).
    base_url = models.CharField(max_length=300, blank=True)
    # The key, sealed with the deployment's storage key, for the host that starts the engine;
    # dropped when the endpoint stops. Clients' keys are checked against `api_key_hash`.
    api_key_sealed = models.BinaryField(null=True, blank=True, editable=False)
    # The engine's last /metrics text: the next scrape's interval is computed against it.
    last_metrics_text = models.TextField(blank=True)
    last_metrics_at = models.DateTimeField(null=True, blank=True)
    # The continual loop's policy (see portal/endpoints/loop.py).
    auto_retune = models.BooleanField(default=True)
    retune_cooldown_s = models.IntegerField(default=3600)  # after an iteration ends
    retune_max_per_day = models.IntegerField(default=4)
    retune_budget_trials = models.IntegerField(default=4)  # live trials per re-tuning job
    detect_window_s = models.IntegerField(default=120)  # live traffic compared per check
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The one-time token of the deploy form that created it: the same form sent twice (a double
    # click, a refresh, a retry) finds this endpoint instead of creating a second one.
    deploy_token = models.CharField(max_length=64, null=True, blank=True, unique=True, editable=False)

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
    # The MoE tables this generation runs (their digest; empty: vLLM's own) and why a job's
    # tables were not shipped, if they were not.
    moe_tables_digest = models.CharField(max_length=12, blank=True)
    moe_tables_note = models.TextField(blank=True)
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
    # The interval's request count, length histograms and prefix lookups
    # (`tuning.continual.LiveWindow.to_dict()`): what drift detection compares.
    window = models.JSONField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-taken_at"]
        indexes: ClassVar = [models.Index(fields=["endpoint", "-taken_at"])]

    def __str__(self) -> str:
        return f"{self.endpoint_id} at {self.taken_at:%Y-%m-%d %H:%M:%S}"


class LoopIteration(models.Model):
    """One turn of the continual loop: detect -> re-tune -> canary -> promote (-> roll back)."""

    class Status(models.TextChoices):
        DETECTED = "detected", "Drift detected"
        TUNING = "tuning", "Re-tuning"
        PROMOTED = "promoted", "Promoted, watching"
        CONFIRMED = "confirmed", "Promoted and kept"
        KEPT = "kept", "Running configuration kept"
        ROLLED_BACK = "rolled_back", "Rolled back"
        FAILED = "failed", "Failed"

    ACTIVE: ClassVar[set[str]] = {Status.DETECTED, Status.TUNING, Status.PROMOTED}

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="iterations")
    number = models.IntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DETECTED, db_index=True)
    trigger = models.TextField()  # what was detected, in words
    drift = models.JSONField(null=True, blank=True)  # the drift report and the SLO-erosion check
    live_windows = models.JSONField(null=True, blank=True)  # the windows the re-tuning traffic came from
    traffic_sample = models.ForeignKey(
        "traffic.TrafficSample", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        "jobs.TuningJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    verdict = models.TextField(blank=True)  # the canary's reason, promotion or not
    candidate_ttft_p50_ms = models.FloatField(null=True, blank=True)  # measured in the job
    incumbent_ttft_p50_ms = models.FloatField(null=True, blank=True)
    before_p95_ms = models.FloatField(null=True, blank=True)  # live, before the promotion
    after_p95_ms = models.FloatField(null=True, blank=True)  # live, after it
    revision = models.ForeignKey(
        EndpointRevision, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error = models.TextField(blank=True)
    detected_at = models.DateTimeField(auto_now_add=True)
    promoted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-number"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["endpoint", "number"], name="loop_iteration_number_unique"),
            # At most one iteration in flight per endpoint: a second detection is a no-op.
            models.UniqueConstraint(
                fields=["endpoint"],
                condition=models.Q(status__in=["detected", "tuning", "promoted"]),
                name="loop_iteration_one_active",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} iteration {self.number}"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class SLATerms(models.Model):
    """An organization's own monitoring target for an endpoint: a TTFT percentile under a target
    over each window and the source of the measurements. The contract (credits included) is the
    two-party agreement in portal.sla; `credit_tiers` holds only tiers stored before it existed,
    which customers cannot change (portal.sla.services.sla_terms_set).

    Product state of an endpoint, so it lives with the endpoints (issue 22: compliance keeps the
    rules and the arithmetic, `compliance.sla`); the table keeps its first name."""

    class Metric(models.TextChoices):
        TTFT_P50 = "ttft_p50_ms", "TTFT p50"
        TTFT_P95 = "ttft_p95_ms", "TTFT p95"

    class Window(models.TextChoices):
        MONTHLY = "monthly", "Calendar month (UTC)"

    class Source(models.TextChoices):
        ENGINE = "engine", "Engine-observed"
        # Needs a router in front that records TTFT per request (not recorded yet: all gaps).
        CLIENT = "client", "Client-observed (router)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.OneToOneField(Endpoint, on_delete=models.CASCADE, related_name="sla_terms")
    metric = models.CharField(max_length=16, choices=Metric.choices, default=Metric.TTFT_P50)
    target_ms = models.FloatField()
    window = models.CharField(max_length=16, choices=Window.choices, default=Window.MONTHLY)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.ENGINE)
    # [{"below_pct": 99.0, "credit_pct": 10.0}, ...]: the largest credit whose threshold applies.
    credit_tiers = models.JSONField(default=list)
    # Below this share of measured time, gaps count as breached time for the credit.
    min_coverage_pct = models.FloatField(default=90.0)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "compliance_slaterms"

    def __str__(self) -> str:
        return f"{self.endpoint_id}: {self.metric} <= {self.target_ms} ms"


class SLAWindowReport(models.Model):
    """A closed window's result, frozen when the window ends (metric snapshots expire later)."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    terms = models.ForeignKey(SLATerms, on_delete=models.CASCADE, related_name="reports")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    # The terms it was judged against and `compliance.sla.WindowReport` as JSON.
    result = models.JSONField()
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "compliance_slawindowreport"
        ordering: ClassVar = ["-window_start"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["terms", "window_start"], name="sla_report_window_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.terms_id} {self.window_start:%Y-%m}"
