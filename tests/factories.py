"""The objects tests keep building, built one way: a model directory, a ready traffic sample, a
finished tuning job, a deployed endpoint and its metric series.

Plain functions, not fixtures: a test calls them with the personas it already has (`alice`,
`alice_org`, ...) and gets rows as the pipeline would leave them, without running that pipeline
(it has its own tests). Test modules import from here, never from each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from portal.accounts.models import Organization, User
from portal.endpoints.models import Endpoint, MetricSnapshot
from portal.jobs import services as job_services
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from serving.engine import EngineConfig

# Loose enough that the tiny model on a shared CPU meets it: jobs finish, whatever the host.
LOOSE_SLO = "ttft_p50_ms<=2000,ttft_p95_ms<=8000"
# A voice agent's SLO, the one deployed endpoints are watched against.
ENDPOINT_SLO = "ttft_p50_ms<=600,ttft_p95_ms<=1500"
ENDPOINT_CONFIG = {"dtype": "float32", "max_num_seqs": 128, "enable_prefix_caching": True}
MODEL_NAME = "llama-xs"
# A Mooncake trace of 24 requests a second apart, short prompts (an upload that ingests in no time).
SMALL_TRACE = b"".join(
    json.dumps({"timestamp": 1000 * i, "input_length": 40 + 7 * i, "output_length": 3 + i % 4}).encode()
    + b"\n"
    for i in range(24)
)
# Service credits below 99.5% and 90% compliance (SLA agreements' tiers).
CREDIT_TIERS = [{"below_pct": 99.5, "credit_pct": 10.0}, {"below_pct": 90.0, "credit_pct": 25.0}]
# An organization's own monitoring target on an endpoint's TTFT p50 (the body of the compliance
# SLA API; credits are not the customer's to set there).
SLA_TERMS = {"metric": "ttft_p50_ms", "target_ms": 800}


def api_client(user: User) -> Any:
    """A DRF test client signed in as `user` (the API's own authentication is tested elsewhere)."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


def build_model_dir(root: Path, name: str = MODEL_NAME) -> Path:
    """A random-weight Llama (size xs, seed 0) with its local tokenizer at `root/name`."""
    from serving.models.tiny import build_tiny_model

    out = root / name
    build_tiny_model(arch="llama", size="xs", out_dir=out, seed=0)
    return out


def ready_sample(org: Organization, user: User, trace: Path, capture: Callable[..., Any]) -> TrafficSample:
    """A sample uploaded and ingested through the traffic service (`capture` is pytest-django's
    `django_capture_on_commit_callbacks`: the ingest task runs when the upload commits)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    with capture(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=user,
            organization=org,
            name=trace.name,
            upload=SimpleUploadedFile(trace.name, trace.read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    return sample


def served_model(org: Organization, user: User, root: Path, name: str = MODEL_NAME) -> ServedModel:
    """The model directory `root/name` registered through the jobs service."""
    return job_services.served_model_register(actor=user, organization=org, name=name, path=str(root / name))


def finished_job(
    org: Organization,
    user: User,
    model_root: Path | None = None,
    *,
    name: str = "voice tuning",
    slo: str = ENDPOINT_SLO,
    winner: bool = False,
    **config_overrides: object,
) -> TuningJob:
    """A succeeded job as the tuning pipeline leaves it (rows only). With `winner`, trial 0 is its
    measured winner: a CPU configuration of `model_root/llama-xs` with `config_overrides`."""
    sample = TrafficSample.objects.create(
        organization=org, name="calls", status=TrafficSample.Status.READY, profile={"num_requests": 100}
    )
    path = str(model_root / MODEL_NAME) if model_root is not None else f"/models/{MODEL_NAME}"
    model, _ = ServedModel.objects.get_or_create(organization=org, name=MODEL_NAME, defaults={"path": path})
    job = TuningJob.objects.create(
        organization=org,
        name=name,
        traffic_sample=sample,
        served_model=model,
        spec={"slo": slo},
        created_by=user,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=0,
    )
    if winner:
        config = EngineConfig.cpu_default(
            max_model_len=1024, cpu_kv_cache_space_gib=1, **config_overrides
        ).to_mapping()
        Trial.objects.create(
            organization=org,
            job=job,
            number=0,
            assignment={"dtype": "float32"},
            label="dtype=float32",
            status=Trial.Status.DONE,
            result={
                "config": config,
                "ttft_p50_ms": 40.0,
                "ttft_p95_ms": 80.0,
                "load": [{"rate_multiple": 1.0, "tokens_per_s": 500.0}],
            },
        )
    return job


def deployed_endpoint(
    org: Organization,
    user: User,
    *,
    port: int = 59101,
    slo: str = ENDPOINT_SLO,
    peak_rps: float | None = None,
    **fields: Any,
) -> Endpoint:
    """A healthy endpoint row serving a finished job's winner (a port nobody listens on: no
    engine runs). With `peak_rps`, the job was tuned for that load (SLA terms derive from it)."""
    job = finished_job(org, user, slo=slo)
    if peak_rps is not None:
        job.spec = {**job.spec, "peak_rps": peak_rps}
        job.save(update_fields=["spec"])
    values: dict[str, Any] = {
        "name": "voice agent",
        "config": ENDPOINT_CONFIG,
        "status": Endpoint.Status.HEALTHY,
        **fields,
    }
    return Endpoint.objects.create(
        organization=org,
        served_model=job.served_model,
        job=job,
        port=port,
        api_key_prefix="abcd1234",
        api_key_hash="0" * 64,
        created_by=user,
        **values,
    )


def metric_snapshot(
    endpoint: Endpoint, at: datetime, p50: float | None = 300.0, p95: float | None = 900.0, **fields: Any
) -> MetricSnapshot:
    """One scrape of the endpoint's engine at `at`."""
    values = {
        "ttft_p50_ms": p50,
        "ttft_p95_ms": p95,
        "requests_per_s": 2.0,
        "prompt_tokens_per_s": 1600.0,
        "generation_tokens_per_s": 240.0,
        "prefix_cache_hit_rate": 0.4,
        **fields,
    }
    return MetricSnapshot.objects.create(
        organization=endpoint.organization, endpoint=endpoint, taken_at=at, **values
    )


