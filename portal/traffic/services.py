"""Writes of the traffic app: accept an upload, read and profile it, delete it.

Privacy: the uploaded file is copied to a private staging folder, read once by the ingest task
(which keeps numbers only: counts, arrival times, salted block hashes) and deleted whatever the
outcome. Task messages carry the sample id only; errors carry a line number and a problem,
never file content.
"""

from __future__ import annotations

import logging
import os
import secrets
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from compliance import services as compliance
from compliance.holders import DataHolder, RetentionCutoffs
from compliance.models import StoredObject
from compliance.services import audit_record
from portal import leases
from portal.accounts.models import Organization, Role, User
from portal.accounts.services import require_role
from portal.outbox.services import outbox_enqueue
from portal.traffic import raw_uploads
from portal.traffic.models import TrafficSample
from tuning.workload.errors import TraceError
from tuning.workload.ingest import IngestLimits, IngestResult, ingest
from tuning.workload.synth import SyntheticTrace, write_mooncake_jsonl

logger = logging.getLogger(__name__)
_PROGRESS_EVERY_BYTES = 4 << 20


def _staging_dir() -> Path:
    path = Path(settings.TRAFFIC_STAGING_DIR)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def traffic_sample_create(
    *,
    actor: User,
    organization: Organization,
    name: str,
    upload: UploadedFile,
    trace_format: str = "auto",
    contains_phi: bool = False,
) -> TrafficSample:
    require_role(actor=actor, organization=organization, minimum=Role.MEMBER, doing="upload traffic samples")
    name = (name or "").strip()
    errors: dict[str, str] = {}
    if not name:
        errors["name"] = "Name the sample."
    elif len(name) > 120:
        errors["name"] = "Use at most 120 characters."
    if trace_format not in TrafficSample.Format.values:
        errors["trace_format"] = f"Choose one of: {', '.join(TrafficSample.Format.values)}."
    if upload.size is not None and upload.size > settings.TRAFFIC_UPLOAD_MAX_BYTES:
        errors["file"] = f"The file is larger than the limit of {settings.TRAFFIC_UPLOAD_MAX_BYTES:,} bytes."
    elif not upload.size:
        errors["file"] = "The file is empty."
    if errors:
        raise ValidationError(errors)
    # Compliance, before a byte is written: the BAA rule (PHI) and the data-residency rule.
    compliance.upload_admit(organization=organization, contains_phi=contains_phi)

    sample = TrafficSample(
        organization=organization,
        name=name,
        requested_format=trace_format,
        size_bytes=upload.size or 0,
        created_by=actor,
    )
    # The raw upload goes to object storage in the region the organization's residency policy
    # chooses (encrypted), before the row exists; removed if the transaction fails: never a row
    # without its file, and no file left behind by a failed request.
    sample.staging_name = raw_uploads.sample_upload_store(
        actor=actor,
        organization=organization,
        sample_id=str(sample.id),
        upload=upload,
        contains_phi=contains_phi,
    )
    try:
        with transaction.atomic():
            sample.save()
            audit_record(
                actor=actor,
                organization=organization,
                action="traffic_sample.upload",
                target=sample,
                data={"name": name, "size_bytes": sample.size_bytes, "format": trace_format},
            )
            # Sent after the commit, or by the outbox's beat if the broker is down then: the
            # sample stays queued with its stored upload, never lost.
            _ingest_enqueue(sample)
    except Exception:
        raw_uploads.sample_upload_discard(reference=sample.staging_name)
        raise
    return sample


INGEST_TASK = "portal.traffic.tasks.traffic_sample_ingest"


def _ingest_enqueue(sample: TrafficSample) -> None:
    """Records the sample's ingest in the task outbox, inside the caller's transaction: one
    message per claim (`ingest_attempts` so far), so a recovered sample is sent again once."""
    outbox_enqueue(
        task=INGEST_TASK,
        kwargs={"sample_id": str(sample.id)},
        key=f"traffic_sample.ingest:{sample.id}:{sample.ingest_attempts}",
    )


