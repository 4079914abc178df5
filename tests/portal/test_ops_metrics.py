"""The operator's /metrics: Prometheus text behind a bearer token, with the platform's state read
from the database (jobs, endpoints, alert deliveries, credits) and the depth of the Celery queues
read from the real Redis broker, and the portal's own request counts."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from portal.accounts.models import Organization, User
from portal.endpoints.models import Endpoint
from portal.jobs.models import TuningJob
from tests.factories import deployed_endpoint

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests"


@pytest.fixture
def broker(settings: Any) -> Iterator[redis.Redis]:
    url = os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}")
    # A queue of this test's own, so concurrent runs on the same Redis database do not mix.
    settings.CELERY_BROKER_URL = url
    settings.CELERY_TASK_DEFAULT_QUEUE = f"tg-metrics-test-{uuid.uuid4().hex[:8]}"
    yield client
    client.delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    client.close()


def _scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(reverse("metrics"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_need_the_token_and_report_state_queues_and_requests(
    settings: Any, broker: redis.Redis, alice: User, alice_org: Organization, alice_client: Client
) -> None:
    url = reverse("metrics")
    assert Client().get(url).status_code == 404  # off until a token is set
    settings.METRICS_TOKEN = TOKEN
    assert Client().get(url).status_code == 401
    assert Client().get(url, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    endpoint = deployed_endpoint(alice_org, alice, port=59301, peak_rps=4.0, config={})
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.DEGRADED)
    TuningJob.objects.filter(pk=endpoint.job_id).update(status=TuningJob.Status.FAILED)
    for n in range(3):
        broker.lpush(settings.CELERY_TASK_DEFAULT_QUEUE, f"message {n}")
    alice_client.get(reverse("sla:overview"))

    samples = _scrape(Client())
    assert samples["tailguard_endpoints", (("status", "degraded"),)] == 1
    assert samples["tailguard_tuning_jobs", (("status", "failed"),)] == 1
    assert samples["tailguard_celery_queue_depth", (("queue", settings.CELERY_TASK_DEFAULT_QUEUE),)] == 3
    assert samples["tailguard_broker_up", ()] == 1
    key = ("tailguard_http_requests_total", (("method", "GET"), ("route", "sla:overview"), ("status", "2xx")))
    before = samples[key]
    alice_client.get(reverse("sla:overview"))
    assert _scrape(Client())[key] == before + 1


def test_a_broker_that_does_not_answer_is_reported_not_an_error(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    samples = _scrape(Client())
    assert samples["tailguard_broker_up", ()] == 0
    assert not any(name == "tailguard_celery_queue_depth" for name, _ in samples)
