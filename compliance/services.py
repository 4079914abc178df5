"""Writes of the compliance app: the audit trail, residency, BAAs, sensitive objects, retention
and deletion of an organization's data.

Every mutating function takes the acting user, checks the actor's role itself and writes its
audit event in the same transaction. Refusals are `ValidationError`s whose message names the
rule that refused ("data-residency rule", "BAA rule"), so the UI and the API can say why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models, transaction
from django.utils import timezone

from compliance import chain, context, holders, selectors
from compliance.models import (
    AuditChainHead,
    AuditEvent,
    BAARecord,
    ResidencyPolicy,
    RetentionPolicy,
    StoredObject,
)
from compliance.storage import ObjectTooLarge, StorageError, get_store
from portal.accounts import rls
from portal.accounts.models import Membership, Organization

logger = logging.getLogger(__name__)

# Keys that would carry text a person wrote (prompts, messages, notes): never in the trail.
_FORBIDDEN_DATA_KEYS = frozenset({"prompt", "prompts", "text", "content", "messages", "completion", "body"})
_MAX_DATA_STRING = 512


# --- Audit trail ------------------------------------------------------------------------------


def _check_no_text(value: Any, path: str = "data") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if str(key).lower() in _FORBIDDEN_DATA_KEYS:
                raise ValueError(f"audit {path}.{key}: text fields never go into the audit trail")
            _check_no_text(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_no_text(item, f"{path}[{index}]")
    elif isinstance(value, str) and len(value) > _MAX_DATA_STRING:
        raise ValueError(f"audit {path}: strings longer than {_MAX_DATA_STRING} characters are refused")


def _lock_head(key: str) -> AuditChainHead:
    """The chain's head row, locked until the transaction ends: appends to one chain queue here."""
    head = AuditChainHead.objects.select_for_update().filter(chain=key).first()
    if head is None:
        # Two first events racing: ON CONFLICT DO NOTHING, then both lock the one row.
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(chain=key, seq=0, hash=chain.GENESIS_HASH)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(chain=key)
    return head


