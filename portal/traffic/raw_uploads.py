"""Raw traffic uploads (called by portal.traffic.services): stored as compliance's sensitive
objects (in the region the organization's policy chooses, encrypted where PHI), fetched for the
ingest, released after it and discarded with their sample."""

from __future__ import annotations

import logging
from typing import IO, TYPE_CHECKING, Any

from compliance import selectors
from compliance.models import (
    StoredObject,
)
from compliance.services.objects import sensitive_object_delete, sensitive_object_read, sensitive_object_store
from compliance.storage import StorageError
from portal.accounts.models import Organization, User

if TYPE_CHECKING:
    from portal.traffic.models import TrafficSample

logger = logging.getLogger(__name__)

_OBJECT_REF = "object:"


def sample_upload_store(
    *, actor: User, organization: Organization, sample_id: str, upload: Any, contains_phi: bool
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


def sample_upload_release(*, organization: Organization, reference: str) -> None:
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


def sample_objects_delete(*, actor: User, sample: TrafficSample) -> None:
    """Deletes every stored object of one traffic sample, in whatever region it is."""
    for obj in StoredObject.objects.filter(organization=sample.organization_id, owner_id=str(sample.pk)):
        sensitive_object_delete(actor=actor, obj=obj, reason="sample deleted")


def sample_upload_discard(*, reference: str) -> None:
    """Removes a raw upload whose sample was never created (the request failed)."""
    obj = StoredObject.objects.filter(id=reference.removeprefix(_OBJECT_REF)).first()
    if obj is not None:
        sensitive_object_delete(actor=None, obj=obj, reason="upload request failed")
