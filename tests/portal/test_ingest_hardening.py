"""Issue 27, findings 3 and 6: gzip "newline bombs" are refused quickly (caps on lines and blank
lines, a wall-clock limit), and a killed ingest neither leaves its decrypted upload in staging
nor stays "validating" forever."""

from __future__ import annotations

import gzip
import importlib
import io
import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from compliance.models import AuditEvent
from portal.outbox.models import OutboxMessage
from portal.traffic import services
from portal.traffic.models import TrafficSample
from tuning.workload.errors import TraceError
from tuning.workload.ingest import IngestLimits, ingest

# The module (the package re-exports its `ingest` function under the same name).
ingest_module = importlib.import_module("tuning.workload.ingest")

MOONCAKE_LINE = b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'


def _mooncake(n: int) -> bytes:
    return b"".join(
        b'{"timestamp": %d, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n' % (i * 1000)
        for i in range(n)
    )


def _newline_bomb(megabytes: int) -> bytes:
    """A small gzip that decompresses to `megabytes` MiB of line breaks after one valid line."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
        gz.write(MOONCAKE_LINE)
        chunk = b"\n" * (1 << 20)
        for _ in range(megabytes):
            gz.write(chunk)
    return out.getvalue()


def test_newline_bomb_stops_at_the_blank_line_cap() -> None:
    bomb = _newline_bomb(8)
    assert len(bomb) < 64 << 10  # kilobytes on the wire, megabytes of blank lines
    with pytest.raises(TraceError, match="blank lines allowed"):
        ingest(io.BytesIO(bomb), trace_format="auto", limits=IngestLimits(max_blank_lines=1000))
    # A few blank lines are fine.
    result = ingest(
        io.BytesIO(_mooncake(1) + b"\n\n" + _mooncake(2)[len(_mooncake(1)) :]),
        limits=IngestLimits(max_blank_lines=1000),
    )
    assert result.profile.num_requests == 2


def test_line_cap() -> None:
    data = _mooncake(50)
    with pytest.raises(TraceError, match="more than the 20 lines allowed") as caught:
        ingest(io.BytesIO(data), trace_format="mooncake", limits=IngestLimits(max_lines=20))
    assert caught.value.line == 21
    assert ingest(io.BytesIO(data), limits=IngestLimits(max_lines=50)).profile.num_requests == 50


def test_wall_clock_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock that jumps a minute at each look: the second look is past a 30 s limit.
    ticks = itertools.count(step=60.0)
    monkeypatch.setattr(ingest_module, "_clock", lambda: float(next(ticks)))
    with pytest.raises(TraceError, match="longer than the 30 s limit"):
        ingest(io.BytesIO(_mooncake(10)), limits=IngestLimits(max_seconds=30.0))


def _sample(alice, alice_org, data: bytes, name: str = "bomb") -> TrafficSample:  # type: ignore[no-untyped-def]
    upload = SimpleUploadedFile(f"{name}.jsonl.gz", data, content_type="application/gzip")
    return services.traffic_sample_create(actor=alice, organization=alice_org, name=name, upload=upload)


@pytest.mark.django_db
def test_uploaded_newline_bomb_fails_with_a_clear_error(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_MAX_BLANK_LINES = 1000
    sample = _sample(alice, alice_org, _newline_bomb(4))
    assert services.traffic_sample_ingest(sample_id=str(sample.id)) == TrafficSample.Status.FAILED
    sample.refresh_from_db()
    assert "blank lines allowed" in sample.error
    assert not list(Path(settings.TRAFFIC_STAGING_DIR).glob("*.upload"))


def _staging_copies(settings) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(p.name for p in Path(settings.TRAFFIC_STAGING_DIR).glob("*.upload"))


@pytest.mark.django_db
def test_a_failing_fetch_leaves_no_decrypted_copy(alice, alice_org, settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The storage read dies half-way (after plaintext was written): the copy is still removed
    and the sample fails instead of staying "validating"."""
    sample = _sample(alice, alice_org, _mooncake(3))

    def half_fetch(*, reference: str, target) -> bool:  # type: ignore[no-untyped-def]
        target.write(b"plaintext prompt")
        target.flush()
        raise RuntimeError("storage connection reset")

    monkeypatch.setattr(services.raw_uploads, "sample_upload_fetch", half_fetch)
    assert services.traffic_sample_ingest(sample_id=str(sample.id)) == TrafficSample.Status.FAILED
    assert _staging_copies(settings) == []