def audit_record(
    *,
    actor: Any,
    action: str,
    organization: Any = None,
    target: models.Model | None = None,
    data: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event to its organization's chain. `actor` is a user, or None for the
    system. `before`/`after` are recorded as digests only. Joins the caller's transaction."""
    data = data or {}
    _check_no_text(data)
    label = "system" if actor is None else str(getattr(actor, "email", actor))
    organization_id = getattr(organization, "pk", organization)
    actor_id = getattr(actor, "pk", None)
    key = chain.chain_key(organization_id)
    # An event about the platform (no organization) is written whatever tenant the caller acts
    # in; an organization's event goes to that organization's rows (row-level security).
    scope = rls.platform_transaction() if organization_id is None else rls.tenant_transaction(organization_id)
    with scope:
        head = _lock_head(key)
        event = AuditEvent(
            organization_id=organization_id,
            actor_id=actor_id,
            actor_label=label[:254],
            action=action,
            target_type=target._meta.label_lower if target is not None else "",
            target_id=str(target.pk) if target is not None else "",
            data=data,
            request_id=context.request_id.get(),
            before_digest=chain.digest(before),
            after_digest=chain.digest(after),
            created_at=timezone.now(),
            chain=key,
            seq=head.seq + 1,
            prev_hash=head.hash,
        )
        # Hash what the database will return: JSON round-tripped, ids as text.
        event.data = chain.normalise(json.loads(chain.canonical_json(data)))
        event.hash = chain.event_hash(_hashed_fields(event))
        event.save(force_insert=True)
        AuditChainHead.objects.filter(chain=key).update(seq=event.seq, hash=event.hash)
    return event


def _hashed_fields(event: AuditEvent) -> dict[str, Any]:
    return {name: getattr(event, name) for name in chain.HASHED_FIELDS}


@dataclass(frozen=True)
class BrokenLink:
    chain: str
    seq: int
    event_id: str | None  # the event's public id (never the sequential key), None for the head
    reason: str

    def __str__(self) -> str:
        where = f"event id {self.event_id}" if self.event_id is not None else "chain head"
        return f"chain {self.chain}, position {self.seq} ({where}): {self.reason}"


def audit_verify(*, chain_key: str | None = None) -> list[BrokenLink]:
    """Recomputes every chain (or one) and returns the first broken link of each broken chain."""
    keys: Iterable[str]
    if chain_key is not None:
        keys = [chain_key]
    else:
        keys = sorted(
            set(AuditEvent.objects.values_list("chain", flat=True).distinct())
            | set(AuditChainHead.objects.values_list("chain", flat=True))
        )
    broken = []
    for key in keys:
        link = _verify_chain(key) or _verify_anchor(key)
        if link is not None:
            broken.append(link)
    return broken


def _verify_anchor(key: str) -> BrokenLink | None:
    """The chain against its newest external anchor (compliance.anchor): truncation and
    re-hashing by someone who can write the database are caught there."""
    from compliance import anchor

    problem = anchor.check_chain(key)
    return None if problem is None else BrokenLink(key, problem.seq, None, problem.reason)


def _verify_chain(key: str) -> BrokenLink | None:
    expected_seq, expected_prev = 1, chain.GENESIS_HASH
    events = AuditEvent.objects.filter(chain=key).order_by("seq").iterator(chunk_size=2000)
    for event in events:
        if event.seq != expected_seq:
            return BrokenLink(
                key, expected_seq, str(event.public_id), f"event missing (next found is position {event.seq})"
            )
        if event.prev_hash != expected_prev:
            return BrokenLink(
                key, event.seq, str(event.public_id), "previous-hash does not match the event before it"
            )
        if chain.event_hash(_hashed_fields(event)) != event.hash:
            return BrokenLink(
                key, event.seq, str(event.public_id), "content does not match its hash (edited)"
            )
        expected_seq, expected_prev = event.seq + 1, event.hash
    head = AuditChainHead.objects.filter(chain=key).first()
    if head is not None and (head.seq != expected_seq - 1 or head.hash != expected_prev):
        return BrokenLink(
            key, expected_seq, None, f"the chain head is at position {head.seq}: events removed"
        )
    return None


def _require(actor: Any, organization: Any, minimum: str, doing: str) -> None:

    membership = Membership.objects.filter(user=actor, organization=organization).first()
    if membership is None:
        raise PermissionDenied("You are not a member of this organization.")
    if not membership.has_role(minimum):
        raise PermissionDenied(f"Only an {minimum} or above can {doing}; your role is {membership.role}.")


_EXPORT_FIELDS = (
    "id",
    "chain",
    "seq",
    "created_at",
    "actor_label",
    "actor_id",
    "organization_id",
    "action",
    "target_type",
    "target_id",
    "request_id",
    "data",
    "before_digest",
    "after_digest",
    "prev_hash",
    "hash",
)


def _export_row(event: AuditEvent) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in _EXPORT_FIELDS:
        # An export names each event by its public id (see AuditEvent), under the name "id".
        value: Any = str(event.public_id) if name == "id" else getattr(event, name)
        if name == "created_at":
            value = chain.timestamp(value)
        elif name in {"actor_id", "organization_id"} and value is not None:
            value = str(value)
        row[name] = value
    return row


def audit_export(*, actor: Any, organization: Any, fmt: str, region: str | None = None) -> tuple[str, bytes]:
    """The organization's whole audit chain as CSV or JSON, with every hash, for an auditor to
    verify offline. The export is itself recorded (in the same chain, after the exported part).

    `region` is where the export may be handed out from: it must be one the organization's
    residency policy allows (the default is its first allowed region)."""
    _require(actor, organization, "admin", "export the audit trail")
    if fmt not in {"csv", "json"}:
        raise ValidationError({"format": "Choose csv or json."})
    target_region = region or storage_region_for(organization=organization)
    residency_require(organization=organization, region=target_region, doing="this export", field="region")
    from compliance import anchor

    # An export says the trail is intact: not while it contradicts its external anchor.
    last_anchor = anchor.latest_anchor(chain.chain_key(organization.pk))
    problem = anchor.check_chain(chain.chain_key(organization.pk), last_anchor)
    if problem is not None:
        logger.error("audit export refused: %s", problem)
        raise ValidationError(
            f"The audit trail contradicts its external anchor ({problem.reason}). The export is "
            "withheld until the operator has investigated."
        )
    with transaction.atomic():
        events = list(selectors.audit_event_chain(organization=organization))
        rows = [_export_row(e) for e in events]
        audit_record(
            actor=actor,
            organization=organization,
            action="audit.export",
            data={"format": fmt, "events": len(rows), "region": target_region},
        )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    name = f"audit-{organization.slug}-{stamp}.{fmt}"
    if fmt == "json":
        body = json.dumps(
            {
                "organization": str(organization.pk),
                "chain": chain.chain_key(organization.pk),
                "hash_format": {
                    "algorithm": "sha256",
                    "fields": list(chain.HASHED_FIELDS),
                    "encoding": "JSON array of the fields in this order; sorted keys, no spaces",
                    "genesis": chain.GENESIS_HASH,
                },
                # The newest head written outside the database, which the events above agree with.
                "anchor": None
                if last_anchor is None
                else {
                    "seq": last_anchor.seq,
                    "hash": last_anchor.hash,
                    "anchored_at": last_anchor.anchored_at,
                },
                "events": rows,
            },
            indent=1,
        ).encode()
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(_EXPORT_FIELDS))
        writer.writeheader()
        for row in rows:
            cells = {**row, "data": chain.canonical_json(row["data"])}
            writer.writerow({name: chain.csv_cell(value) for name, value in cells.items()})
        body = buffer.getvalue().encode()
    return name, body


