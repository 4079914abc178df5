"""Rows behind an endpoint's page for the dashboard's tests, beside tests/factories.py's job,
endpoint and scrape: gaps, the "230 -> 315 -> 400 tok/s" revision history and loop iterations.

Used by `test_endpoint_dashboard` and `test_endpoint_page_review`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
from tests.factories import ENDPOINT_CONFIG, ENDPOINT_SLO

SLO = ENDPOINT_SLO
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CONFIG_1 = {"dtype": "bfloat16", "max_num_seqs": 64, "enable_prefix_caching": False}
CONFIG_2 = {"dtype": "float32", "max_num_seqs": 64, "enable_prefix_caching": False}
CONFIG_3 = ENDPOINT_CONFIG  # what tests/factories.py deploys
POLICY_URL = "endpoints:policy"


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
