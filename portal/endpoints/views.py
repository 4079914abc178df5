"""Endpoint pages: deploy a job's winner (key shown once), a dashboard that refreshes itself
(health, live metrics against the SLO, SLA compliance, the optimization history and the loop's
iterations), the re-tuning policy, promote and stop."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from portal.accounts.models import Role
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required
from portal.endpoints import charts, policy, selectors, services
from portal.endpoints.forms import EndpointPolicyForm
from portal.endpoints.models import Endpoint
from portal.jobs.models import TuningJob


@member_required
def endpoint_list(request: MemberRequest) -> HttpResponse:
    organization = request.membership.organization
    endpoints = Endpoint.objects.filter(organization=organization).select_related("served_model")
    return render(request, "endpoints/list.html", {"endpoints": endpoints})


def _key_session_name(endpoint: Endpoint) -> str:
    return f"endpoint_key:{endpoint.id}"


@member_required
@require_POST
def endpoint_deploy(request: MemberRequest, job_id: str) -> HttpResponse:
    """The job page's Deploy button lands on a confirmation (what will run, where, at what
    price) carrying a one-time token; only the confirmation, with its token, deploys, and the
    same token never deploys twice."""
    job = get_object_for_member(
        request, TuningJob.objects.select_related("organization", "served_model"), job_id
    )
    if not request.membership.has_role(Role.MEMBER):
        raise PermissionDenied("Only a member or above can deploy endpoints.")
    token = request.POST.get("deploy_token", "")
    if not token:
        if job.status != TuningJob.Status.SUCCEEDED or job.winner_trial is None:
            messages.error(request, "Only a finished job with a winner can be deployed.")
            return redirect("jobs:detail", job_id=job.id)
        context = {
            "job": job,
            "summary": selectors.deploy_summary(job=job),
            "token": services.deploy_token_new(),
        }
        return render(request, "endpoints/deploy_confirm.html", context)
    try:
        endpoint, api_key = services.endpoint_deploy_once(actor=request.user, job=job, deploy_token=token)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("jobs:detail", job_id=job.id)
    if api_key is not None:
        # Post/redirect/get: the key waits in the session for the one page that shows it, so a
        # refresh of that page neither deploys again nor shows the key a second time.
        request.session[_key_session_name(endpoint)] = api_key
    return redirect("endpoints:deployed", endpoint_id=endpoint.id)


@member_required
@require_safe
def endpoint_deployed(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    api_key = request.session.pop(_key_session_name(endpoint), None)
    response = render(
        request,
        "endpoints/deployed.html",
        {
            "endpoint": endpoint,
            "api_key": api_key,
            "base_url": selectors.endpoint_base_url(endpoint),
            "model_id": selectors.endpoint_model_id(endpoint),
        },
    )
    response["Cache-Control"] = "no-store"
    return response


def _detail_context(
    request: MemberRequest, endpoint: Endpoint, *, policy_form: EndpointPolicyForm | None = None
) -> dict[str, Any]:
    asked = request.GET.get("range")
    range_name = selectors.range_key(asked)
    data = selectors.endpoint_dashboard(
        endpoint=endpoint, range_name=range_name, now=selectors.dashboard_now()
    )
    can_change = request.membership.has_role(Role.MEMBER)
    candidates = TuningJob.objects.filter(
        organization=endpoint.organization,
        served_model=endpoint.served_model,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial__isnull=False,
    )
    if endpoint.job_id is not None:  # excluding id=None would exclude nothing
        candidates = candidates.exclude(id=endpoint.job_id)
    return {
        "endpoint": endpoint,
        "data": data,
        "figures": charts.dashboard_figures(data),
        "range": range_name,
        "ranges": list(selectors.RANGE_LABELS.items()),
        "unknown_range": asked if asked and asked != range_name else None,
        "candidates": candidates,
        "state": services.read_state(endpoint),
        "can_change": can_change,
        "policy_form": policy_form
        or EndpointPolicyForm(initial=policy.policy_values(endpoint), read_only=not can_change),
    }


def _endpoint(request: HttpRequest, endpoint_id: str) -> Endpoint:
    return get_object_for_member(
        request,
        Endpoint.objects.select_related("organization", "served_model", "job", "pool", "host"),
        endpoint_id,
    )


@member_required
@require_safe
def endpoint_detail(request: MemberRequest, endpoint_id: str) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    context = _detail_context(request, endpoint)
    if request.htmx:
        # The dashboard's refresh: only the live panel (the charts update in place).
        response = render(request, "endpoints/_live.html", context)
        if not endpoint.is_active:
            response["HX-Refresh"] = "true"  # stopped meanwhile: the page stops polling
        return response
    return render(request, "endpoints/detail.html", context)


@member_required
@require_POST
def endpoint_policy(request: MemberRequest, endpoint_id: str) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    if not request.membership.has_role(Role.MEMBER):
        raise PermissionDenied("Only a member or above can change the re-tuning policy.")
    form = EndpointPolicyForm(request.POST)
    if form.is_valid():
        try:
            policy.endpoint_policy_set(actor=request.user, endpoint=endpoint, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, "Re-tuning policy saved.")
            return redirect("endpoints:detail", endpoint_id=endpoint.id)
    return render(
        request, "endpoints/detail.html", _detail_context(request, endpoint, policy_form=form), status=400
    )


@member_required
@require_POST
def endpoint_promote(request: AuthenticatedRequest, endpoint_id: str) -> HttpResponse:
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
def endpoint_stop(request: AuthenticatedRequest, endpoint_id: str) -> HttpResponse:
    endpoint = get_object_for_member(request, Endpoint.objects.select_related("organization"), endpoint_id)
    try:
        services.endpoint_stop(actor=request.user, endpoint=endpoint)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Stopping {endpoint.name}; its key no longer works.")
    return redirect("endpoints:detail", endpoint_id=endpoint.id)
