"""The audit trail's export: an organization's events as CSV or JSON, from the region its policy names."""

from __future__ import annotations

import csv
import io
import json
import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from compliance import chain, selectors
from compliance.models import (
    AuditEvent,
)
from compliance.services.audit import audit_record
from compliance.services.rules import _require, residency_require, storage_region_for
from portal.accounts.models import Organization, User

logger = logging.getLogger(__name__)


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


def audit_export(
    *, actor: User, organization: Organization, fmt: str, region: str | None = None
) -> tuple[str, bytes]:
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
