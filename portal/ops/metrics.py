"""What the operator's Prometheus scrapes from the platform (prometheus_client).

Two kinds of figures:
- per-process request metrics, recorded by `RequestMetricsMiddleware` as requests happen
  (counts by route name, method and status class; latency histogram by route name). Under a
  multi-process server (gunicorn) set PROMETHEUS_MULTIPROC_DIR to an empty folder the workers
  share, and the scrape adds up every worker's files;
- state read from the database and the broker at scrape time (`StateCollector`): tuning jobs and
  trials by status, endpoints by status, alert deliveries by status and attempts by outcome,
  usage reports and invoice credits by status, and the depth of each Celery queue. The state
  lives in durable rows, so these figures are the same whichever process answers and survive
  restarts.

Label values are bounded (route names, model statuses, queue names of pools), never ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Count
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from portal.alerts.models import AlertAttempt, AlertDelivery
from portal.billing.models import InvoiceCredit, UsageReport
from portal.endpoints.models import Endpoint
from portal.jobs.models import Trial, TuningJob
from portal.pools.models import Pool
from portal.pools.routing import pool_queue

HTTP_REQUESTS = Counter(
    "tailguard_http_requests",
    "Requests the portal answered, by route name, method and status class.",
    ["route", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "tailguard_http_request_duration_seconds",
    "Time the portal took to answer, by route name.",
    ["route"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
# At most this many pool queues are measured (one LLEN each).
MAX_QUEUES = 200


def _by_status(name: str, documentation: str, rows: Any, label: str = "status") -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for row in rows:
        family.add_metric([str(row[label])], float(row["n"]))
    return family


def queue_depths(broker_url: str, queues: list[str]) -> dict[str, int] | None:
    """Messages waiting in each Celery queue of a Redis broker, or None for another broker."""
    if urlsplit(broker_url).scheme not in {"redis", "rediss"}:
        return None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        # Celery's Redis transport keeps a queue as a list under its name (priority steps as
        # "<name>\x06\x16<n>" lists beside it when priorities are used).
        with client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.llen(queue)
            return dict(zip(queues, (int(n) for n in pipe.execute()), strict=True))
    finally:
        client.close()


class StateCollector(Collector):
    """Reads durable state at scrape time (a handful of grouped COUNT queries and one broker
    round trip)."""

    def collect(self) -> Iterator[Metric]:
        yield _by_status(
            "tailguard_tuning_jobs",
            "Tuning jobs by status.",
            TuningJob.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        yield _by_status(
            "tailguard_trials",
            "Trials by status.",
            Trial.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        yield _by_status(
            "tailguard_endpoints",
            "Endpoints by status (healthy, degraded, failed, ...).",
            Endpoint.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        yield _by_status(
            "tailguard_alert_deliveries",
            "Alert deliveries by status (pending ones include those waiting for a retry).",
            AlertDelivery.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        yield _by_status(
            "tailguard_alert_attempts",
            "Alert delivery attempts, by whether they succeeded.",
            AlertAttempt.objects.values("ok").annotate(n=Count("id")).order_by(),
            label="ok",
        )
        yield _by_status(
            "tailguard_usage_reports",
            "Usage reports to Stripe by status.",
            UsageReport.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        yield _by_status(
            "tailguard_invoice_credits",
            "Credits owed to customers by status (SLA credits on the invoice).",
            InvoiceCredit.objects.values("status").annotate(n=Count("id")).order_by(),
        )
        queues = [settings.CELERY_TASK_DEFAULT_QUEUE]
        queues += [
            pool_queue(name)
            for name in Pool.objects.order_by("name").values_list("name", flat=True)[:MAX_QUEUES]
        ]
        depth = GaugeMetricFamily(
            "tailguard_celery_queue_depth",
            "Messages waiting in each Celery queue (Redis broker).",
            labels=["queue"],
        )
        up = GaugeMetricFamily(
            "tailguard_broker_up", "1 when the Redis broker answered the depth query, 0 when it did not."
        )
        try:
            depths = queue_depths(settings.CELERY_BROKER_URL, queues)
        except Exception:  # the broker being down is a figure to report, not a failed scrape
            depths = None
            up.add_metric([], 0.0)
        else:
            if depths is not None:
                up.add_metric([], 1.0)
        for queue, n in (depths or {}).items():
            depth.add_metric([queue], float(n))
        yield depth
        yield up


def exposition() -> bytes:
    """The text a scrape gets: the state figures, then the request metrics (every worker's
    when PROMETHEUS_MULTIPROC_DIR is set, this process's otherwise)."""
    state = CollectorRegistry(auto_describe=False)
    state.register(StateCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        requests = CollectorRegistry()
        MultiProcessCollector(requests)
    else:
        requests = REGISTRY
    return generate_latest(state) + generate_latest(requests)
