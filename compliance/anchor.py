"""An external anchor for the audit chains (issue 27 finding 11).

The hash chain proves that no event was edited in place, but someone who can write the database
(a superuser, a stolen backup restored) can delete the newest events and move the chain head
back, or rewrite an event and re-hash everything after it: the chain still verifies. So the head
of every chain is written, periodically, outside the database: to the object store of the
organization's region (the platform chain: the deployment's home region), under
`audit-anchors/<chain>/<seq>-<hash prefix>.json`, holding the position and hash of the head
and when it was anchored. Objects are sealed by the store (AES-GCM locally, the bucket's
encryption on S3) and organization deletion leaves them (it removes `org/<id>/` only). Where
the bucket has S3 Object Lock enabled, each anchor is written in compliance mode, retained for
COMPLIANCE_AUDIT_ANCHOR_RETENTION_DAYS: not even the bucket's owner can delete or overwrite it.

Verification compares each chain with its newest anchor: the event at the anchored position
must still exist with the anchored hash. Truncation (the head now below the anchor) and
rewriting (a different hash at the anchored position, whatever was re-hashed after it) are
named. Events after the newest anchor are covered from the next anchoring on; a new anchor is
written only after the chain has been checked against the previous one, so a chain rewritten
in between is never blessed by a fresh anchor.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from compliance import chain
from compliance.models import AuditChainHead, AuditEvent
from compliance.storage import S3Store, StorageError, get_store
from portal.accounts import rls
from portal.accounts.models import Organization

logger = logging.getLogger(__name__)

PREFIX = "audit-anchors"
# An anchor object is a few hundred bytes; anything larger is not one of ours.
MAX_ANCHOR_BYTES = 4096


@dataclass(frozen=True)
class Anchor:
    chain: str
    seq: int
    hash: str
    anchored_at: str  # ISO 8601, UTC
    region: str


@dataclass(frozen=True)
class AnchorProblem:
    chain: str
    seq: int
    reason: str

    def __str__(self) -> str:
        return f"chain {self.chain}, position {self.seq} (external anchor): {self.reason}"


def _region_for(chain_key: str) -> str:
    from compliance.services.rules import storage_region_for

    if chain_key != chain.PLATFORM_CHAIN:
        with rls.platform_transaction():
            organization = Organization.objects.filter(pk=chain_key).first()
        if organization is not None:
            return storage_region_for(organization=organization)
    return str(settings.COMPLIANCE_DEFAULT_REGIONS[0])


def _key(chain_key: str, seq: int, head_hash: str) -> str:
    return f"{PREFIX}/{chain_key}/{seq:020d}-{head_hash[:16]}.json"


def latest_anchor(chain_key: str) -> Anchor | None:
    """The newest anchor of a chain, looked for in every region (residency may have moved)."""
    store = get_store()
    found: tuple[str, str] | None = None
    for region in settings.COMPLIANCE_REGIONS:
        keys = store.list_keys(region=region, prefix=f"{PREFIX}/{chain_key}/")
        if keys:
            newest = max(keys)
            if found is None or newest.rsplit("/", 1)[-1] > found[1].rsplit("/", 1)[-1]:
                found = (region, newest)
    if found is None:
        return None
    region, key = found
    buffer = io.BytesIO()
    store.get(region=region, key=key, target=buffer)
    body = buffer.getvalue()
    if len(body) > MAX_ANCHOR_BYTES:
        raise StorageError(f"anchor {key!r} is not an anchor ({len(body)} bytes)")
    data: dict[str, Any] = json.loads(body)
    return Anchor(
        chain=str(data["chain"]),
        seq=int(data["seq"]),
        hash=str(data["hash"]),
        anchored_at=str(data["anchored_at"]),
        region=region,
    )


def check_chain(chain_key: str, anchor: Anchor | None = None) -> AnchorProblem | None:
    """The chain against its newest anchor: None when it agrees (or has no anchor yet)."""
    anchor = anchor if anchor is not None else latest_anchor(chain_key)
    if anchor is None:
        return None
    if anchor.chain != chain_key:
        return AnchorProblem(chain_key, anchor.seq, f"the anchor names another chain ({anchor.chain})")
    head = AuditChainHead.objects.filter(chain=chain_key).first()
    head_seq = head.seq if head is not None else 0
    event = AuditEvent.objects.filter(chain=chain_key, seq=anchor.seq).first()
    if event is None or head_seq < anchor.seq:
        return AnchorProblem(
            chain_key,
            anchor.seq,
            f"anchored at position {anchor.seq} on {anchor.anchored_at}, but the chain now ends at "
            f"position {head_seq}: events were removed",
        )
    if event.hash != anchor.hash:
        return AnchorProblem(
            chain_key,
            anchor.seq,
            f"the event at the anchored position no longer has the hash anchored on {anchor.anchored_at}: "
            "the chain was rewritten",
        )
    return None


def audit_anchor_write(*, now: datetime | None = None) -> dict[str, int]:
    """Anchors the head of every chain that moved since its last anchor. A chain that disagrees
    with its previous anchor is not anchored again (that would bless the rewrite): it is logged
    as an error and counted. Returns counts: anchored, unchanged, refused."""

    moment = now or timezone.now()
    counts = {"anchored": 0, "unchanged": 0, "refused": 0}
    with rls.platform_transaction():
        heads = list(AuditChainHead.objects.order_by("chain"))
    store = get_store()
    for head in heads:
        previous = latest_anchor(head.chain)
        with rls.platform_transaction():
            problem = check_chain(head.chain, previous)
        if problem is not None:
            logger.error("audit trail contradicts its external anchor: %s", problem)
            counts["refused"] += 1
            continue
        if previous is not None and previous.seq == head.seq and previous.hash == head.hash:
            counts["unchanged"] += 1
            continue
        body = json.dumps(
            {"chain": head.chain, "seq": head.seq, "hash": head.hash, "anchored_at": chain.timestamp(moment)},
            sort_keys=True,
        ).encode()
        region, key = _region_for(head.chain), _key(head.chain, head.seq, head.hash)
        if not (isinstance(store, S3Store) and _put_locked(store, region, key, body, moment)):
            store.put(region=region, key=key, stream=io.BytesIO(body), max_bytes=MAX_ANCHOR_BYTES)
        counts["anchored"] += 1
    return counts


def _put_locked(store: S3Store, region: str, key: str, body: bytes, moment: datetime) -> bool:
    """Writes the anchor under S3 Object Lock (compliance mode) when the region's bucket has it
    enabled; False when it has not (the caller then writes it plainly)."""
    from botocore.exceptions import ClientError

    client, bucket = store._client(region), store._bucket(region)
    try:
        config = client.get_object_lock_configuration(Bucket=bucket).get("ObjectLockConfiguration", {})
    except ClientError:
        return False  # no Object Lock on this bucket (or the store does not implement it)
    if config.get("ObjectLockEnabled") != "Enabled":
        return False
    kms = store.kms_keys.get(region)
    encryption = (
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms} if kms else {"ServerSideEncryption": "AES256"}
    )
    try:
        client.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            ObjectLockMode="COMPLIANCE",
            ObjectLockRetainUntilDate=moment
            + timedelta(days=settings.COMPLIANCE_AUDIT_ANCHOR_RETENTION_DAYS),
            ChecksumAlgorithm="SHA256",
            **encryption,
        )
    except ClientError as exc:
        raise StorageError(
            f"could not write the audit anchor in region {region!r}: {type(exc).__name__}"
        ) from exc
    return True