def _killed_mid_read(sample: TrafficSample, settings, *, attempts: int = 1) -> Path:  # type: ignore[no-untyped-def]
    """What `kill -9` during the read leaves: the sample validating under an old claim, and the
    decrypted upload in staging."""
    TrafficSample.objects.filter(id=sample.id).update(
        status=TrafficSample.Status.VALIDATING,
        lease_owner="killed-worker",
        lease_heartbeat_at=timezone.now() - timedelta(hours=2),
        ingest_attempts=attempts,
    )
    staging = Path(settings.TRAFFIC_STAGING_DIR)
    staging.mkdir(parents=True, exist_ok=True)
    copy = staging / f"{sample.id}.0123456789abcdef.upload"
    copy.write_bytes(b"decrypted PHI prompt text")
    return copy


@pytest.mark.django_db
def test_killed_ingest_is_recovered_and_its_plaintext_removed(  # type: ignore[no-untyped-def]
    alice, alice_org, settings, django_capture_on_commit_callbacks
) -> None:
    sample = _sample(alice, alice_org, _mooncake(3))
    copy = _killed_mid_read(sample, settings)
    # The redelivered message finds the sample claimed and skips it: it was stuck for good.
    assert services.traffic_sample_ingest(sample_id=str(sample.id)) == "skipped"

    # The beat (`redispatch`, through the traffic app's recoverer) recovers it: the copy goes, and the ingest is recorded again in the
    # task outbox with the requeue (one message per claim), sent after the commit (eager here).
    with django_capture_on_commit_callbacks(execute=True):
        assert len(services.traffic_samples_recover()) == 1
    messages = OutboxMessage.objects.filter(task=services.INGEST_TASK).order_by("id")
    assert [m.key for m in messages] == [
        f"traffic_sample.ingest:{sample.id}:0",
        f"traffic_sample.ingest:{sample.id}:1",
    ]
    assert all(m.kwargs == {"sample_id": str(sample.id)} for m in messages)
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    assert sample.ingest_attempts == 2
    assert not copy.exists() and _staging_copies(settings) == []
    assert AuditEvent.objects.filter(action="traffic_sample.recovered", target_id=str(sample.id)).exists()


@pytest.mark.django_db
def test_a_sample_that_kills_every_worker_fails_after_the_attempts(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_INGEST_MAX_ATTEMPTS = 3
    sample = _sample(alice, alice_org, _mooncake(3))
    copy = _killed_mid_read(sample, settings, attempts=3)
    assert services.traffic_samples_recover() == []
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.FAILED
    assert "stopped 3 times" in sample.error and sample.staging_name == ""
    assert not copy.exists()


@pytest.mark.django_db
def test_sweep_and_delete_remove_decrypted_copies_no_ingest_reads(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    stuck = _sample(alice, alice_org, _mooncake(3), name="stuck")
    stale_copy = _killed_mid_read(stuck, settings)
    live = _sample(alice, alice_org, _mooncake(3), name="live")
    TrafficSample.objects.filter(id=live.id).update(
        status=TrafficSample.Status.VALIDATING, lease_owner="live-worker", lease_heartbeat_at=timezone.now()
    )
    staging = Path(settings.TRAFFIC_STAGING_DIR)
    live_copy = staging / f"{live.id}.fedcba9876543210.upload"
    live_copy.write_bytes(b"being read")
    # An upload staged the old way (the sample's own `<id>.upload`) is the only copy: kept.
    legacy = staging / f"{live.id}.upload"
    legacy.write_bytes(b"legacy staging")
    unrelated = staging / "notes.txt.upload"
    unrelated.write_bytes(b"not ours")

    assert services.staging_sweep() == [stale_copy.name]
    assert live_copy.exists() and legacy.exists() and unrelated.exists()

    # Deleting a sample removes a copy a killed ingest left, even one the sweep has not reached.
    TrafficSample.objects.filter(id=live.id).update(status=TrafficSample.Status.FAILED)
    services.traffic_sample_delete(actor=alice, sample=TrafficSample.objects.get(id=live.id))
    assert not live_copy.exists()


@pytest.mark.django_db
def test_a_live_ingest_keeps_its_sample_and_one_taken_for_dead_drops_its_result(  # type: ignore[no-untyped-def]
    alice, alice_org, settings, monkeypatch
) -> None:
    sample = _sample(alice, alice_org, _mooncake(3))
    real_ingest = services.ingest

    def read_while_taken_over(*args, **kwargs):  # type: ignore[no-untyped-def]
        # Mid-read, the redispatch must leave a sample whose lease is fresh alone ...
        assert services.traffic_samples_recover() == []
        # ... and once another worker holds it (this one was taken for dead), this one's
        # result must not overwrite that worker's.
        TrafficSample.objects.filter(id=sample.id).update(
            lease_owner="successor", lease_heartbeat_at=timezone.now()
        )
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr(services, "ingest", read_while_taken_over)
    assert services.traffic_sample_ingest(sample_id=str(sample.id), owner="first") == "lease-lost"
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.VALIDATING and sample.lease_owner == "successor"
    assert sample.ingest_attempts == 1 and sample.profile is None
    assert _staging_copies(settings) == []