def _ingest_limits() -> IngestLimits:
    return IngestLimits(
        max_bytes=settings.TRAFFIC_MAX_DECOMPRESSED_BYTES,
        max_line_bytes=settings.TRAFFIC_MAX_LINE_BYTES,
        max_lines=settings.TRAFFIC_MAX_LINES,
        max_blank_lines=settings.TRAFFIC_MAX_BLANK_LINES,
        max_seconds=float(settings.TRAFFIC_INGEST_MAX_S),
    )


def _decrypted_copies(sample_id: object) -> list[Path]:
    """Decrypted copies of a sample's upload in the staging folder (`<id>.<random>.upload`)."""
    root = Path(settings.TRAFFIC_STAGING_DIR)
    return sorted(root.glob(f"{sample_id}.*.upload")) if root.is_dir() else []


def traffic_samples_recover(*, now: datetime | None = None) -> list[str]:
    """Samples left "validating" by an ingest whose worker died (killed, out of memory, time
    limit): their decrypted copies are removed, and each is queued again, or failed after
    TRAFFIC_INGEST_MAX_ATTEMPTS claims (a file that kills every worker reading it). Returns the
    ids queued again (their ingest recorded in the task outbox with the requeue)."""
    now = now or timezone.now()
    stuck = TrafficSample.objects.select_related("organization").filter(
        leases.free_or_stale(settings.TRAFFIC_INGEST_LEASE_S, now), status=TrafficSample.Status.VALIDATING
    )
    requeued = []
    for sample in stuck:
        for path in _decrypted_copies(sample.id):
            path.unlink(missing_ok=True)
        # Conditional on the lease seen: an ingest that took it again meanwhile keeps it.
        claim = TrafficSample.objects.filter(
            id=sample.id,
            status=TrafficSample.Status.VALIDATING,
            lease_owner=sample.lease_owner,
            lease_heartbeat_at=sample.lease_heartbeat_at,
        )
        if sample.ingest_attempts < settings.TRAFFIC_INGEST_MAX_ATTEMPTS:
            with transaction.atomic():
                if claim.update(status=TrafficSample.Status.QUEUED, progress_bytes=0, **leases.FREE):
                    _ingest_enqueue(sample)
                    audit_record(
                        actor=None,
                        organization=sample.organization,
                        action="traffic_sample.recovered",
                        target=sample,
                        data={"attempts": sample.ingest_attempts},
                    )
                    requeued.append(str(sample.id))
            continue
        with transaction.atomic():
            failed = claim.update(
                status=TrafficSample.Status.FAILED,
                error=(
                    f"Reading the file stopped {sample.ingest_attempts} times without finishing; "
                    "upload a smaller or simpler sample."
                ),
                staging_name="",
                finished_at=now,
                **leases.FREE,
            )
            if failed:
                audit_record(
                    actor=None,
                    organization=sample.organization,
                    action="traffic_sample.failed",
                    target=sample,
                )
        if failed and raw_uploads.is_object_reference(sample.staging_name):
            raw_uploads.sample_upload_release(organization=sample.organization, reference=sample.staging_name)
    if requeued:
        logger.warning("traffic samples %s: their ingest died; queued again", ", ".join(requeued))
    return requeued


def traffic_sample_ingest(*, sample_id: str, owner: str | None = None) -> str:
    """Validates and profiles one queued sample. Idempotent: only a queued sample is claimed,
    under a lease held by `owner` (the task's id) and kept fresh while the file is read.

    Returns the sample's final status ("skipped" when another worker had it, "lease-lost" when
    this one was taken for dead meanwhile and its result dropped).
    """
    owner = owner or f"ingest-{uuid.uuid4()}"
    row = TrafficSample.objects.filter(id=sample_id)
    claimed = leases.take(
        row.filter(status=TrafficSample.Status.QUEUED),
        owner,
        lease_s=settings.TRAFFIC_INGEST_LEASE_S,
        status=TrafficSample.Status.VALIDATING,
        progress_bytes=0,
        ingest_attempts=F("ingest_attempts") + 1,
    )
    if not claimed:
        return "skipped"
    return leases.hold(
        row,
        owner,
        lambda: _ingest_claimed(sample_id, owner),
        every_s=settings.TRAFFIC_INGEST_LEASE_S / 4,
        name=f"ingest-{sample_id}",
    )


