"""Benchmark report pages: staff build and read reports; customers open a shared, read-only copy.

Staff-only pages answer 404 to everyone else, as the compliance console does, so their
existence is not advertised. The shared page needs no login and answers 404 once its link has
expired or been revoked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from compliance.services import staff_access_record
from portal.accounts import rls
from portal.accounts.requests import AuthenticatedRequest
from portal.benchmarks import selectors, services
from portal.benchmarks.charts import report_figures
from portal.benchmarks.forms import BenchmarkReportForm, BenchmarkTargetFormSet, ShareLinkForm
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not selectors.user_is_benchmark_staff(request.user):
            raise Http404
        # Benchmark reports are the staff's own work across prospects' organizations.
        rls.scope_transaction(platform=True)
        return view(request, *args, **kwargs)

    return wrapper


def _get_report(report_id: uuid.UUID | str) -> BenchmarkReport:
    try:
        uuid.UUID(str(report_id))
    except ValueError:
        raise Http404 from None
    report = BenchmarkReport.objects.select_related("organization", "created_by").filter(pk=report_id).first()
    if report is None:
        raise Http404
    return report


@staff_required
@require_GET
def report_list(request: HttpRequest) -> HttpResponse:
    return render(request, "benchmarks/list.html", {"reports": selectors.benchmark_report_list()})


@staff_required
@require_http_methods(["GET", "POST"])
def report_create(request: AuthenticatedRequest) -> HttpResponse:
    if request.method == "GET":
        form, targets = BenchmarkReportForm(), BenchmarkTargetFormSet(prefix="targets")
        return render(request, "benchmarks/create.html", {"form": form, "targets": targets})
    form = BenchmarkReportForm(request.POST)
    targets = BenchmarkTargetFormSet(request.POST, prefix="targets")
    if form.is_valid() and targets.is_valid():
        data = form.cleaned_data
        try:
            report = services.benchmark_report_create(
                actor=request.user,
                traffic_sample=data["traffic_sample"],
                targets=targets.specs(),
                load_multipliers=data["load_multipliers"],
                duration_s=data["duration_s"],
                request_timeout_s=data["request_timeout_s"],
                max_prompt_tokens=data["max_prompt_tokens"],
                max_output_tokens=data["max_output_tokens"],
                traffic_source=data["traffic_source"],
                name=data["name"],
            )
        except ValidationError as exc:
            for field, problems in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, problems)
        else:
            return redirect("benchmarks:detail", report_id=report.id)
    return render(request, "benchmarks/create.html", {"form": form, "targets": targets}, status=400)


def _detail_context(report: BenchmarkReport, *, shared: bool) -> dict[str, Any]:
    view = selectors.benchmark_report_view(report=report)
    return {**view, "figures": report_figures(view), "shared": shared}


def _detail(request: HttpRequest, report: BenchmarkReport, **extra: Any) -> HttpResponse:
    links = [
        {"link": link, "state": selectors.share_link_state(link)}
        for link in selectors.benchmark_share_links(report=report)
    ]
    context = {
        **_detail_context(report, shared=False),
        "share_form": extra.pop("share_form", None) or ShareLinkForm(),
        "share_links": links,
        **extra,
    }
    return render(
        request, "benchmarks/detail.html", context, status=400 if context["share_form"].errors else 200
    )


@staff_required
@require_GET
def report_detail(request: HttpRequest, report_id: str) -> HttpResponse:
    report = _get_report(report_id)
    staff_access_record(
        actor=request.user,
        organization=report.organization,
        what="benchmark report",
        data={"report": str(report.id)},
    )
    return _detail(request, report)


@staff_required
@require_GET
def report_status(request: AuthenticatedRequest, report_id: str) -> HttpResponse:
    """The progress fragment the report page polls; asks for a full reload once finished."""
    report = _get_report(report_id)
    response = render(request, "benchmarks/_status.html", {"report": report})
    if not report.is_pending and request.htmx:
        response["HX-Refresh"] = "true"
    return response


@staff_required
@require_POST
def share_create(request: AuthenticatedRequest, report_id: str) -> HttpResponse:
    report = _get_report(report_id)
    form = ShareLinkForm(request.POST)
    if form.is_valid():
        try:
            _link, secret = services.benchmark_share_create(
                actor=request.user,
                report=report,
                days=form.cleaned_data["days"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            # Shown in this response only: the secret is stored as a digest and never again.
            url = request.build_absolute_uri(reverse("benchmarks:shared", kwargs={"token": secret}))
            return _detail(request, report, new_share_url=url)
    return _detail(request, report, share_form=form)


@staff_required
@require_POST
def share_revoke(request: AuthenticatedRequest, report_id: str, link_id: str) -> HttpResponse:
    report = _get_report(report_id)
    link = BenchmarkShareLink.objects.filter(report=report, pk=link_id).first()
    if link is None:
        raise Http404
    services.benchmark_share_revoke(actor=request.user, link=link)
    messages.success(request, "The share link was revoked; it now answers 404.")
    return redirect("benchmarks:detail", report_id=report.id)


@never_cache
@require_GET
def shared_report(request: HttpRequest, token: str) -> HttpResponse:
    """The customer's read-only copy: no login, no target addresses, no raw error texts."""
    report = services.benchmark_share_open(secret=token)
    if report is None:
        raise Http404
    # The page shows this report only: the rest of the request acts in its organization.
    rls.scope_transaction(organization_id=report.organization_id)
    response = render(request, "benchmarks/shared.html", _detail_context(report, shared=True))
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    return response
