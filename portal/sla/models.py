"""SLA agreements per endpoint, signed by both parties, and the edge measurements they are judged on.

An agreement is versioned: the provider (a platform admin) proposes terms derived from the
tuning job's SLO and peak rate; the customer's owner or admin signs (or proposes changes to the
targets, which the provider then signs). A version is in force once both sides have signed, and
stays in force until the next signed version supersedes it. Credit tiers and the fee they apply
to are the provider's terms: a customer's proposal carries them over unchanged.

The arithmetic lives in `compliance.edge` and `compliance.sla` (pure functions); this app holds
the product state: the terms, the request records, the closed periods.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models

from compliance import edge


class SLAAgreement(models.Model):
    class Status(models.TextChoices):
        PROPOSED = "proposed", "Proposed, awaiting the other party"
        IN_FORCE = "in_force", "In force"
        SUPERSEDED = "superseded", "Superseded"
        DECLINED = "declined", "Declined"
        WITHDRAWN = "withdrawn", "Withdrawn (a newer proposal replaced it)"

    class Side(models.TextChoices):
        PROVIDER = "provider", "Provider"
        CUSTOMER = "customer", "Customer"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", on_delete=models.CASCADE, related_name="sla_agreements"
    )
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED)
    # Targets: at least one of the two TTFT percentiles (ms, at the edge) and availability (%).
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    availability_pct = models.FloatField(null=True, blank=True)
    # "Up to the contracted peak rate": arrivals above it in a UTC minute are not judged.
    peak_rps = models.FloatField()
    # Each interval of this length is judged compliant or breached on its own requests.
    interval_s = models.PositiveIntegerField(default=300)
    # [{"below_pct": 99.5, "credit_pct": 10.0}, ...]: the largest credit whose threshold applies.
    credit_tiers = models.JSONField(default=list)
    min_coverage_pct = models.FloatField(default=90.0)
    # The monthly fee the credit percentages apply to, in the currency's smallest unit.
    monthly_fee_cents = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, default="usd")
    # The tuning job whose SLO and peak rate the provider's terms were derived from ("" if none).
    derived_from_job = models.CharField(max_length=64, blank=True)
    proposed_by_side = models.CharField(max_length=8, choices=Side.choices)
    provider_signed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    provider_signed_at = models.DateTimeField(null=True, blank=True)
    customer_signed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    customer_signed_at = models.DateTimeField(null=True, blank=True)
    in_force_from = models.DateTimeField(null=True, blank=True)
    in_force_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["-version"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["endpoint", "version"], name="sla_agreement_version_unique"),
            models.UniqueConstraint(
                fields=["endpoint"], condition=models.Q(status="in_force"), name="sla_agreement_one_in_force"
            ),
            models.UniqueConstraint(
                fields=["endpoint"], condition=models.Q(status="proposed"), name="sla_agreement_one_proposal"
            ),
        ]

    def __str__(self) -> str:
        return f"SLA v{self.version} of {self.endpoint_id} ({self.status})"

    def terms(self) -> dict[str, object]:
        """The signed terms, as audited and as shown (no signatures, no dates)."""
        return {
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "availability_pct": self.availability_pct,
            "peak_rps": self.peak_rps,
            "interval_s": self.interval_s,
            "credit_tiers": self.credit_tiers,
            "min_coverage_pct": self.min_coverage_pct,
            "monthly_fee_cents": self.monthly_fee_cents,
            "currency": self.currency,
        }


class EdgeRequest(models.Model):
    """One request as the measuring point in front of the endpoint saw it. No prompt, no text."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    # The measuring point's id for the request: a batch sent twice stores each request once.
    request_id = models.CharField(max_length=64)
    arrived_at = models.DateTimeField()
    # Client-side time to first token; null when no token came (an error, a refusal, a timeout).
    ttft_ms = models.FloatField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField()

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["endpoint", "request_id"], name="edge_request_unique"),
        ]
        indexes: ClassVar = [models.Index(fields=["endpoint", "arrived_at"])]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.request_id}"

    @property
    def ok(self) -> bool:
        return edge.outcome(self.status_code, self.ttft_ms) == "ok"


class EdgeCoverage(models.Model):
    """A span of time the measuring point reported on (one per batch): time no span covers is
    a gap in the SLA, never compliance."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    covered_from = models.DateTimeField()
    covered_to = models.DateTimeField()
    requests = models.PositiveIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["endpoint", "covered_to"])]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.covered_from:%H:%M:%S}-{self.covered_to:%H:%M:%S}"


class SLAPeriod(models.Model):
    """A closed month, frozen: the edge report and the engine's figure beside it, and the credit."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    agreement = models.ForeignKey(SLAAgreement, on_delete=models.PROTECT, related_name="periods")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    result = models.JSONField()
    credit_pct = models.FloatField()
    credit_cents = models.BigIntegerField()
    closed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["-window_start"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["endpoint", "window_start"], name="sla_period_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.window_start:%Y-%m}"


class EdgeIntervalSummary(models.Model):
    """One settled interval judged from the edge records (`compliance.edge.EdgeInterval`), kept so
    that a month's report reads a few thousand rows instead of every request. Written only by
    the scheduled settle task; a late batch that covers the interval deletes it (judged again)."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    # The measurement terms it was judged under (another version's terms judge it again).
    interval_s = models.PositiveIntegerField()
    peak_rps = models.FloatField()
    start = models.DateTimeField()
    covered = models.BooleanField()
    admitted = models.PositiveIntegerField()
    excluded = models.PositiveIntegerField()
    failed = models.PositiveIntegerField()
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    client_errors = models.PositiveIntegerField(default=0)  # not judged (compliance.edge.outcome)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["endpoint", "interval_s", "peak_rps", "start"], name="edge_interval_summary_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.start:%Y-%m-%d %H:%M} ({self.interval_s} s)"
