"""Traffic samples in the portal: upload → background validation → profile page and API."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts.models import Organization, User
from portal.outbox.models import OutboxMessage
from portal.plotting import PLOTLY_JS
from portal.traffic.models import TrafficSample
from tuning.workload.ingest import ingest_path

pytestmark = pytest.mark.django_db


def _upload(client: Client, path: Path, name: str = "sample", trace_format: str = "auto", capture=None):  # type: ignore[no-untyped-def]
    with path.open("rb") as fh, capture(execute=True):
        return client.post(reverse("traffic:list"), {"name": name, "trace_format": trace_format, "file": fh})


@pytest.mark.parametrize("trace", ["azure2023_conv.csv", "mooncake_synthetic.jsonl"])
def test_shared_trace_upload_gives_the_library_profile(
    alice_client: Client,
    shared_traces: Path,
    trace: str,
    django_capture_on_commit_callbacks,
    settings,
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    response = _upload(alice_client, shared_traces / trace, capture=django_capture_on_commit_callbacks)
    assert response.status_code == 302
    sample = TrafficSample.objects.get()
    assert sample.status == TrafficSample.Status.READY, sample.error
    expected = ingest_path(shared_traces / trace).profile.to_json_dict()
    for key in ("num_requests", "duration_s", "input_tokens", "output_tokens", "arrival"):
        assert sample.profile[key] == expected[key]
    assert sample.profile["prefix"]["reuse_ratio"] == expected["prefix"]["reuse_ratio"]
    # The raw file is gone once read.
    assert not any((tmp_path / "staging").iterdir())
    page = alice_client.get(reverse("traffic:detail", args=[sample.id]))
    assert page.status_code == 200
    figures = json.loads(re.search(rb'id="plotly-figures"[^>]*>(.*?)</script>', page.content, re.S)[1])
    ids = [f["id"] for f in figures]
    assert "chart-arrival" in ids and "chart-concurrency" in ids
    assert ("chart-reuse" in ids) == (trace.startswith("mooncake"))
    assert f'<script src="{static(PLOTLY_JS)}">'.encode() in page.content  # the vendored bundle


def test_bad_file_is_rejected_whole_with_the_line(
    alice_client: Client, tmp_path: Path, django_capture_on_commit_callbacks, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,12,3\n"
        "2023-11-16 18:15:47.1,-4,2\n"
    )
    _upload(alice_client, bad, capture=django_capture_on_commit_callbacks)
    sample = TrafficSample.objects.get()
    assert sample.status == TrafficSample.Status.FAILED
    assert sample.error.startswith("line 3:")
    assert sample.profile is None and sample.charts is None
    page = alice_client.get(reverse("traffic:detail", args=[sample.id]))
    assert b"line 3:" in page.content
    assert not any((tmp_path / "staging").iterdir())


def test_prompt_text_is_kept_nowhere(
    alice_client: Client, tmp_path: Path, django_capture_on_commit_callbacks, settings, caplog
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    marker = "PATIENT-MARKER-7f3a9c"
    log = tmp_path / "openai.jsonl"
    lines = [
        json.dumps(
            {
                "timestamp": 1_700_000_000 + i,
                "model": "llama",
                "messages": [{"role": "user", "content": f"{marker} my chest hurts, request {i}"}],
                "completion": f"{marker} please call your doctor",
            }
        )
        for i in range(20)
    ]
    lines.append('{"timestamp": 1700000100, "model": "llama", "messages": "' + marker + '"')  # truncated line
    log.write_text("\n".join(lines) + "\n")
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(gzip.compress(("\n".join(lines[:-1]) + "\n").encode()))
    with caplog.at_level(logging.DEBUG):
        _upload(alice_client, log, name="bad", capture=django_capture_on_commit_callbacks)
        _upload(alice_client, good, name="good", capture=django_capture_on_commit_callbacks)
    statuses = dict(TrafficSample.objects.values_list("name", "status"))
    assert statuses == {"bad": "failed", "good": "ready"}
    # The task messages (recorded in the outbox, then sent) carried the sample ids only.
    messages = OutboxMessage.objects.filter(task="portal.traffic.tasks.traffic_sample_ingest")
    assert sorted(m.kwargs["sample_id"] for m in messages) == sorted(
        str(i) for i in TrafficSample.objects.values_list("id", flat=True)
    )
    assert all(list(m.kwargs) == ["sample_id"] and m.status == OutboxMessage.Status.SENT for m in messages)
    # Not in the database (every table, every text column), the logs, or the error shown.
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')  # noqa: S608 (table names come from the schema)
            assert marker not in repr(cursor.fetchall()), table
    assert marker not in caplog.text
    assert not any((tmp_path / "staging").iterdir())
    good_sample = TrafficSample.objects.get(name="good")
    assert good_sample.profile["num_requests"] == 20
    assert good_sample.profile["tokenizer"]


def test_too_large_upload_is_refused_while_streaming(
    alice_client: Client, tmp_path: Path, settings, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_UPLOAD_MAX_BYTES = 1000
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    big = tmp_path / "big.csv"
    big.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,12,3\n" * 200)
    response = _upload(alice_client, big, capture=django_capture_on_commit_callbacks)
    assert response.status_code == 413
    assert b"larger than the limit of 1,000 bytes" in response.content
    assert not TrafficSample.objects.exists()
    api = APIClient()
    api.force_login(User.objects.get(email="alice@acme.test"))
    with big.open("rb") as fh:
        response = api.post("/api/v1/traffic-samples/", {"name": "x", "file": fh}, format="multipart")
    assert response.status_code == 400
    assert "larger than the limit" in response.json()["file"][0]
    assert not TrafficSample.objects.exists()


def test_empty_and_missing_fields_are_named(alice_client: Client) -> None:
    response = alice_client.post(
        reverse("traffic:list"), {"name": "", "file": SimpleUploadedFile("empty.csv", b"")}
    )
    assert response.status_code == 400
    assert b'data-field="name"' in response.content
    assert b'data-field="file"' in response.content
    assert not TrafficSample.objects.exists()


def test_api_upload_and_poll(
    alice, shared_traces: Path, django_capture_on_commit_callbacks, settings, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    api = APIClient()
    api.force_login(alice)
    with (
        (shared_traces / "mooncake_synthetic.jsonl").open("rb") as fh,
        django_capture_on_commit_callbacks(execute=True),
    ):
        created = api.post(
            "/api/v1/traffic-samples/",
            {"name": "mc", "trace_format": "mooncake", "file": fh},
            format="multipart",
        )
    assert created.status_code == 201
    detail = api.get(f"/api/v1/traffic-samples/{created.json()['id']}/").json()
    assert detail["status"] == "ready"
    assert detail["profile"]["num_requests"] == 3993
    response = api.post(
        "/api/v1/traffic-samples/", {"name": "x", "trace_format": "parquet"}, format="multipart"
    )
    assert response.status_code == 400
    assert {"trace_format", "file"} <= set(response.json())


def test_charlie_404_and_bob_403_on_samples(
    alice,
    alice_org: Organization,
    bob,
    charlie,
    shared_traces: Path,
    django_capture_on_commit_callbacks,
    settings,
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    alice_client = Client()
    alice_client.force_login(alice)
    _upload(alice_client, shared_traces / "azure2023_conv.csv", capture=django_capture_on_commit_callbacks)
    sample = TrafficSample.objects.get()
    before = (TrafficSample.objects.count(), AuditEvent.objects.count())
    charlie_client = Client()
    charlie_client.force_login(charlie)
    for name in ("traffic:detail", "traffic:status"):
        assert charlie_client.get(reverse(name, args=[sample.id])).status_code == 404
    assert charlie_client.post(reverse("traffic:delete", args=[sample.id])).status_code == 404
    charlie_api = APIClient()
    charlie_api.force_login(charlie)
    assert charlie_api.get(f"/api/v1/traffic-samples/{sample.id}/").status_code == 404
    assert charlie_api.delete(f"/api/v1/traffic-samples/{sample.id}/").status_code == 404
    assert charlie_api.get("/api/v1/traffic-samples/").json()["count"] == 0
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.get(reverse("traffic:detail", args=[sample.id])).status_code == 200
    assert bob_client.post(reverse("traffic:delete", args=[sample.id])).status_code == 403
    with (shared_traces / "azure2023_conv.csv").open("rb") as fh:
        response = bob_client.post(reverse("traffic:list"), {"name": "b", "file": fh})
        assert response.status_code == 403, response.content.decode()[-2000:]
    bob_api = APIClient()
    bob_api.force_login(bob)
    assert bob_api.delete(f"/api/v1/traffic-samples/{sample.id}/").status_code == 403
    assert (TrafficSample.objects.count(), AuditEvent.objects.count()) == before
    assert TrafficSample.objects.filter(organization=alice_org).count() == 1
    # Alice deletes it: the row and its numbers-only workload file both go.
    from portal.traffic.services import workload_path

    workload = workload_path(sample)
    assert workload.exists()
    assert alice_client.post(reverse("traffic:delete", args=[sample.id])).status_code == 302
    assert not TrafficSample.objects.exists()
    assert not workload.exists()


@pytest.mark.django_db
def test_workloads_no_sample_owns_are_swept_once_old(alice_org, settings, shared_traces: Path) -> None:  # type: ignore[no-untyped-def]
    """A worker killed between writing a synthesized sample's workload and committing its row
    leaves a file nothing refers to; the hourly sweep removes it, and only such files."""
    import os
    import time
    import uuid

    from django.db import transaction

    from portal.traffic import services

    trace = shared_traces / "mooncake_synthetic.jsonl"
    kept = services.traffic_sample_from_workload(organization=alice_org, name="kept", path=trace)

    class Killed(Exception):
        """Stands for the worker dying before the sample's transaction commits."""

    # The row rolls back after the file was written: what a SIGKILL before the commit leaves.
    with pytest.raises(Killed), transaction.atomic():
        lost = services.traffic_sample_from_workload(organization=alice_org, name="lost", path=trace)
        raise Killed
    assert not TrafficSample.objects.filter(id=lost.id).exists()
    root = Path(settings.TRAFFIC_WORKLOAD_DIR)
    stray_tmp = root / f"{uuid.uuid4()}.tmp"
    stray_tmp.write_text("half")
    unrelated = root / "README.txt"
    unrelated.write_text("not a workload")
    assert services.workloads_sweep() == []  # all too young: a write may still be in flight

    hour_ago = time.time() - 2 * 3600
    for path in root.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    removed = services.workloads_sweep()
    assert sorted(removed) == sorted([f"{lost.id}.jsonl", stray_tmp.name])
    assert services.workload_path(kept).exists() and unrelated.exists()
    assert not services.workload_path(lost).exists()