# --- Residency --------------------------------------------------------------------------------


def residency_require(*, organization: Any, region: str, doing: str, field: str = "region") -> None:
    """Refuses, before anything is written, data or compute outside the organization's regions."""
    allowed = selectors.allowed_regions(organization=organization)
    if region not in allowed:
        raise ValidationError(
            {
                field: (
                    f"Refused by the data-residency rule of {organization.name}: data and compute may only be in "
                    f"{', '.join(allowed) or 'no region'}; {doing} would be in {region!r}."
                )
            },
            code="residency",
        )


def storage_region_for(*, organization: Any) -> str:
    """Where this organization's new objects go: chosen by policy, never by the caller."""
    allowed = selectors.allowed_regions(organization=organization)
    for region in settings.COMPLIANCE_REGIONS:
        if region in allowed:
            return region
    raise ValidationError(
        {
            "region": (
                f"Refused by the data-residency rule of {organization.name}: none of its allowed regions "
                f"({', '.join(allowed) or 'none'}) is available in this deployment "
                f"({', '.join(settings.COMPLIANCE_REGIONS)})."
            )
        },
        code="residency",
    )


def residency_policy_set(*, actor: Any, organization: Any, allowed_regions: list[str]) -> ResidencyPolicy:
    _require(actor, organization, "owner", "change data residency")
    regions = sorted({r.strip() for r in allowed_regions if r and r.strip()})
    if not regions:
        raise ValidationError({"allowed_regions": "Allow at least one region."})
    unknown = [r for r in regions if r not in settings.COMPLIANCE_REGIONS]
    if unknown:
        raise ValidationError(
            {
                "allowed_regions": (
                    f"Unknown region {', '.join(unknown)}; this deployment has {', '.join(settings.COMPLIANCE_REGIONS)}."
                )
            }
        )
    stranded = (
        StoredObject.objects.filter(organization=organization)
        .exclude(region__in=regions)
        .values_list("region", flat=True)
    )
    if stranded:
        where = ", ".join(sorted(set(stranded)))
        raise ValidationError(
            {
                "allowed_regions": (
                    f"Refused by the data-residency rule: {len(stranded)} stored object(s) are in {where}; "
                    "delete them before removing the region."
                )
            }
        )
    with transaction.atomic():
        before = selectors.allowed_regions(organization=organization)
        policy, _ = ResidencyPolicy.objects.select_for_update().get_or_create(
            organization=organization, defaults={"allowed_regions": regions, "updated_by": actor}
        )
        policy.allowed_regions = regions
        policy.updated_by = actor
        policy.save()
        audit_record(
            actor=actor,
            organization=organization,
            action="residency.set",
            target=policy,
            data={"allowed_regions": regions, "previous": before},
            before={"allowed_regions": before},
            after={"allowed_regions": regions},
        )
    return policy


# --- BAA --------------------------------------------------------------------------------------


def baa_require(*, organization: Any, doing: str, field: str) -> BAARecord:
    baa = selectors.baa_effective(organization=organization)
    if baa is None:
        raise ValidationError(
            {
                field: (
                    f"Refused by the BAA rule: {organization.name} has no effective business associate "
                    f"agreement, so it cannot {doing}. An owner or admin records the signed BAA on the "
                    "Compliance page first, and it is in effect once the provider has countersigned it."
                )
            },
            code="baa",
        )
    return baa


# A signed agreement is a few pages; anything far larger is not the document that was meant.
BAA_DOCUMENT_MAX_BYTES = 20 * 1024 * 1024
# PDF readers accept the header anywhere in the first 1024 bytes (ISO 32000 leaves room for it).
_PDF_HEADER_WINDOW = 1024


