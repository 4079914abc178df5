"""Endpoint pages: deploy a job's winner (key shown once), watch health and history, stop."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.accounts.tenancy import get_object_for_member, member_required
from portal.endpoints import services
from portal.endpoints.models import Endpoint
from portal.jobs.models import TuningJob


@member_required
def endpoint_list(request: HttpRequest) -> HttpResponse:
    organization = request.membership.organization  # type: ignore[attr-defined]
    endpoints = Endpoint.objects.filter(organization=organization).select_related("served_model")
    return render(request, "endpoints/list.html", {"endpoints": endpoints})


@member_required
@require_POST
def endpoint_deploy(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_object_for_member(
        request, TuningJob.objects.select_related("organization", "served_model"), job_id
    )
    try:
        endpoint, api_key = services.endpoint_deploy(actor=request.user, job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("jobs:detail", job_id=job.id)
    # Rendered, not redirected: the key is shown on this response only.
    return render(request, "endpoints/deployed.html", {"endpoint": endpoint, "api_key": api_key})


@member_required
def endpoint_detail(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    endpoint = get_object_for_member(
        request, Endpoint.objects.select_related("served_model", "job"), endpoint_id
    )
    candidates = TuningJob.objects.filter(
        organization=endpoint.organization,
        served_model=endpoint.served_model,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial__isnull=False,
    ).exclude(id=endpoint.job_id)
    context = {
        "endpoint": endpoint,
        "candidates": candidates,
        "revisions": endpoint.revisions.all(),
        "snapshots": endpoint.snapshots.all()[:20],
        "state": services.read_state(endpoint),
    }
    return render(request, "endpoints/detail.html", context)


@member_required
@require_POST
def endpoint_promote(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    endpoint = get_object_for_member(request, Endpoint.objects.select_related("organization"), endpoint_id)
    job = get_object_for_member(
        request, TuningJob.objects.select_related("organization"), request.POST.get("job", "")
    )
    try:
        revision = services.endpoint_promote(actor=request.user, endpoint=endpoint, job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(
            request,
            f"Generation {revision.generation} is rolling out; the old engine drains once it is healthy.",
        )
    return redirect("endpoints:detail", endpoint_id=endpoint.id)


@member_required
@require_POST
def endpoint_stop(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    endpoint = get_object_for_member(request, Endpoint.objects.select_related("organization"), endpoint_id)
    try:
        services.endpoint_stop(actor=request.user, endpoint=endpoint)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Stopped {endpoint.name}; its key no longer works.")
    return redirect("endpoints:detail", endpoint_id=endpoint.id)
