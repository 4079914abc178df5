"""Compliance records: the audit trail, residency, BAAs, retention and stored sensitive objects.

The audit trail is append-only and hash-chained (see `compliance.chain`): services append
events through `compliance.services.audit_record`; on PostgreSQL a trigger refuses every UPDATE
and DELETE of an audit row, whoever asks. Audit rows keep the ids of their organization and
actor as plain values (no database constraint, no cascade), so deleting an organization or a
user never rewrites the history about them.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEvent(models.Model):
    """One thing a person (or a token, or the system) did, recorded in the same transaction.

    The integer primary key counts every tenant's events together, so it stays inside the
    server (ordering, the operator's admin): pages, exports, the API and verification messages
    name an event by `public_id`, a random UUID that says nothing about anyone's volume. Neither
    is hashed; the chain position (`seq`) counts only the organization's own events."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)

    # Null for events about the platform itself (e.g. a signup before any organization exists).
    organization = models.ForeignKey(
        "accounts.Organization",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Who acted, kept as text too so the record survives the actor's deletion.
    actor_label = models.CharField(max_length=254, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    # Structured details; never prompt text, PHI or secrets (audit_record refuses text fields).
    data = models.JSONField(default=dict, blank=True)
    # The request that caused the event (X-Request-ID, or one made up per request); "" outside one.
    request_id = models.CharField(max_length=64, blank=True)
    # sha256 of the canonical JSON of the object's state before and after ("" when not given):
    # proves what changed without copying the values into the trail.
    before_digest = models.CharField(max_length=64, blank=True)
    after_digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The chain this event belongs to (the organization's id, or "platform"), its position in it,
    # the previous event's hash and its own (see compliance.chain.HASHED_FIELDS).
    chain = models.CharField(max_length=64, default="", editable=False)
    seq = models.BigIntegerField(default=0, editable=False)
    prev_hash = models.CharField(max_length=64, default="", editable=False)
    hash = models.CharField(max_length=64, default="", editable=False)

    class Meta:
        ordering: ClassVar = ["-created_at", "-id"]
        indexes: ClassVar = [models.Index(fields=["organization", "-created_at"])]
        constraints: ClassVar = [
            # A second wall against a forked chain: two events can never share a position.
            models.UniqueConstraint(fields=["chain", "seq"], name="auditevent_chain_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action}"


class AuditChainHead(models.Model):
    """The last link of one chain. Appends lock this row, so two transactions never fork a chain;
    `verify_audit` also compares it with the last event, which catches a removed tail."""

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.chain} @ {self.seq}"


class ResidencyPolicy(models.Model):
    """Where an organization's data and compute may be. Without a row, the deployment's default
    (COMPLIANCE_DEFAULT_REGIONS: its home region only) applies, never "anywhere"."""

    organization = models.OneToOneField(
        "accounts.Organization", on_delete=models.CASCADE, related_name="residency_policy"
    )
    # Region codes, e.g. ["us"]; each one of the deployment's COMPLIANCE_REGIONS.
    allowed_regions = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.organization}: {', '.join(self.allowed_regions)}"


class RetentionPolicy(models.Model):
    """How long an organization's samples are kept, and whether prompt text may be kept at all."""

    organization = models.OneToOneField(
        "accounts.Organization", on_delete=models.CASCADE, related_name="retention_policy"
    )
    sample_retention_days = models.PositiveIntegerField()
    # Endpoint metric snapshots; at least a month and a few days, so SLA windows close first.
    metric_retention_days = models.PositiveIntegerField(null=True, blank=True)
    # Keeping prompt text needs an effective BAA (checked when set and when used).
    retain_prompt_text = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.organization}: {self.sample_retention_days} days"


class StoredObject(models.Model):
    """One sensitive file in object storage: where it is (region, key) and what it is, never what
    it says. The inventory behind retention and deletion."""

    class Kind(models.TextChoices):
        SAMPLE_UPLOAD = "sample_upload", "Traffic sample upload"
        BAA_DOCUMENT = "baa_document", "Signed BAA"
        EXPORT = "export", "Audit export"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="stored_objects"
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    region = models.CharField(max_length=32)
    key = models.CharField(max_length=512)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    contains_phi = models.BooleanField(default=False)
    # Optional link to the row the object belongs to (e.g. a traffic sample's id).
    owner_id = models.CharField(max_length=64, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["region", "key"], name="storedobject_region_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.region}:{self.key}"


class BAARecord(models.Model):
    """A business associate agreement an organization signed with a counterparty."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="baa_records"
    )
    counterparty = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    signed_on = models.DateField()
    effective_on = models.DateField()
    # Open-ended when null.
    ends_on = models.DateField(null=True, blank=True)
    document = models.ForeignKey(
        StoredObject, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    recorded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    recorded_at = models.DateTimeField(default=timezone.now)
    # The provider's countersignature (a platform admin): a BAA takes effect only once both
    # parties signed; the provider sets the effective dates when countersigning.
    countersigned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    countersigned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-effective_on", "-recorded_at"]

    def __str__(self) -> str:
        return f"BAA {self.version} with {self.counterparty}"

    def is_effective_on(self, day: object) -> bool:
        return (
            self.countersigned_at is not None
            and self.effective_on <= day  # type: ignore[operator]
            and (self.ends_on is None or day <= self.ends_on)  # type: ignore[operator]
        )


class LoginFailure(models.Model):
    """A failed sign-in, kept briefly for throttling. The address is stored hashed."""

    email_digest = models.CharField(max_length=64, db_index=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"failure at {self.at:%Y-%m-%d %H:%M:%S}"


class TOTPDevice(models.Model):
    """A person's authenticator. The secret is stored encrypted (AES-GCM, the storage key)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_device"
    )
    secret_encrypted = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)
    # Null until the person proves the app works by entering a first code.
    confirmed_at = models.DateTimeField(null=True, blank=True)
    # The last time step accepted: a code is never accepted twice.
    last_step = models.BigIntegerField(default=-1)

    def __str__(self) -> str:
        return f"authenticator of {self.user_id}"


class TOTPRecoveryCode(models.Model):
    """A one-time code that stands in for the authenticator (a lost phone). Only a SHA-256 digest
    of the code is kept; the code itself is shown once, when the set is made."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_recovery_codes"
    )
    code_digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    # Set when the code is used; a used code never works again.
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["user", "code_digest"], name="totp_recovery_code_unique"),
        ]

    def __str__(self) -> str:
        return f"recovery code of {self.user_id}"