def baa_document_problem(document: Any) -> str | None:
    """Why an uploaded "signed document (PDF)" cannot be kept, or None: it must be a PDF (its
    `%PDF-` header, not its name or the browser's content type) and within the size limit."""
    size = getattr(document, "size", None)
    if size is not None and size > BAA_DOCUMENT_MAX_BYTES:
        return (
            f"The document is {size:,} bytes; a signed agreement may be at most "
            f"{BAA_DOCUMENT_MAX_BYTES // (1024 * 1024)} MB."
        )
    head = document.read(_PDF_HEADER_WINDOW)
    document.seek(0)
    if not head:
        return "The document is empty: upload the signed agreement as a PDF."
    if b"%PDF-" not in head:
        return "The document is not a PDF: upload the signed agreement as a PDF file."
    return None


def baa_record_create(
    *,
    actor: Any,
    organization: Any,
    counterparty: str,
    version: str,
    signed_on: date,
    effective_on: date,
    ends_on: date | None = None,
    document: Any = None,
) -> BAARecord:
    """Records a signed BAA; the signed document (optional) is stored like any sensitive file."""
    _require(actor, organization, "admin", "record a BAA")
    errors: dict[str, str] = {}
    counterparty = (counterparty or "").strip()
    version = (version or "").strip()
    if not counterparty:
        errors["counterparty"] = "Name the counterparty."
    if not version:
        errors["version"] = "Give the agreement's version."
    if effective_on < signed_on:
        errors["effective_on"] = "The agreement cannot take effect before it was signed."
    if ends_on is not None and ends_on < effective_on:
        errors["ends_on"] = "The end date is before the effective date."
    if document is not None and (problem := baa_document_problem(document)) is not None:
        errors["document"] = problem
    if errors:
        raise ValidationError(errors)
    record_id = uuid.uuid4()
    stored = None
    if document is not None:
        stored = sensitive_object_store(
            actor=actor,
            organization=organization,
            kind=StoredObject.Kind.BAA_DOCUMENT,
            stream=document,
            size_hint=getattr(document, "size", None),
            owner_id=str(record_id),
        )
    try:
        with transaction.atomic():
            record = BAARecord.objects.create(
                id=record_id,
                organization=organization,
                counterparty=counterparty[:200],
                version=version[:64],
                signed_on=signed_on,
                effective_on=effective_on,
                ends_on=ends_on,
                document=stored,
                recorded_by=actor,
            )
            audit_record(
                actor=actor,
                organization=organization,
                action="baa.record",
                target=record,
                data={
                    "counterparty": record.counterparty,
                    "version": record.version,
                    "effective_on": effective_on.isoformat(),
                    "ends_on": ends_on.isoformat() if ends_on else None,
                    "document_sha256": stored.sha256 if stored else None,
                },
            )
    except Exception:
        if stored is not None:
            sensitive_object_delete(actor=actor, obj=stored, reason="baa record failed")
        raise
    return record


def is_provider(user: Any) -> bool:
    """A platform admin acts for the provider (countersigns BAAs, proposes SLA terms)."""
    return bool(getattr(user, "is_superuser", False) or getattr(user, "staff_role", "") == "platform_admin")


def baa_countersign(
    *, actor: Any, baa: BAARecord, effective_on: date, ends_on: date | None = None
) -> BAARecord:
    """The provider's countersignature: from then on (and within the dates the provider sets
    here) the BAA is in effect. Only a platform admin countersigns; anyone else trying is refused
    (PermissionDenied) and the attempt is audited in the BAA's organization."""
    organization = baa.organization
    if not is_provider(actor):
        with transaction.atomic():
            audit_record(
                actor=actor,
                organization=organization,
                action="baa.refused.countersign",
                target=baa,
                data={"version": baa.version, "reason": "not the provider"},
            )
        raise PermissionDenied(
            "Only the provider (a platform admin) countersigns a BAA; your organization's signature is already on record."
        )
    errors: dict[str, str] = {}
    if baa.countersigned_at is not None:
        errors["baa"] = "This BAA is already countersigned; record a new version to change its terms."
    if effective_on < baa.signed_on:
        errors["effective_on"] = "The agreement cannot take effect before the customer signed it."
    if ends_on is not None and ends_on < effective_on:
        errors["ends_on"] = "The end date is before the effective date."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        locked = BAARecord.objects.select_for_update().get(pk=baa.pk)
        if locked.countersigned_at is not None:
            raise ValidationError({"baa": "This BAA was countersigned meanwhile."})
        before = {
            "effective_on": locked.effective_on.isoformat(),
            "ends_on": locked.ends_on.isoformat() if locked.ends_on else None,
        }
        locked.countersigned_by, locked.countersigned_at = actor, timezone.now()
        locked.effective_on, locked.ends_on = effective_on, ends_on
        locked.save(update_fields=["countersigned_by", "countersigned_at", "effective_on", "ends_on"])
        audit_record(
            actor=actor,
            organization=organization,
            action="baa.countersign",
            target=locked,
            data={
                "version": locked.version,
                "counterparty": locked.counterparty,
                "effective_on": effective_on.isoformat(),
                "ends_on": ends_on.isoformat() if ends_on else None,
                "customer_recorded_by": str(locked.recorded_by_id) if locked.recorded_by_id else None,
            },
            before=before,
            after={
                "effective_on": effective_on.isoformat(),
                "ends_on": ends_on.isoformat() if ends_on else None,
            },
        )
    return locked