def _ingest_claimed(sample_id: str, owner: str) -> str:
    sample = TrafficSample.objects.select_related("organization").get(id=sample_id)
    last_reported = 0

    def progress(read_bytes: int) -> None:
        nonlocal last_reported
        if read_bytes - last_reported >= _PROGRESS_EVERY_BYTES:
            last_reported = read_bytes
            TrafficSample.objects.filter(id=sample_id).update(progress_bytes=read_bytes)

    path = _staging_dir() / sample.staging_name
    updates: dict[str, Any]
    try:
        if raw_uploads.is_object_reference(sample.staging_name):
            # Decrypted into the private staging folder for the one read, removed in `finally`
            # (a worker killed before that leaves it to `traffic_samples_recover` and the sweep).
            path = _staging_dir() / f"{sample.id}.{secrets.token_hex(8)}.upload"
            with open(path, "wb") as out:
                os.fchmod(out.fileno(), 0o600)
                if not raw_uploads.sample_upload_fetch(reference=sample.staging_name, target=out):
                    path.unlink()
        with open(path, "rb") as stream:
            result = ingest(
                stream,
                trace_format=sample.requested_format,
                salt=bytes.fromhex(sample.organization.prefix_salt),
                limits=_ingest_limits(),
                progress=progress,
                keep_blocks=True,
            )
        _write_workload(sample, result)
        profile = result.profile.to_json_dict()
        updates = {
            "status": TrafficSample.Status.READY,
            "profile": profile,
            "charts": result.charts.to_json_dict(),
            "detected_format": str(profile.get("format", "")),
            "error": "",
        }
    except TraceError as exc:
        updates = {
            "status": TrafficSample.Status.FAILED,
            "error": exc.message,
            "profile": None,
            "charts": None,
        }
    except FileNotFoundError:
        updates = {
            "status": TrafficSample.Status.FAILED,
            "error": "The uploaded file was lost before it was read; upload it again.",
        }
    except Exception:
        # Logged without the exception text, which could quote the file.
        logger.error("traffic sample %s: ingest crashed", sample_id)
        updates = {
            "status": TrafficSample.Status.FAILED,
            "error": "Internal error while reading the file; our team was notified.",
        }
    finally:
        # The raw upload is not kept, unless the organization retains prompt text under a BAA.
        path.unlink(missing_ok=True)
        if raw_uploads.is_object_reference(sample.staging_name):
            raw_uploads.sample_upload_release(organization=sample.organization, reference=sample.staging_name)
    with transaction.atomic():
        row = TrafficSample.objects.filter(id=sample_id)
        if not leases.held(row, owner):
            logger.warning("traffic sample %s: %s lost its lease; its result is dropped", sample_id, owner)
            return "lease-lost"
        row.update(
            **updates,
            staging_name="",
            progress_bytes=sample.size_bytes,
            finished_at=timezone.now(),
            **leases.FREE,
        )
        audit_record(
            actor=None,
            organization=sample.organization,
            action=f"traffic_sample.{updates['status']}",
            target=sample,
        )
    return str(updates["status"])


def workload_path(sample: TrafficSample) -> Path:
    """The sample's requests as numbers only (arrival, lengths, prefix block ids), in Mooncake
    JSONL: what tuning jobs replay. Never any text."""
    return Path(settings.TRAFFIC_WORKLOAD_DIR) / f"{sample.id}.jsonl"


