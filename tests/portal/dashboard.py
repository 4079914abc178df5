"""Rows behind an endpoint's page for the dashboard's tests: its job, the endpoint, metric
scrapes and gaps, the "230 -> 315 -> 400 tok/s" revision history and loop iterations.

Used by `test_endpoint_dashboard` and `test_endpoint_page_review`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
from portal.jobs.models import ServedModel, TuningJob
from portal.traffic.models import TrafficSample

SLO = "ttft_p50_ms<=600,ttft_p95_ms<=1500"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CONFIG_1 = {"dtype": "bfloat16", "max_num_seqs": 64, "enable_prefix_caching": False}
CONFIG_2 = {"dtype": "float32", "max_num_seqs": 64, "enable_prefix_caching": False}
CONFIG_3 = {"dtype": "float32", "max_num_seqs": 128, "enable_prefix_caching": True}
POLICY_URL = "endpoints:policy"


def dashboard_job(org: Any, user: Any, name: str = "voice tuning", slo: str = SLO) -> TuningJob:
    sample = TrafficSample.objects.create(
        organization=org, name="calls", status=TrafficSample.Status.READY, profile={"num_requests": 100}
    )
    model, _ = ServedModel.objects.get_or_create(
        organization=org, name="llama-xs", defaults={"path": "/models/llama-xs"}
    )
    return TuningJob.objects.create(
        organization=org,
        name=name,
        traffic_sample=sample,
        served_model=model,
        spec={"slo": slo},
        created_by=user,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=0,
    )


def dashboard_endpoint(org: Any, user: Any, *, port: int = 59101, slo: str = SLO, **fields: Any) -> Endpoint:
    job = dashboard_job(org, user, slo=slo)
    values: dict[str, Any] = {
        "name": "voice agent",
        "config": CONFIG_3,
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


def snapshot(
    endpoint: Endpoint, at: datetime, p50: float | None = 300.0, p95: float | None = 900.0, **kw: Any
) -> None:
    values = {
        "ttft_p50_ms": p50,
        "ttft_p95_ms": p95,
        "requests_per_s": 2.0,
        "prompt_tokens_per_s": 1600.0,
        "generation_tokens_per_s": 240.0,
        "prefix_cache_hit_rate": 0.4,
        **kw,
    }
    MetricSnapshot.objects.create(
        organization=endpoint.organization, endpoint=endpoint, taken_at=at, **values
    )


def gap_snapshot(endpoint: Endpoint, at: datetime, reason: str = "metrics unavailable: ReadTimeout") -> None:
    MetricSnapshot.objects.create(
        organization=endpoint.organization, endpoint=endpoint, taken_at=at, gap=True, gap_reason=reason
    )


def revision(
    endpoint: Endpoint, generation: int, config: dict[str, Any], reason: str, **measured: Any
) -> Any:
    return EndpointRevision.objects.create(
        organization=endpoint.organization,
        endpoint=endpoint,
        generation=generation,
        config=config,
        reason=reason,
        job=endpoint.job,
        trial_number=generation - 1,
        **measured,
    )


def revision_history(endpoint: Endpoint) -> list[EndpointRevision]:
    """The "230 -> 315 -> 400 tok/s" sequence: a deployment, a manual promotion, a loop promotion."""
    revisions = [
        revision(
            endpoint,
            1,
            CONFIG_1,
            "deployed the winner of tuning job 'voice tuning' (trial 0)",
            measured_ttft_p50_ms=500.0,
            measured_ttft_p95_ms=1400.0,
            measured_tokens_per_s=230.0,
        ),
        revision(
            endpoint,
            2,
            CONFIG_2,
            "promoted the winner of tuning job 'float32' (trial 1)",
            measured_ttft_p50_ms=400.0,
            measured_ttft_p95_ms=1100.0,
            measured_tokens_per_s=315.0,
        ),
        revision(
            endpoint,
            3,
            CONFIG_3,
            "continual loop iteration 2: prompt lengths drifted -> candidate 25% faster",
            measured_ttft_p50_ms=300.0,
            measured_ttft_p95_ms=800.0,
            measured_tokens_per_s=400.0,
        ),
    ]
    return revisions


def loop_iteration(endpoint: Endpoint, number: int, status: str, **fields: Any) -> LoopIteration:
    return LoopIteration.objects.create(
        organization=endpoint.organization, endpoint=endpoint, number=number, status=status, **fields
    )