# --- Sensitive objects ------------------------------------------------------------------------


def _object_key(organization: Any, kind: str, object_id: uuid.UUID) -> str:
    return f"org/{organization.pk}/{kind}/{object_id}"


def sensitive_object_store(
    *,
    actor: Any,
    organization: Any,
    kind: str,
    stream: IO[bytes] | Any,
    contains_phi: bool = False,
    size_hint: int | None = None,
    owner_id: str = "",
) -> StoredObject:
    """Stores one sensitive file in the region the organization's policy chooses.

    Checked before anything is written: the BAA rule for PHI, the residency rule, the size
    limit (again while streaming)."""
    if contains_phi:
        baa_require(organization=organization, doing="store files containing PHI", field="contains_phi")
    region = storage_region_for(organization=organization)
    residency_require(organization=organization, region=region, doing="this file", field="file")
    limit = settings.COMPLIANCE_OBJECT_MAX_BYTES
    if size_hint is not None and size_hint > limit:
        raise ValidationError({"file": f"The file is larger than the limit of {limit:,} bytes."})
    object_id = uuid.uuid4()
    key = _object_key(organization, kind, object_id)
    if hasattr(stream, "seek"):
        stream.seek(0)
    store = get_store()
    try:
        result = store.put(region=region, key=key, stream=stream, max_bytes=limit)
    except ObjectTooLarge:
        raise ValidationError({"file": f"The file is larger than the limit of {limit:,} bytes."}) from None
    except StorageError as exc:
        raise ValidationError({"file": f"The file could not be stored: {exc}"}) from None
    try:
        with transaction.atomic():
            obj = StoredObject.objects.create(
                id=object_id,
                organization=organization,
                kind=kind,
                region=region,
                key=key,
                size_bytes=result.size_bytes,
                sha256=result.sha256,
                contains_phi=contains_phi,
                owner_id=owner_id,
            )
            audit_record(
                actor=actor,
                organization=organization,
                action="object.store",
                target=obj,
                data={
                    "kind": kind,
                    "region": region,
                    "size_bytes": result.size_bytes,
                    "contains_phi": contains_phi,
                },
            )
    except Exception:
        store.delete(region=region, key=key)
        raise
    return obj


def sensitive_object_read(*, obj: StoredObject, target: IO[bytes]) -> None:
    get_store().get(region=obj.region, key=obj.key, target=target)


def sensitive_object_delete(*, actor: Any, obj: StoredObject, reason: str) -> None:
    get_store().delete(region=obj.region, key=obj.key)
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=obj.organization_id,
            action="object.delete",
            target=obj,
            data={"kind": obj.kind, "region": obj.region, "reason": reason},
        )
        obj.delete()


def upload_admit(*, organization: Any, contains_phi: bool) -> str:
    """What a traffic upload must pass before a byte is written: the BAA rule for PHI and the
    residency rule. Returns the region the upload goes to."""
    if contains_phi:
        baa_require(organization=organization, doing="upload samples containing PHI", field="contains_phi")
    region = storage_region_for(organization=organization)
    residency_require(organization=organization, region=region, doing="this upload", field="file")
    return region


# --- Retention and deletion -------------------------------------------------------------------


MIN_METRIC_RETENTION_DAYS = 35


def retention_policy_set(
    *,
    actor: Any,
    organization: Any,
    sample_retention_days: int,
    retain_prompt_text: bool = False,
    metric_retention_days: int | None = None,
) -> RetentionPolicy:
    _require(actor, organization, "owner", "change data retention")
    if not 1 <= sample_retention_days <= 3650:
        raise ValidationError({"sample_retention_days": "Use 1 to 3650 days."})
    if metric_retention_days is not None and not MIN_METRIC_RETENTION_DAYS <= metric_retention_days <= 3650:
        raise ValidationError(
            {
                "metric_retention_days": (
                    f"Use {MIN_METRIC_RETENTION_DAYS} to 3650 days: monthly SLA windows are closed from them."
                )
            }
        )
    if retain_prompt_text:
        baa_require(organization=organization, doing="retain prompt text", field="retain_prompt_text")
    with transaction.atomic():
        before = selectors.retention_settings(organization=organization)
        policy, _ = RetentionPolicy.objects.select_for_update().get_or_create(
            organization=organization,
            defaults={"sample_retention_days": sample_retention_days, "updated_by": actor},
        )
        policy.sample_retention_days = sample_retention_days
        policy.metric_retention_days = metric_retention_days
        policy.retain_prompt_text = retain_prompt_text
        policy.updated_by = actor
        policy.save()
        after = selectors.retention_settings(organization=organization)
        audit_record(
            actor=actor,
            organization=organization,
            action="retention.set",
            target=policy,
            data=after,
            before=before,
            after=after,
        )
    return policy


