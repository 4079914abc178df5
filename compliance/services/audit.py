"""The audit trail: hash-chained events written in the transaction of the change they record, their verification against the chain and its external anchors, the export, and staff access records."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from compliance import chain, context
from compliance.models import (
    AuditChainHead,
    AuditEvent,
)
from portal.accounts import rls

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


def staff_access_record(
    *, actor: Any, what: str, organization: Any = None, data: dict[str, Any] | None = None
) -> None:
    """Staff looking at tenants' data is itself an audited event."""
    with transaction.atomic():
        audit_record(
            actor=actor, organization=organization, action="staff.access", data={"what": what, **(data or {})}
        )