def metric_series(endpoint: Endpoint, start: datetime, ttft_p50_ms: Sequence[float | None]) -> None:
    """A gap at `start` (nothing measured before it), then one scrape a minute with these TTFT p50s
    (p95 twice as high; None: a scrape without requests)."""
    MetricSnapshot.objects.create(
        organization=endpoint.organization, endpoint=endpoint, taken_at=start, gap=True
    )
    for i, value in enumerate(ttft_p50_ms, start=1):
        MetricSnapshot.objects.create(
            organization=endpoint.organization,
            endpoint=endpoint,
            taken_at=start + timedelta(minutes=i),
            gap=False,
            ttft_p50_ms=value,
            ttft_p95_ms=None if value is None else value * 2,
        )


def chart_series(**overrides: Any) -> dict[str, Any]:
    """The endpoint selectors' series as the charts take it: three scrapes of the last hour, the
    middle one a gap (`portal.endpoints.selectors.snapshot_series`)."""
    base: dict[str, Any] = {
        "range": "1h",
        "range_label": "last hour",
        "start": "2026-11-30T11:00:00+00:00",
        "end": "2026-11-30T12:00:00+00:00",
        "bucket_s": None,
        "taken_at": ["2026-11-30T11:10:00+00:00", "2026-11-30T11:10:15+00:00", "2026-11-30T11:10:30+00:00"],
        "ttft_p50_ms": [300.0, None, 320.0],
        "ttft_p95_ms": [900.0, None, 1600.0],
        "requests_per_s": [2.0, None, 2.5],
        "prompt_tokens_per_s": [1600.0, None, 1700.0],
        "generation_tokens_per_s": [240.0, None, 250.0],
        "prefix_cache_hit_rate": [0.4, None, 0.5],
        "num_snapshots": 3,
        "num_gaps": 1,
        "gaps": [
            {
                "start": "2026-11-30T11:10:00+00:00",
                "end": "2026-11-30T11:10:15+00:00",
                "reason": "endpoint degraded",
            }
        ],
    }
    return {**base, **overrides}