def retention_enforce(*, now: datetime | None = None) -> dict[str, int]:
    """Deletes what is past each organization's retention: expired sensitive objects here, and
    whatever each registered data holder keeps (traffic samples with their objects and files,
    endpoint metric snapshots: `compliance.holders`). Idempotent; the scheduled task calls it.
    Returns counts."""

    moment = now or timezone.now()
    registered = holders.holders()
    counts = {"objects": 0}
    for holder in registered:
        counts.update({name: 0 for name in holder.counts})
    store = get_store()
    # What is computed from data that may go now (closed SLA windows, from their snapshots) is
    # stored before any holder expires anything.
    for holder in registered:
        if holder.freeze is not None:
            holder.freeze(moment)
    for organization in Organization.objects.all().iterator():
        retention = selectors.retention_settings(organization=organization)
        cutoffs = holders.RetentionCutoffs(
            samples=moment - timedelta(days=retention["sample_retention_days"]),
            sample_days=retention["sample_retention_days"],
            metrics=moment - timedelta(days=retention["metric_retention_days"]),
            metric_days=retention["metric_retention_days"],
        )
        expired_objects = StoredObject.objects.filter(
            organization=organization, kind=StoredObject.Kind.SAMPLE_UPLOAD, created_at__lt=cutoffs.samples
        )
        for obj in expired_objects:
            store.delete(region=obj.region, key=obj.key)
            with transaction.atomic():
                audit_record(
                    actor=None,
                    organization=organization,
                    action="retention.object_delete",
                    target=obj,
                    data={"region": obj.region, "retention_days": cutoffs.sample_days},
                )
                obj.delete()
            counts["objects"] += 1
        for holder in registered:
            if holder.expire is not None:
                for name, value in holder.expire(organization, cutoffs).items():
                    counts[name] = counts.get(name, 0) + value
    return counts


def organization_data_delete(*, actor: Any, organization: Any, confirm: str) -> dict[str, int]:
    """Deletes everything an organization has: its objects in every region of the deployment
    (not only the allowed ones: a past policy may have allowed others), its files and its rows
    (each registered data holder's share, `compliance.holders`). What remains is the audit trail,
    which never held its data, ending with this deletion."""
    _require(actor, organization, "owner", "delete the organization's data")
    if confirm != organization.slug:
        raise ValidationError({"confirm": f"Type the organization's slug ({organization.slug}) to confirm."})
    registered = holders.holders()
    for holder in registered:
        reason = holder.refuse_deletion(organization) if holder.refuse_deletion is not None else ""
        if reason:
            raise ValidationError({"confirm": reason})
    store = get_store()
    prefix = f"org/{organization.pk}/"
    per_region: dict[str, int] = {}
    for region in settings.COMPLIANCE_REGIONS:
        per_region[region] = store.delete_prefix(region=region, prefix=prefix)
    for holder in registered:
        if holder.remove_files is not None:
            holder.remove_files(organization)
    organization_id, name = organization.pk, organization.name
    with transaction.atomic():
        counts = {"objects": sum(per_region.values())}
        for holder in registered:
            if holder.count is not None:
                counts.update(holder.count(organization))
        audit_record(
            actor=actor,
            organization=organization_id,
            action="organization.data_delete",
            data={"name": name, "objects_by_region": per_region, **counts},
        )
        for holder in registered:
            if holder.delete_rows is not None:
                holder.delete_rows(organization)
        organization.delete()
    return counts


# --- Raw traffic uploads (called by portal.traffic.services) ----------------------------------

_OBJECT_REF = "object:"


def sample_upload_store(
    *, actor: Any, organization: Any, sample_id: str, upload: Any, contains_phi: bool
) -> str:
    """Stores a raw upload in the region the policy chooses (after the BAA and residency rules)
    and returns the reference the sample keeps until it is read."""
    obj = sensitive_object_store(
        actor=actor,
        organization=organization,
        kind=StoredObject.Kind.SAMPLE_UPLOAD,
        stream=upload,
        contains_phi=contains_phi,
        size_hint=getattr(upload, "size", None),
        owner_id=sample_id,
    )
    return f"{_OBJECT_REF}{obj.id}"


