"""The audit chains' external anchor (issue 27 finding 11). A database superuser truncates a
chain (deletes the newest events and moves the head back) or rewrites an event and re-hashes
everything after it: the chain alone still verifies, the anchor in the object store does not
agree, and verify_audit, the export and the next anchoring all say so."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from compliance import anchor, chain, services
from compliance.models import AuditChainHead, AuditEvent
from portal.accounts.models import Organization, User
from tests.compliance.conftest import moto_server, regions, s3_keys, s3_regions  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def _events(user: User, org: Organization, count: int) -> list[AuditEvent]:
    for n in range(count):
        services.audit_record(actor=user, organization=org, action="test.event", data={"n": n})
    return list(AuditEvent.objects.filter(chain=str(org.pk)).order_by("seq"))


def _as_superuser(sql: str, params: list[object]) -> None:
    """What someone with the database's superuser can do: switch the append-only guard off."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE compliance_auditevent DISABLE TRIGGER compliance_auditevent_append_only")
        cursor.execute(sql, params)


def _move_head(key: str, event: AuditEvent) -> None:
    AuditChainHead.objects.filter(chain=key).update(seq=event.seq, hash=event.hash)


def test_anchors_are_written_to_the_regions_object_store_once_per_move(
    s3_regions,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
) -> None:
    _events(alice, alice_org, 2)
    first = anchor.audit_anchor_write()
    assert first["anchored"] >= 1 and first["refused"] == 0
    key = str(alice_org.pk)
    keys = s3_keys(s3_regions, "us")
    assert any(k.startswith(f"{anchor.PREFIX}/{key}/") for k in keys)
    head = AuditChainHead.objects.get(chain=key)
    latest = anchor.latest_anchor(key)
    assert latest is not None and (latest.seq, latest.hash, latest.region) == (head.seq, head.hash, "us")
    again = anchor.audit_anchor_write()
    assert again["anchored"] == 0 and again["unchanged"] == first["anchored"]


def test_truncation_by_a_superuser_is_caught_by_the_anchor(
    s3_regions,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
) -> None:
    events = _events(alice, alice_org, 4)
    anchor.audit_anchor_write()
    key = str(alice_org.pk)
    anchored = anchor.latest_anchor(key)
    assert anchored is not None
    # Delete the newest events and move the head back to the last one kept.
    kept = events[1]
    _as_superuser("DELETE FROM compliance_auditevent WHERE chain = %s AND seq > %s", [key, kept.seq])
    _move_head(key, kept)
    assert services._verify_chain(key) is None  # the chain alone cannot tell
    (link,) = services.audit_verify(chain_key=key)
    assert link.seq == anchored.seq and "events were removed" in link.reason
    with pytest.raises(CommandError, match="events were removed"):
        call_command("verify_audit", chain=key)
    with pytest.raises(ValidationError, match="contradicts its external anchor"):
        services.audit_export(actor=alice, organization=alice_org, fmt="json")
    # The truncated chain is not anchored again, which would bless it.
    assert anchor.audit_anchor_write()["refused"] == 1
    assert anchor.latest_anchor(key) == anchored


def test_rewriting_and_rehashing_by_a_superuser_is_caught_by_the_anchor(
    s3_regions,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
) -> None:
    events = _events(alice, alice_org, 3)
    anchor.audit_anchor_write()
    key = str(alice_org.pk)
    # Rewrite the first test event and re-hash it and everything after it, head included.
    previous = AuditEvent.objects.get(chain=key, seq=events[0].seq - 1).hash if events[0].seq > 1 else None
    rows = list(AuditEvent.objects.filter(chain=key, seq__gte=events[0].seq).order_by("seq"))
    prev_hash = previous or chain.GENESIS_HASH
    for row in rows:
        if row.pk == events[0].pk:
            row.action = "forged"
        row.prev_hash = prev_hash
        row.hash = chain.event_hash({name: getattr(row, name) for name in chain.HASHED_FIELDS})
        _as_superuser(
            "UPDATE compliance_auditevent SET action = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [row.action, row.prev_hash, row.hash, row.pk],
        )
        prev_hash = row.hash
    _move_head(key, rows[-1])
    assert services._verify_chain(key) is None  # re-hashed: the chain alone verifies
    (link,) = services.audit_verify(chain_key=key)
    assert "rewritten" in link.reason
    with pytest.raises(ValidationError, match="rewritten"):
        services.audit_export(actor=alice, organization=alice_org, fmt="csv")


def test_an_intact_chain_exports_with_its_anchor(
    s3_regions,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
) -> None:
    import json

    _events(alice, alice_org, 2)
    anchor.audit_anchor_write()
    assert services.audit_verify() == []
    _name, body = services.audit_export(actor=alice, organization=alice_org, fmt="json")
    exported = json.loads(body)
    anchored = exported["anchor"]
    assert anchored is not None
    by_seq = {row["seq"]: row["hash"] for row in exported["events"]}
    assert by_seq[anchored["seq"]] == anchored["hash"]


def test_where_the_bucket_has_object_lock_anchors_are_locked(
    s3_regions,  # noqa: F811 (the fixture imported above)
    moto_server,  # noqa: F811
    alice: User,
    alice_org: Organization,
) -> None:
    import uuid

    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", region_name="us-east-2", endpoint_url=moto_server)
    bucket = f"tg-us-locked-{uuid.uuid4().hex[:8]}"
    client.create_bucket(
        Bucket=bucket,
        CreateBucketConfiguration={"LocationConstraint": "us-east-2"},
        ObjectLockEnabledForBucket=True,
    )
    s3_regions.COMPLIANCE_S3_BUCKETS = {**s3_regions.COMPLIANCE_S3_BUCKETS, "us": bucket}
    _events(alice, alice_org, 1)
    assert anchor.audit_anchor_write()["anchored"] >= 1
    key = str(alice_org.pk)
    latest = anchor.latest_anchor(key)
    assert latest is not None and latest.region == "us"
    name = anchor._key(key, latest.seq, latest.hash)
    head = client.head_object(Bucket=bucket, Key=name)
    assert head["ObjectLockMode"] == "COMPLIANCE" and head["ObjectLockRetainUntilDate"].year >= 2030
    # Not even the bucket's owner removes the locked version.
    with pytest.raises(ClientError):
        client.delete_object(Bucket=bucket, Key=name, VersionId=head["VersionId"])
    assert anchor.latest_anchor(key) == latest