def _write_workload(sample: TrafficSample, result: IngestResult) -> None:
    columns = result.columns
    arrival_ms = (
        (columns.arrival_ns - columns.arrival_ns[0]) // 1_000_000
        if columns.num_requests
        else columns.arrival_ns
    )
    trace = SyntheticTrace(
        block_size_tokens=result.blocks.block_size_tokens if result.blocks is not None else 512,
        arrival_ms=arrival_ms,
        input_tokens=columns.input_tokens,
        output_tokens=columns.output_tokens,
        block_ids=result.blocks.ids if result.blocks is not None else None,
        block_offsets=result.blocks.offsets if result.blocks is not None else None,
    )
    target = workload_path(sample)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        write_mooncake_jsonl(trace, out)
    tmp.replace(target)


def workloads_sweep(*, older_than: timedelta = timedelta(hours=1), now: datetime | None = None) -> list[str]:
    """Remove workload files that no sample owns, once older than `older_than` (a write still in
    flight is younger). A worker killed between writing a sample's workload and committing its
    row leaves such a file; nothing refers to it. Returns the names removed."""
    root = Path(settings.TRAFFIC_WORKLOAD_DIR)
    if not root.is_dir():
        return []
    cutoff = (now or timezone.now()).timestamp() - older_than.total_seconds()
    by_sample: dict[str, list[Path]] = {}
    for path in root.iterdir():
        if not path.is_file() or path.suffix not in (".jsonl", ".tmp") or path.stat().st_mtime >= cutoff:
            continue
        try:
            sample_id = str(uuid.UUID(path.name.split(".", 1)[0]))
        except ValueError:
            continue  # not named like a workload: not ours to remove
        by_sample.setdefault(sample_id, []).append(path)
    owned = {
        str(i) for i in TrafficSample.objects.filter(id__in=list(by_sample)).values_list("id", flat=True)
    }
    removed = []
    for sample_id, paths in sorted(by_sample.items()):
        if sample_id not in owned:
            for path in paths:
                path.unlink(missing_ok=True)
                removed.append(path.name)
    if removed:
        logger.warning("removed %d workload files no sample owns: %s", len(removed), ", ".join(removed[:10]))
    return removed


def staging_sweep(*, now: datetime | None = None) -> list[str]:
    """Remove decrypted uploads from the staging folder that no live ingest is reading: the
    sample is gone, finished, queued again, or has been validating for longer than an ingest
    may take. An ingest removes its copy in a `finally`; a worker killed mid-read cannot, which
    for a PHI upload would leave plaintext on disk. Returns the names removed."""
    root = Path(settings.TRAFFIC_STAGING_DIR)
    if not root.is_dir():
        return []
    by_sample: dict[str, list[Path]] = {}
    for path in root.glob("*.*.upload"):
        try:
            sample_id = str(uuid.UUID(path.name.split(".", 1)[0]))
        except ValueError:
            continue  # not named like a decrypted copy: not ours to remove
        by_sample.setdefault(sample_id, []).append(path)
    reading = {
        str(i)
        for i in TrafficSample.objects.filter(id__in=list(by_sample), status=TrafficSample.Status.VALIDATING)
        .exclude(leases.free_or_stale(settings.TRAFFIC_INGEST_LEASE_S, now))
        .values_list("id", flat=True)
    }
    removed = []
    for sample_id, paths in sorted(by_sample.items()):
        if sample_id not in reading:
            for path in paths:
                path.unlink(missing_ok=True)
                removed.append(path.name)
    if removed:
        logger.warning("removed %d decrypted uploads no ingest is reading", len(removed))
    return removed