def is_object_reference(reference: str) -> bool:
    return reference.startswith(_OBJECT_REF)


def sample_upload_fetch(*, reference: str, target: IO[bytes]) -> bool:
    """Decrypts/downloads a raw upload into `target`; False when it is gone."""
    obj = StoredObject.objects.filter(id=reference.removeprefix(_OBJECT_REF)).first()
    if obj is None:
        return False
    try:
        sensitive_object_read(obj=obj, target=target)
    except StorageError:
        logger.error("stored upload %s could not be read", obj.id)
        return False
    return True


def sample_upload_release(*, organization: Any, reference: str) -> None:
    """After ingest: the raw upload (prompt text) is deleted, unless the organization retains
    prompt text under an effective BAA, in which case retention deletes it later."""
    obj = StoredObject.objects.filter(id=reference.removeprefix(_OBJECT_REF)).first()
    if obj is None:
        return
    if selectors.retention_settings(organization=organization)[
        "retain_prompt_text"
    ] and selectors.baa_effective(organization=organization):
        return
    sensitive_object_delete(actor=None, obj=obj, reason="read by ingest; prompt text is not retained")


def sample_objects_delete(*, actor: Any, sample: Any) -> None:
    """Deletes every stored object of one traffic sample, in whatever region it is."""
    for obj in StoredObject.objects.filter(organization=sample.organization_id, owner_id=str(sample.pk)):
        sensitive_object_delete(actor=actor, obj=obj, reason="sample deleted")


def sample_upload_discard(*, reference: str) -> None:
    """Removes a raw upload whose sample was never created (the request failed)."""
    obj = StoredObject.objects.filter(id=reference.removeprefix(_OBJECT_REF)).first()
    if obj is not None:
        sensitive_object_delete(actor=None, obj=obj, reason="upload request failed")


# --- SLA --------------------------------------------------------------------------------------


def residency_require_hardware(*, organization: Any, hardware: str, doing: str) -> None:
    """For compute (tuning jobs, endpoints): the hardware's region must be allowed."""
    from tuning.search.job import HARDWARE

    target = HARDWARE.get(hardware)
    if target is None:
        raise ValidationError({"hardware": f"unknown hardware {hardware!r}"})
    # A local target runs on this machine, whose region the deployment declares (validated settings).
    region = target.region or settings.LOCAL_HARDWARE_REGION
    residency_require(organization=organization, region=region, doing=doing, field="hardware")


def staff_access_record(
    *, actor: Any, what: str, organization: Any = None, data: dict[str, Any] | None = None
) -> None:
    """Staff looking at tenants' data is itself an audited event."""
    with transaction.atomic():
        audit_record(
            actor=actor, organization=organization, action="staff.access", data={"what": what, **(data or {})}
        )


# --- Two-factor (TOTP) ------------------------------------------------------------------------

_TOTP_PURPOSE = "totp-secret"


def _totp_new_device(*, user: Any) -> str:
    from compliance import totp
    from compliance.models import TOTPDevice
    from compliance.storage import seal

    secret = totp.new_secret()
    TOTPDevice.objects.update_or_create(
        user=user,
        defaults={"secret_encrypted": seal(secret.encode(), purpose=_TOTP_PURPOSE), "last_step": -1},
    )
    return secret


def totp_enroll_start(*, user: Any) -> str:
    """A new, unconfirmed authenticator secret for `user` (replacing an unconfirmed one).

    Only an explicit request (a POST, behind a fresh re-authentication: portal.accounts.reauth)
    calls this; showing the enrolment page only reads the pending secret
    (`selectors.totp_pending_secret`), so a page load, a reload, a prefetch or a subresource
    bounced to the page never makes or swaps the key a person is typing codes from."""
    if selectors.totp_confirmed(user=user):
        raise ValidationError({"code": "An authenticator is already set up."})
    with transaction.atomic():
        replaced = selectors.totp_pending_secret(user=user) is not None
        secret = _totp_new_device(user=user)
        audit_record(actor=user, action="two_factor.new_key", data={"replaced": replaced})
    return secret


# Recovery codes: 16 characters from an alphabet without look-alikes (79 bits), shown once, kept
# only as SHA-256 digests (random codes of that strength need no slow hash), each used once.
RECOVERY_CODE_COUNT = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
_RECOVERY_LENGTH = 16


