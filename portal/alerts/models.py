"""Alerts: what happened (an event, once per episode), where each organization wants to hear
about it (channels: email addresses and signed webhooks), and every attempt to tell it
(deliveries, the log people read when an alert did not arrive).

Deliveries are rows written in the transaction that recorded the event (an outbox): a broker
outage or a killed worker delays them, never loses them, because the scheduled redispatch sends
every delivery that is due.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models


class AlertKind(models.TextChoices):
    SLA_AT_RISK = "sla.at_risk", "SLA at risk (error budget burning fast)"
    SLA_BREACHED = "sla.breached", "SLA breached"
    ENDPOINT_DEGRADED = "endpoint.degraded", "Endpoint degraded"
    ENDPOINT_DOWN = "endpoint.down", "Endpoint down"
    DRIFT_DETECTED = "loop.drift_detected", "Traffic drift detected"
    LOOP_PROMOTED = "loop.promoted", "Loop promoted a new configuration"
    LOOP_ROLLED_BACK = "loop.rolled_back", "Loop rolled back"
    JOB_FINISHED = "job.finished", "Tuning job finished"
    JOB_FAILED = "job.failed", "Tuning job failed"
    PAYMENT_FAILED = "billing.payment_failed", "Payment failed"


class AlertChannel(models.Model):
    class Kind(models.TextChoices):
        EMAIL = "email", "Email"
        WEBHOOK = "webhook", "Signed webhook"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=100)
    # An email address, or the webhook's https:// (or http://) URL.
    target = models.CharField(max_length=500)
    # The webhook's signing secret (HMAC-SHA256). Shown once when made; never in the audit trail.
    secret = models.CharField(max_length=64, blank=True)
    # The alert kinds this channel receives (values of AlertKind).
    kinds = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["name"]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class Alert(models.Model):
    """One thing worth telling, once: `subject` names the episode (e.g. the job and its outcome)
    so the same condition seen again by the next check is not alerted twice."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    subject = models.CharField(max_length=200)
    summary = models.CharField(max_length=300)
    # Ids, numbers and links only; never prompt text.
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["organization", "subject"], name="alert_subject_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.summary}"


class AlertDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        DELIVERED = "delivered", "Delivered"
        # Every attempt failed: kept with the last error; a person can send it again.
        ABANDONED = "abandoned", "Gave up after retries"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    # A sender holds the delivery until then; a killed sender's hold runs out.
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["alert", "channel"], name="alert_delivery_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.alert_id} -> {self.channel_id} ({self.status})"


class AlertAttempt(models.Model):
    """One try of one delivery: the delivery log."""

    delivery = models.ForeignKey(AlertDelivery, on_delete=models.CASCADE, related_name="log")
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(auto_now_add=True)
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.FloatField()

    class Meta:
        ordering: ClassVar = ["-at"]

    def __str__(self) -> str:
        return f"{self.delivery_id} at {self.at:%H:%M:%S} ok={self.ok}"


class EndpointAlertState(models.Model):
    """The endpoint status last alerted on, so a degraded endpoint alerts once per episode."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    endpoint = models.OneToOneField("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16)
    episode = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.endpoint_id}: {self.status}"
