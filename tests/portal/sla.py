"""SLA tests' shared rows: the provider's credit tiers and an endpoint whose tuning job states the
SLO and peak rate that SLA terms are derived from."""

from __future__ import annotations

from portal.accounts.models import Organization, User
from portal.endpoints.models import Endpoint
from portal.jobs.models import ServedModel, TuningJob
from portal.traffic.models import TrafficSample

TIERS = [{"below_pct": 99.5, "credit_pct": 10.0}, {"below_pct": 90.0, "credit_pct": 25.0}]


def make_endpoint(org: Organization, user: User, *, port: int = 59301) -> Endpoint:
    sample = TrafficSample.objects.create(organization=org, name="calls", status=TrafficSample.Status.READY)
    model, _ = ServedModel.objects.get_or_create(organization=org, name="llama-xs", defaults={"path": "/m"})
    job = TuningJob.objects.create(
        organization=org,
        name="voice tuning",
        traffic_sample=sample,
        served_model=model,
        spec={"slo": "ttft_p50_ms<=600,ttft_p95_ms<=1500", "peak_rps": 4.0},
        created_by=user,
        status=TuningJob.Status.SUCCEEDED,
    )
    return Endpoint.objects.create(
        organization=org,
        served_model=model,
        job=job,
        name="voice agent",
        config={},
        port=port,
        api_key_prefix="abcd1234",
        api_key_hash="0" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=user,
    )
