"""The compliance evidence pack: one zip per organization and period that an auditor can check
offline with `python -m compliance.verify_export PACK.zip`.

Contents (all JSON):
- `audit/chain.json`: the organization's whole audit chain with every hash (as `audit_export`);
- `audit/verification.json`: the server's own verification of that chain when the pack was made;
- `audit/member_changes.json`: the period's events about people (invitations, memberships,
  roles, API tokens, sign-ins refused): who could act, and when that changed;
- `baa/records.json`: every BAA on record, with both signatures where countersigned;
- `residency/policy.json` and `residency/objects.json`: the allowed regions and where each
  stored object lives (region, key, size, SHA-256; never contents);
- the product's own sections (SLA reports with credits, given by the portal as `sections`);
- `MANIFEST.json`: the SHA-256 and size of every other file. The pack's creation is an audit
  event carrying the manifest's SHA-256, so the pack is tied to the chain it exports.

This module holds the evidence rules; the portal app that owns a product section passes it in.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from compliance import chain, selectors
from compliance.models import BAARecord, StoredObject
from compliance.services import _require, audit_export, audit_record, audit_verify

MANIFEST = "MANIFEST.json"
# Actions about who may act in the organization, for the member-changes section.
MEMBER_ACTION_PREFIXES = ("membership.", "member.", "invitation.", "api_token.", "organization.", "auth.")
# A product section is a few months of reports, not bulk data: bounded.
MAX_SECTION_BYTES = 50 * 1024 * 1024


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=str).encode()


def _baa_rows(organization: Any) -> list[dict[str, Any]]:
    rows = []
    records = (
        BAARecord.objects.filter(organization=organization)
        .select_related("document", "recorded_by", "countersigned_by")
        .order_by("effective_on", "recorded_at")
    )
    for record in records:
        rows.append(
            {
                "id": str(record.id),
                "counterparty": record.counterparty,
                "version": record.version,
                "signed_on": record.signed_on.isoformat(),
                "effective_on": record.effective_on.isoformat(),
                "ends_on": record.ends_on.isoformat() if record.ends_on else None,
                "recorded_by": record.recorded_by.email if record.recorded_by else None,
                "recorded_at": record.recorded_at.isoformat(),
                "document_sha256": record.document.sha256 if record.document else None,
                "countersigned_by": record.countersigned_by.email if record.countersigned_by else None,
                "countersigned_at": record.countersigned_at.isoformat() if record.countersigned_at else None,
                "in_effect_today": record.is_effective_on(timezone.now().date()),
            }
        )
    return rows


def evidence_pack(
    *,
    actor: Any,
    organization: Any,
    period_start: datetime,
    period_end: datetime,
    sections: dict[str, bytes] | None = None,
) -> tuple[str, bytes]:
    """The pack's file name and bytes. Owners and admins only; the pack's creation is audited."""
    _require(actor, organization, "admin", "download the compliance evidence pack")
    sections = dict(sections or {})
    for name, body in sections.items():
        if (
            not name.endswith(".json")
            or name.startswith(("/", "audit/", "baa/", "residency/"))
            or ".." in name
        ):
            raise ValidationError(f"{name!r} cannot be a product section of the pack.")
        if len(body) > MAX_SECTION_BYTES:
            raise ValidationError(f"The section {name} is larger than {MAX_SECTION_BYTES} bytes.")
    _, chain_json = audit_export(actor=actor, organization=organization, fmt="json")
    chain_key = chain.chain_key(organization.pk)
    broken = audit_verify(chain_key=chain_key)
    events = json.loads(chain_json)["events"]
    lo, hi = chain.timestamp(period_start), chain.timestamp(period_end)
    member_changes = [
        e
        for e in events
        if lo <= e["created_at"] < hi and str(e["action"]).startswith(MEMBER_ACTION_PREFIXES)
    ]
    objects = [
        {
            "id": str(o.id),
            "kind": o.kind,
            "region": o.region,
            "key": o.key,
            "size_bytes": o.size_bytes,
            "sha256": o.sha256,
            "contains_phi": o.contains_phi,
            "created_at": o.created_at.isoformat(),
        }
        for o in StoredObject.objects.filter(organization=organization).order_by("created_at")
    ]
    files: dict[str, bytes] = {
        "audit/chain.json": chain_json,
        "audit/verification.json": _json(
            {
                "chain": chain_key,
                "events": len(events),
                "last_hash": events[-1]["hash"] if events else chain.GENESIS_HASH,
                "server_verification": "intact" if not broken else [str(b) for b in broken],
            }
        ),
        "audit/member_changes.json": _json({"period_start": lo, "period_end": hi, "events": member_changes}),
        "baa/records.json": _json({"records": _baa_rows(organization)}),
        "residency/policy.json": _json(
            {
                "allowed_regions": selectors.allowed_regions(organization=organization),
                "is_default": selectors.residency_is_default(organization=organization),
            }
        ),
        "residency/objects.json": _json({"objects": objects}),
        **sections,
    }
    manifest = {
        "organization": str(organization.pk),
        "period_start": lo,
        "period_end": hi,
        "generated_at": chain.timestamp(timezone.now()),
        "hash_algorithm": "sha256",
        "files": {
            name: {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
            for name, body in sorted(files.items())
        },
    }
    manifest_bytes = _json(manifest)
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=organization,
            action="compliance.evidence_pack",
            data={
                "period_start": lo,
                "period_end": hi,
                "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
                "files": len(files),
            },
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, body in sorted(files.items()):
            archive.writestr(name, body)
        archive.writestr(MANIFEST, manifest_bytes)
    name = f"evidence-{organization.slug}-{period_start:%Y-%m}.zip"
    return name, buffer.getvalue()
