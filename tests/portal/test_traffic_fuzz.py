"""Adversarial uploads through the portal: a bad file ends FAILED with the line and the problem,
and leaves no workload file, no profile, no charts and no staged copy behind."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compliance.models import AuditEvent
from portal.traffic.models import TrafficSample
from portal.traffic.services import traffic_sample_create, workload_path
from tuning.workload import IngestLimits, TraceError, ingest

pytestmark = pytest.mark.django_db

GOOD_MOONCAKE = [
    json.dumps({"timestamp": i * 100, "input_length": 600, "output_length": 9, "hash_ids": [i % 3, i]})
    for i in range(40)
]
# Each is broken on one line (or as a whole), after enough good lines that a streaming writer
# would have started writing if it wrote as it went.
BAD_FILES = {
    "mooncake_negative": "\n".join(
        [*GOOD_MOONCAKE, '{"timestamp": 9999, "input_length": -1, "output_length": 1}']
    ),
    "mooncake_float_overflow": "\n".join(
        [*GOOD_MOONCAKE, '{"timestamp": 1e303, "input_length": 1, "output_length": 1}']
    ),
    "openai_truncated": '{"timestamp": 1700000000, "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n{"timestamp": 17',
    "azure_year_9999": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4\n9999-11-16 18:15:47.1,3,4\n",
    "burstgpt_duplicate_column": "Timestamp,Request tokens,Response tokens,Request tokens\n0,1,2,3\n1,1,2,3\n",
    "burstgpt_formula": "Timestamp,Request tokens,Response tokens,Log Type\n0,1,2,x\n1,1,2,=HYPERLINK(0)\n",
    "not_utf8": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4\n2023-11-16 18:15:47.1,\udcff3,4\n",
    "headers_only": "Timestamp,Request tokens,Response tokens\n",
    "unrecognised": "hello\nworld\n",
}
late_failure = "\n".join(
    [
        json.dumps({"timestamp": i, "input_length": 5, "output_length": 1, "hash_ids": [i]})
        for i in range(20_000)
    ]
    + ['{"timestamp": 20000, "input_length": 5, "output_length": 1, "hash_ids": [-7]}']
)


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


bad_uploads = st.one_of(
    st.sampled_from(sorted(BAD_FILES)).map(lambda name: _bytes(BAD_FILES[name])),
    st.sampled_from(sorted(BAD_FILES)).map(lambda name: gzip.compress(_bytes(BAD_FILES[name]), mtime=0)),
    st.binary(min_size=1, max_size=300).filter(lambda b: b.strip()),
    st.just(gzip.compress(b"\n".join(_bytes(line) for line in GOOD_MOONCAKE), mtime=0)[:-12]),
)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=bad_uploads, trace_format=st.sampled_from(["auto", "mooncake", "openai", "azure", "burstgpt"]))
@example(raw=_bytes(late_failure), trace_format="auto")  # fails after the first 16,384-row flush
def test_bad_upload_ends_failed_with_nothing_half_written(
    raw: bytes, trace_format: str, alice, alice_org, settings, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    settings.TRAFFIC_MAX_LINE_BYTES = 4096
    with django_capture_on_commit_callbacks(execute=True):
        sample = traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="adversarial",
            upload=SimpleUploadedFile("sample.bin", raw),
            trace_format=trace_format,
        )
    sample.refresh_from_db()
    limits = IngestLimits(
        max_bytes=settings.TRAFFIC_MAX_DECOMPRESSED_BYTES, max_line_bytes=settings.TRAFFIC_MAX_LINE_BYTES
    )
    if sample.status == TrafficSample.Status.READY:
        # Random bytes are occasionally a valid trace; then the profile and workload are whole.
        assert sample.profile["num_requests"] >= 2 and workload_path(sample).exists()
        workload_path(sample).unlink()
        return
    assert sample.status == TrafficSample.Status.FAILED
    # Exactly the library's own message (the line and the problem), not an internal error.
    with pytest.raises(TraceError) as caught:
        ingest(io.BytesIO(raw), trace_format=trace_format, limits=limits)
    assert sample.error == caught.value.message
    assert sample.profile is None and sample.charts is None and sample.detected_format == ""
    workloads = Path(settings.TRAFFIC_WORKLOAD_DIR)
    assert not workload_path(sample).exists()
    assert not (workloads.exists() and any(workloads.iterdir())), "a workload file (or its .tmp) was left"
    staging = Path(settings.TRAFFIC_STAGING_DIR)
    assert not (staging.exists() and any(staging.iterdir())), "the raw upload was left in staging"
    assert sample.staging_name == ""
    assert AuditEvent.objects.filter(action="traffic_sample.failed", target_id=str(sample.id)).exists()
    sample.delete()