def traffic_sample_delete(*, actor: User, sample: TrafficSample) -> None:
    require_role(
        actor=actor, organization=sample.organization, minimum=Role.MEMBER, doing="delete traffic samples"
    )
    # A tuning job keeps its sample (its workload and its record; the key is PROTECT). Refused
    # before anything is removed, so the stored upload stays too.
    jobs = list(sample.tuning_jobs.order_by("created_at").values_list("name", flat=True))
    if jobs:
        names = ", ".join(repr(name) for name in jobs[:3])
        more = f" and {len(jobs) - 3} more" if len(jobs) > 3 else ""
        raise ValidationError(f"Tuning jobs use this sample ({names}{more}); it is kept as their workload.")
    raw_uploads.sample_objects_delete(actor=actor, sample=sample)
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=sample.organization,
            action="traffic_sample.delete",
            target=sample,
            data={"name": sample.name},
        )
        staging = sample.staging_name
        # Named before the delete: Django clears the primary key of a deleted row.
        workload, sample_id = workload_path(sample), sample.id
        sample.delete()
    if staging and not raw_uploads.is_object_reference(staging):
        (_staging_dir() / staging).unlink(missing_ok=True)
    # A decrypted copy a killed ingest left behind (plaintext for a PHI upload) goes too.
    for path in _decrypted_copies(sample_id):
        path.unlink(missing_ok=True)
    workload.unlink(missing_ok=True)


def traffic_sample_from_workload(*, organization: Organization, name: str, path: Path) -> TrafficSample:
    """A ready sample from a numbers-only Mooncake JSONL the platform wrote itself (the
    continual loop's live-like traffic). No user uploads it and it holds no text."""
    with open(path, "rb") as stream:
        result = ingest(
            stream,
            trace_format="mooncake",
            salt=bytes.fromhex(organization.prefix_salt),
            limits=_ingest_limits(),
            keep_blocks=True,
        )
    profile = result.profile.to_json_dict()
    with transaction.atomic():
        sample = TrafficSample.objects.create(
            organization=organization,
            name=name[:120],
            requested_format=TrafficSample.Format.MOONCAKE,
            detected_format=str(profile.get("format", "")),
            status=TrafficSample.Status.READY,
            size_bytes=path.stat().st_size,
            progress_bytes=path.stat().st_size,
            profile=profile,
            charts=result.charts.to_json_dict(),
            finished_at=timezone.now(),
        )
        _write_workload(sample, result)
        audit_record(
            actor=None, organization=organization, action="traffic_sample.synthesized", target=sample
        )
    return sample


# --- Retention and organization deletion (registered with compliance.holders) ------------------


def _sample_files_remove(sample: TrafficSample) -> None:
    if sample.staging_name:
        (Path(settings.TRAFFIC_STAGING_DIR) / sample.staging_name).unlink(missing_ok=True)
    workload_path(sample).unlink(missing_ok=True)


def traffic_retention_expire(organization: Organization, cutoffs: RetentionCutoffs) -> dict[str, int]:
    """Samples past retention: their stored objects in every region and their files go; their
    rows go too unless a tuning job still refers to them (the job's record keeps its sample)."""
    counts = {"samples": 0, "objects": 0}
    days = cutoffs.sample_days
    for sample in TrafficSample.objects.filter(organization=organization, created_at__lt=cutoffs.samples):
        for obj in StoredObject.objects.filter(organization=organization, owner_id=str(sample.pk)):
            compliance.sensitive_object_delete(actor=None, obj=obj, reason=f"retention ({days} days)")
            counts["objects"] += 1
        _sample_files_remove(sample)
        with transaction.atomic():
            in_use = sample.tuning_jobs.exists()
            audit_record(
                actor=None,
                organization=organization,
                action="retention.sample_delete",
                target=sample,
                data={"retention_days": days, "row_kept_for_jobs": in_use},
            )
            if not in_use:
                sample.delete()
        counts["samples"] += 1
    return counts


def traffic_files_remove(organization: Organization) -> None:
    for sample in TrafficSample.objects.filter(organization=organization):
        _sample_files_remove(sample)


def traffic_count(organization: Organization) -> dict[str, int]:
    return {"samples": TrafficSample.objects.filter(organization=organization).count()}


TRAFFIC_HOLDER = DataHolder(
    name="traffic",
    order=30,
    counts=("samples",),
    expire=traffic_retention_expire,
    remove_files=traffic_files_remove,
    count=traffic_count,
)
