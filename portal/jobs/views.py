"""Tuning job pages: models, the job form, and a job page whose trials arrive live (htmx)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal.accounts.models import Role
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required
from portal.jobs import reports, selectors, services
from portal.jobs.forms import ServedModelForm, TuningJobForm, WhatIfForm
from portal.jobs.models import TuningJob


def _list_page(
    request: MemberRequest, job_form: TuningJobForm, model_form: ServedModelForm, status: int = 200
) -> HttpResponse:
    membership = request.membership
    context = {
        "form": job_form,
        "model_form": model_form,
        "jobs": selectors.tuning_job_list(organization=membership.organization),
        "models": selectors.served_model_list(organization=membership.organization),
        "samples": [
            selectors.sample_facts(sample)
            for sample in selectors.ready_samples(organization=membership.organization)
        ],
        "can_start": membership.has_role(Role.MEMBER),
        "can_register": membership.has_role(Role.ADMIN),
    }
    return render(request, "jobs/list.html", context, status=status)


@member_required
@require_http_methods(["GET", "POST"])
def job_list(request: MemberRequest) -> HttpResponse:
    organization = request.membership.organization
    if request.method == "GET":
        initial = selectors.job_form_initial(organization=organization, sample_id=request.GET.get("sample"))
        return _list_page(
            request, TuningJobForm(organization=organization, initial=initial), ServedModelForm()
        )
    if not request.membership.has_role(Role.MEMBER):
        raise PermissionDenied("Only a member or above can start tuning jobs.")
    form = TuningJobForm(request.POST, organization=organization)
    if form.is_valid():
        data = form.cleaned_data
        try:
            job = services.tuning_job_create(
                actor=request.user,
                organization=organization,
                name=data["name"],
                traffic_sample=data["traffic_sample"],
                served_model=data["served_model"],
                slo=form.slo(),
                peak_rps=data["peak_rps"],
                headroom=data["headroom"],
                hardware=data["hardware"],
                pool=data.get("pool") or None,
                budget_trials=data["budget_trials"],
                strategy=data["strategy"],
                **form.trial_length(),
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("jobs:detail", job_id=job.id)
    return _list_page(request, form, ServedModelForm(), status=400)


@member_required
@require_POST
def model_register(request: MemberRequest) -> HttpResponse:
    organization = request.membership.organization
    form = ServedModelForm(request.POST)
    if form.is_valid():
        try:
            model = services.served_model_register(
                actor=request.user,
                organization=organization,
                name=form.cleaned_data["name"],
                path=form.cleaned_data["path"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Registered {model.name}.")
            return redirect("jobs:list")
    return _list_page(request, TuningJobForm(organization=organization), form, status=400)


def _job_context(job: TuningJob) -> dict[str, object]:
    selection = job.selection
    reasons = selection.get("reasons") or {}
    trials = [
        {"trial": t, "reason": reasons.get(str(t.number), "")} for t in job.trials.select_related("host")
    ]
    return {
        "job": job,
        "trials": trials,
        "selection": selection,
        "caps": job.report_section("caps"),
        "confirmation": selectors.confirmation_rows(job=job),
        "progress": selectors.job_progress(job=job),
        "engine_log": selectors.running_trial_engine_log(job=job),
        "priced": selectors.job_is_priced(job=job),
    }


@member_required
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_object_for_member(
        request, TuningJob.objects.select_related("traffic_sample", "served_model"), job_id
    )
    return render(request, "jobs/detail.html", _job_context(job))


@member_required
def job_trials(request: MemberRequest, job_id: str) -> HttpResponse:
    """The live trials fragment the job page polls while the job runs."""
    job = get_object_for_member(request, TuningJob.objects.all(), job_id)
    response = render(request, "jobs/_trials.html", _job_context(job))
    if not job.is_active and request.htmx:
        response["HX-Refresh"] = "true"
    return response


@member_required
@require_POST
def job_cancel(request: AuthenticatedRequest, job_id: str) -> HttpResponse:
    job = get_object_for_member(request, TuningJob.objects.select_related("organization"), job_id)
    try:
        services.tuning_job_cancel(actor=request.user, job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(
            request,
            "Cancelled." if job.status == TuningJob.Status.QUEUED else "Cancelling after the current trial.",
        )
    return redirect("jobs:detail", job_id=job.id)


# --- Job report -------------------------------------------------------------------------------


def _report_job(request: HttpRequest, job_id: str) -> TuningJob:
    return get_object_for_member(
        request, TuningJob.objects.select_related("traffic_sample", "served_model"), job_id
    )


@member_required
def job_report(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _report_job(request, job_id)
    return render(request, "jobs/report.html", reports.job_report_context(job=job))


@member_required
def job_report_html(request: HttpRequest, job_id: str) -> HttpResponse:
    """The report as one self-contained file (plotly.js inline) that opens offline."""
    job = _report_job(request, job_id)
    response = HttpResponse(reports.job_report_html(job=job), content_type="text/html; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{reports.report_filename(job, "html")}"'
    return response


@member_required
def job_report_pdf(request: HttpRequest, job_id: str) -> HttpResponse:
    job = _report_job(request, job_id)
    try:
        pdf = reports.job_report_pdf(job=job)
    except reports.ReportExportError as exc:
        messages.error(request, str(exc))
        return redirect("jobs:report", job_id=job.id)
    response = HttpResponse(pdf, content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{reports.report_filename(job, "pdf")}"'
    return response


@member_required
@require_http_methods(["GET"])
def what_if(request: MemberRequest) -> HttpResponse:
    """Predicted latency, sustainable rate and cost of a sample and model on each hardware the
    organization may use (a GET form: the page is its own permalink)."""
    organization = request.membership.organization
    bound = bool(request.GET)
    form = WhatIfForm(request.GET if bound else None, organization=organization)
    forecast = None
    if bound and form.is_valid():
        data = form.cleaned_data
        try:
            forecast = selectors.what_if_forecasts(
                organization=organization,
                sample=data["traffic_sample"],
                served_model=data["served_model"],
                ttft_p50_ms=data["ttft_p50_ms"],
                ttft_p95_ms=data["ttft_p95_ms"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
    # A GET form: a wrong choice or target comes back as the form with its errors (200).
    return render(request, "jobs/what_if.html", {"form": form, "forecast": forecast})
