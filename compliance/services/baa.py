"""Business associate agreements: the customer's record and the provider's countersignature, and the rule that PHI work needs one in force."""

from __future__ import annotations

import logging
import uuid
from datetime import date
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from compliance.models import (
    BAARecord,
    StoredObject,
)
from compliance.services.audit import audit_record
from compliance.services.objects import sensitive_object_delete, sensitive_object_store
from compliance.services.rules import _require
from portal.accounts.models import Organization, User

logger = logging.getLogger(__name__)

# --- BAA --------------------------------------------------------------------------------------


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
    actor: User,
    organization: Organization,
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


def is_provider(user: User | AnonymousUser) -> bool:
    """A platform admin acts for the provider (countersigns BAAs, proposes SLA terms)."""
    return bool(getattr(user, "is_superuser", False) or getattr(user, "staff_role", "") == "platform_admin")


def baa_countersign(
    *, actor: User, baa: BAARecord, effective_on: date, ends_on: date | None = None
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