def _recovery_digest(*, user: Any, code: str) -> str:
    normalized = code.strip().lower().replace("-", "").replace(" ", "")
    return hashlib.sha256(f"{user.pk}:{normalized}".encode()).hexdigest()


def _looks_like_recovery_code(code: str) -> bool:
    normalized = code.strip().lower().replace("-", "").replace(" ", "")
    return len(normalized) == _RECOVERY_LENGTH and all(c in _RECOVERY_ALPHABET for c in normalized)


def totp_recovery_codes_create(*, user: Any) -> list[str]:
    """A fresh set of one-time recovery codes for `user` (the old ones stop working). The codes
    are returned once, to be shown once; only their digests are stored."""
    from compliance.models import TOTPRecoveryCode

    if not selectors.totp_confirmed(user=user):
        raise ValidationError({"code": "Set up an authenticator first."})
    codes = []
    for _ in range(RECOVERY_CODE_COUNT):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(_RECOVERY_LENGTH))
        codes.append("-".join(raw[i : i + 4] for i in range(0, _RECOVERY_LENGTH, 4)))
    with transaction.atomic():
        TOTPRecoveryCode.objects.filter(user=user).delete()
        TOTPRecoveryCode.objects.bulk_create(
            [TOTPRecoveryCode(user=user, code_digest=_recovery_digest(user=user, code=c)) for c in codes]
        )
        audit_record(actor=user, action="two_factor.recovery_codes", data={"count": len(codes)})
    return codes


def _recovery_code_use(*, user: Any, code: str) -> bool:
    from compliance.models import TOTPRecoveryCode

    with transaction.atomic():
        # Conditional update: the same code sent twice at once passes once.
        used = TOTPRecoveryCode.objects.filter(
            user=user, code_digest=_recovery_digest(user=user, code=code), used_at__isnull=True
        ).update(used_at=timezone.now())
        if used:
            left = TOTPRecoveryCode.objects.filter(user=user, used_at__isnull=True).count()
            audit_record(actor=user, action="two_factor.recovery_code_used", data={"left": left})
    return bool(used)


def _totp_throttled(user: Any) -> bool:
    from compliance.models import LoginFailure

    since = timezone.now() - timedelta(seconds=settings.LOGIN_THROTTLE_WINDOW_S)
    key = f"totp:{user.pk}"
    return (
        LoginFailure.objects.filter(email_digest=key, at__gte=since).count()
        >= settings.LOGIN_THROTTLE_FAILURES
    )


def _totp_failure_record(*, user: Any, device: Any, kind: str) -> None:
    """A wrong second factor is sign-in activity: audited (never the code itself)."""
    with transaction.atomic():
        audit_record(actor=None, action="auth.two_factor_failed", target=user, data={"kind": kind})


def totp_verify(*, user: Any, code: str, now_s: float | None = None) -> bool:
    """Checks a code against the user's authenticator (confirming it on first success), or a
    recovery code once the authenticator is confirmed. Replays and too many failures are
    refused."""
    import time

    from compliance import totp
    from compliance.models import LoginFailure, TOTPDevice
    from compliance.storage import unseal

    device = TOTPDevice.objects.filter(user=user).first()
    if device is None:
        raise ValidationError({"code": "Set up an authenticator first."})
    if _totp_throttled(user):
        raise ValidationError({"code": "Too many wrong codes; wait a few minutes and try again."})
    if device.confirmed_at is not None and _looks_like_recovery_code(code):
        if _recovery_code_use(user=user, code=code):
            LoginFailure.objects.filter(email_digest=f"totp:{user.pk}").delete()
            return True
        LoginFailure.objects.create(email_digest=f"totp:{user.pk}")
        _totp_failure_record(user=user, device=device, kind="recovery code")
        return False
    secret = unseal(bytes(device.secret_encrypted), purpose=_TOTP_PURPOSE).decode()
    step = totp.matching_step(
        secret, code, now_s=time.time() if now_s is None else now_s, after_step=device.last_step
    )
    if step is None:
        LoginFailure.objects.create(email_digest=f"totp:{user.pk}")
        _totp_failure_record(user=user, device=device, kind="authenticator code")
        return False
    with transaction.atomic():
        # Conditional update: two requests with the same code cannot both pass.
        claimed = TOTPDevice.objects.filter(pk=device.pk, last_step__lt=step).update(last_step=step)
        if not claimed:
            return False
        if device.confirmed_at is None:
            TOTPDevice.objects.filter(pk=device.pk).update(confirmed_at=timezone.now())
            audit_record(actor=user, action="two_factor.enroll", target=device)
    LoginFailure.objects.filter(email_digest=f"totp:{user.pk}").delete()
    return True
