"""Sensitive objects: encrypted at rest in the organization's region, read and deleted with an audit event."""

from __future__ import annotations

import logging
import uuid
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from compliance.models import (
    StoredObject,
)
from compliance.services.audit import audit_record
from compliance.services.rules import baa_require, residency_require, storage_region_for
from compliance.storage import ObjectTooLarge, StorageError, get_store
from portal.accounts.models import Organization, User

logger = logging.getLogger(__name__)

# --- Sensitive objects ------------------------------------------------------------------------


def _object_key(organization: Organization, kind: str, object_id: uuid.UUID) -> str:
    return f"org/{organization.pk}/{kind}/{object_id}"


def sensitive_object_store(
    *,
    actor: User,
    organization: Organization,
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


def sensitive_object_delete(*, actor: User | None, obj: StoredObject, reason: str) -> None:
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


def upload_admit(*, organization: Organization, contains_phi: bool) -> str:
    """What a traffic upload must pass before a byte is written: the BAA rule for PHI and the
    residency rule. Returns the region the upload goes to."""
    if contains_phi:
        baa_require(organization=organization, doing="upload samples containing PHI", field="contains_phi")
    region = storage_region_for(organization=organization)
    residency_require(organization=organization, region=region, doing="this upload", field="file")
    return region
