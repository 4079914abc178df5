"""Object storage: encrypted local folders and S3 (moto's server on loopback), one per region."""

from __future__ import annotations

import io
import os
from pathlib import Path

import boto3
import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from compliance import services
from compliance.models import AuditEvent, StoredObject
from compliance.storage import LocalStore, ObjectTooLarge, RegionNotAvailable, StorageError, get_store
from tests.compliance.helpers import s3_keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def local(regions) -> LocalStore:  # type: ignore[no-untyped-def]
    store = get_store()
    assert isinstance(store, LocalStore)
    return store


def _roundtrip(store, region: str, key: str) -> bytes:  # type: ignore[no-untyped-def]
    out = io.BytesIO()
    store.get(region=region, key=key, target=out)
    return out.getvalue()


def test_local_store_encrypts_and_roundtrips_multi_record_objects(local: LocalStore, regions) -> None:  # type: ignore[no-untyped-def]
    data = os.urandom(2_500_000) + b"patient said: chest pain" * 1000
    result = local.put(region="us", key="org/x/a", stream=io.BytesIO(data), max_bytes=10 << 20)
    assert result.size_bytes == len(data)
    raw = (regions.COMPLIANCE_STORAGE_DIR / "us" / "org/x/a").read_bytes()
    assert b"chest pain" not in raw
    assert _roundtrip(local, "us", "org/x/a") == data
    empty = local.put(region="eu", key="org/x/empty", stream=io.BytesIO(b""), max_bytes=10)
    assert empty.size_bytes == 0 and _roundtrip(local, "eu", "org/x/empty") == b""


def test_local_store_detects_tampering_swapping_and_truncation(local: LocalStore, regions) -> None:  # type: ignore[no-untyped-def]
    data = os.urandom(3_000_000)
    local.put(region="us", key="org/x/a", stream=io.BytesIO(data), max_bytes=10 << 20)
    local.put(region="us", key="org/x/b", stream=io.BytesIO(data), max_bytes=10 << 20)
    path = regions.COMPLIANCE_STORAGE_DIR / "us" / "org/x/a"
    original = path.read_bytes()
    flipped = bytearray(original)
    flipped[100] ^= 1
    path.write_bytes(bytes(flipped))
    with pytest.raises(StorageError, match="integrity"):
        _roundtrip(local, "us", "org/x/a")
    # A whole object moved under another name does not decrypt (records are bound to the name).
    path.write_bytes((regions.COMPLIANCE_STORAGE_DIR / "us" / "org/x/b").read_bytes())
    with pytest.raises(StorageError, match="integrity"):
        _roundtrip(local, "us", "org/x/a")
    assert _roundtrip(local, "us", "org/x/b") == data
    path.write_bytes(original)
    os.rename(path, regions.COMPLIANCE_STORAGE_DIR / "us" / "org/x/c")
    with pytest.raises(StorageError):
        _roundtrip(local, "us", "org/x/c")
    # Dropping the last record is caught: the record before it was not sealed as the last one.
    truncated = original[: 4 + 4 + 12 + (1 << 20) + 16]
    (regions.COMPLIANCE_STORAGE_DIR / "us" / "org/x/c").write_bytes(truncated)
    with pytest.raises(StorageError):
        _roundtrip(local, "us", "org/x/c")


def test_store_refuses_unknown_regions_bad_keys_and_large_objects(local: LocalStore, regions) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RegionNotAvailable):
        local.put(region="ap", key="org/x/a", stream=io.BytesIO(b"x"), max_bytes=10)
    with pytest.raises(StorageError, match="invalid object key"):
        local.put(region="us", key="../escape", stream=io.BytesIO(b"x"), max_bytes=10)
    with pytest.raises(ObjectTooLarge):
        local.put(region="us", key="org/x/big", stream=io.BytesIO(b"x" * 11), max_bytes=10)
    assert local.list_keys(region="us", prefix="") == []


def test_service_size_limit_is_checked_while_streaming(alice, alice_org, regions, settings) -> None:  # type: ignore[no-untyped-def]
    settings.COMPLIANCE_OBJECT_MAX_BYTES = 1000
    before = (StoredObject.objects.count(), AuditEvent.objects.count())
    upload = SimpleUploadedFile("big.pdf", b"x" * 5000)
    upload.size = 10  # a client that lies about the size is still stopped
    with pytest.raises(ValidationError, match="larger than the limit of 1,000 bytes"):
        services.sensitive_object_store(
            actor=alice, organization=alice_org, kind="baa_document", stream=upload
        )
    assert (StoredObject.objects.count(), AuditEvent.objects.count()) == before
    assert get_store().list_keys(region="us", prefix="") == []


