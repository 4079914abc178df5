"""Turns state the other apps already record into alerts, without those apps calling in.

Jobs, the continual loop, endpoints and billing keep their states in their own rows; this
module reads what changed in the last ALERT_SCAN_LOOKBACK_S and raises each alert once (the
alert's subject names the episode: the job and its outcome, the loop iteration and its step,
the endpoint's n-th time degraded, the subscription's change of status). Reading is this
app's side of the dependency (alerts -> jobs, endpoints, billing), so those apps stay free of
it and of each other.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.alerts.models import AlertKind, EndpointAlertState
from portal.alerts.services import alert_raise
from portal.billing.models import BillingAccount, SubscriptionStatus
from portal.endpoints.models import Endpoint, LoopIteration
from portal.jobs.models import TuningJob

# Endpoint statuses that alert, and the alert each raises.
_ENDPOINT_ALERTS: dict[str, AlertKind] = {
    Endpoint.Status.DEGRADED: AlertKind.ENDPOINT_DEGRADED,
    Endpoint.Status.FAILED: AlertKind.ENDPOINT_DOWN,
}
# Bounds the work of one scan: at most this many rows of each kind.
_SCAN_LIMIT = 500


def _jobs(since: datetime) -> int:
    raised = 0
    finished = TuningJob.objects.filter(
        finished_at__gte=since, status__in=[TuningJob.Status.SUCCEEDED, TuningJob.Status.FAILED]
    ).values("id", "organization_id", "name", "status", "error")[:_SCAN_LIMIT]
    for job in finished:
        ok = job["status"] == TuningJob.Status.SUCCEEDED
        raised += (
            alert_raise(
                organization=job["organization_id"],
                kind=AlertKind.JOB_FINISHED if ok else AlertKind.JOB_FAILED,
                subject=f"job:{job['id']}:{job['status']}",
                summary=f"Tuning job {job['name']} {'finished' if ok else 'failed'}",
                data={
                    "job": str(job["id"]),
                    "link": f"{settings.SITE_URL}/jobs/{job['id']}/",
                    **({} if ok else {"error": (job["error"] or "")[:300]}),
                },
            )
            is not None
        )
    return raised


def _loop(since: datetime) -> int:
    raised = 0
    iterations = LoopIteration.objects.filter(detected_at__gte=since - timedelta(days=7)).select_related(
        "endpoint"
    )[:_SCAN_LIMIT]
    for it in iterations:
        steps = []
        if it.detected_at >= since:
            steps.append((AlertKind.DRIFT_DETECTED, "detected", f"Drift detected on {it.endpoint.name}"))
        if it.promoted_at is not None and it.promoted_at >= since:
            steps.append(
                (AlertKind.LOOP_PROMOTED, "promoted", f"{it.endpoint.name}: new configuration promoted")
            )
        if it.status == LoopIteration.Status.ROLLED_BACK and it.finished_at and it.finished_at >= since:
            steps.append(
                (AlertKind.LOOP_ROLLED_BACK, "rolled_back", f"{it.endpoint.name}: promotion rolled back")
            )
        for kind, step, summary in steps:
            raised += (
                alert_raise(
                    organization=it.organization_id,
                    kind=kind,
                    subject=f"loop:{it.endpoint_id}:{it.number}:{step}",
                    summary=summary,
                    data={
                        "endpoint": str(it.endpoint_id),
                        "iteration": it.number,
                        "trigger": it.trigger[:300],
                        "verdict": it.verdict[:300],
                    },
                )
                is not None
            )
    return raised


def _endpoints() -> int:
    raised = 0
    watched = Endpoint.objects.exclude(status=Endpoint.Status.STOPPED).values(
        "id", "organization_id", "name", "status", "status_detail"
    )[:_SCAN_LIMIT]
    for endpoint in watched:
        with transaction.atomic():
            state, _ = EndpointAlertState.objects.select_for_update().get_or_create(
                endpoint_id=endpoint["id"],
                defaults={"organization_id": endpoint["organization_id"], "status": Endpoint.Status.HEALTHY},
            )
            if state.status == endpoint["status"]:
                continue
            kind = _ENDPOINT_ALERTS.get(endpoint["status"])
            if kind is not None and state.status not in _ENDPOINT_ALERTS:
                state.episode += 1
                raised += (
                    alert_raise(
                        organization=endpoint["organization_id"],
                        kind=kind,
                        subject=f"endpoint:{endpoint['id']}:{state.episode}",
                        summary=f"Endpoint {endpoint['name']} is {endpoint['status']}",
                        data={
                            "endpoint": str(endpoint["id"]),
                            "status": endpoint["status"],
                            "detail": (endpoint["status_detail"] or "")[:300],
                            "link": f"{settings.SITE_URL}/endpoints/{endpoint['id']}/",
                        },
                    )
                    is not None
                )
            state.status = endpoint["status"]
            state.save(update_fields=["status", "episode"])
    return raised


def _billing(since: datetime) -> int:
    raised = 0
    past_due = BillingAccount.objects.filter(
        status=SubscriptionStatus.PAST_DUE, status_changed_at__gte=since
    ).values("id", "organization_id", "status_changed_at")[:_SCAN_LIMIT]
    for account in past_due:
        changed_at = account["status_changed_at"]
        if changed_at is None:
            continue  # never: the query filters on it
        raised += (
            alert_raise(
                organization=account["organization_id"],
                kind=AlertKind.PAYMENT_FAILED,
                subject=f"billing:{account['id']}:past_due:{changed_at.isoformat()}",
                summary="Payment failed: the subscription is past due",
                data={"link": f"{settings.SITE_URL}/billing/"},
            )
            is not None
        )
    return raised


def alerts_scan(*, now: datetime | None = None) -> dict[str, int]:
    """One pass over what changed recently; safe to run often and twice at once."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.ALERT_SCAN_LOOKBACK_S)
    return {
        "jobs": _jobs(since),
        "loop": _loop(since),
        "endpoints": _endpoints(),
        "billing": _billing(since),
    }