# --- S3 on a real S3-compatible server (moto, loopback) ---------------------------------------


def test_s3_store_roundtrip_with_server_side_encryption(alice, alice_org, s3_regions) -> None:  # type: ignore[no-untyped-def]
    obj = services.sensitive_object_store(
        actor=alice, organization=alice_org, kind="baa_document", stream=io.BytesIO(b"%PDF signed")
    )
    assert obj.region == "us"
    assert s3_keys(s3_regions, "us") == [obj.key] and s3_keys(s3_regions, "eu") == []
    client = boto3.client("s3", region_name="us-east-2", endpoint_url=s3_regions.COMPLIANCE_S3_ENDPOINT_URL)
    head = client.head_object(Bucket=s3_regions.COMPLIANCE_S3_BUCKETS["us"], Key=obj.key)
    assert head["ServerSideEncryption"] == "AES256"
    out = io.BytesIO()
    services.sensitive_object_read(obj=obj, target=out)
    assert out.getvalue() == b"%PDF signed"


def test_s3_uses_sse_kms_where_configured(alice, alice_org, s3_regions) -> None:  # type: ignore[no-untyped-def]
    kms = boto3.client("kms", region_name="us-east-2", endpoint_url=s3_regions.COMPLIANCE_S3_ENDPOINT_URL)
    key_id = kms.create_key(Description="tailguard us")["KeyMetadata"]["KeyId"]
    s3_regions.COMPLIANCE_S3_KMS_KEYS = {"us": key_id}
    obj = services.sensitive_object_store(
        actor=alice, organization=alice_org, kind="baa_document", stream=io.BytesIO(b"%PDF")
    )
    client = boto3.client("s3", region_name="us-east-2", endpoint_url=s3_regions.COMPLIANCE_S3_ENDPOINT_URL)
    head = client.head_object(Bucket=s3_regions.COMPLIANCE_S3_BUCKETS["us"], Key=obj.key)
    assert head["ServerSideEncryption"] == "aws:kms"
    assert key_id in head["SSEKMSKeyId"]


def test_s3_size_limit_and_region_rules_are_the_applications(alice, alice_org, s3_regions) -> None:  # type: ignore[no-untyped-def]
    s3_regions.COMPLIANCE_OBJECT_MAX_BYTES = 100
    with pytest.raises(ValidationError, match="larger than the limit"):
        services.sensitive_object_store(
            actor=alice, organization=alice_org, kind="baa_document", stream=io.BytesIO(b"x" * 10_000)
        )
    assert s3_keys(s3_regions, "us") == []
    # A "us" bucket that actually lives in Europe is refused before anything is written.
    s3_regions.COMPLIANCE_S3_BUCKETS = {
        **s3_regions.COMPLIANCE_S3_BUCKETS,
        "us": s3_regions.COMPLIANCE_S3_BUCKETS["eu"],
    }
    s3_regions.COMPLIANCE_OBJECT_MAX_BYTES = 10_000
    with pytest.raises(ValidationError, match="is in 'eu-central-1', not 'us-east-2'"):
        services.sensitive_object_store(
            actor=alice, organization=alice_org, kind="baa_document", stream=io.BytesIO(b"x")
        )
    assert s3_keys(s3_regions, "eu") == []
    assert not StoredObject.objects.exists()


def test_upload_to_s3_then_ingest_reads_it_and_deletes_it(
    alice, alice_org, s3_regions, shared_traces: Path
) -> None:  # type: ignore[no-untyped-def]
    from django.test import TestCase

    from portal.traffic import services as traffic_services
    from portal.traffic.models import TrafficSample

    with TestCase.captureOnCommitCallbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="m",
            upload=SimpleUploadedFile("m.jsonl", (shared_traces / "mooncake_synthetic.jsonl").read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    assert s3_keys(s3_regions, "us") == [] and s3_keys(s3_regions, "eu") == []
    assert not any(Path(s3_regions.TRAFFIC_STAGING_DIR).iterdir())
    actions = list(
        AuditEvent.objects.filter(organization=alice_org).order_by("seq").values_list("action", flat=True)
    )
    assert actions[-4:] == ["object.store", "traffic_sample.upload", "object.delete", "traffic_sample.ready"]
