"""Traffic sample pages: upload, validation progress (htmx polling), profile with charts."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal.accounts.models import Role
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required
from portal.traffic import selectors, services
from portal.traffic.charts import profile_figures
from portal.traffic.forms import TrafficSampleForm
from portal.traffic.models import TrafficSample


def _list_page(request: MemberRequest, form: TrafficSampleForm, status: int = 200) -> HttpResponse:
    membership = request.membership
    context = {
        "form": form,
        "samples": selectors.traffic_sample_list(organization=membership.organization),
        "can_upload": membership.has_role(Role.MEMBER),
    }
    return render(request, "traffic/list.html", context, status=status)


@member_required
@require_http_methods(["GET", "POST"])
def sample_list(request: MemberRequest) -> HttpResponse:
    if request.method == "GET":
        return _list_page(request, TrafficSampleForm())
    if not request.membership.has_role(Role.MEMBER):
        # Refused before the body is looked at: a viewer's upload is not validated, just denied.
        raise PermissionDenied("Only a member or above can upload traffic samples.")
    form = TrafficSampleForm(
        request.POST, request.FILES, upload_too_large=getattr(request, "upload_too_large", False)
    )
    if form.is_valid():
        try:
            sample = services.traffic_sample_create(
                actor=request.user,
                organization=request.membership.organization,
                name=form.cleaned_data["name"],
                upload=form.cleaned_data["file"],
                trace_format=form.cleaned_data["trace_format"] or TrafficSample.Format.AUTO,
                contains_phi=form.cleaned_data["contains_phi"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("traffic:detail", sample_id=sample.id)
    status = 413 if getattr(request, "upload_too_large", False) else 400
    return _list_page(request, form, status=status)


@member_required
def sample_detail(request: HttpRequest, sample_id: str) -> HttpResponse:
    sample = get_object_for_member(request, TrafficSample.objects.all(), sample_id)
    figures = (
        profile_figures(sample.charts)
        if sample.status == TrafficSample.Status.READY and sample.charts
        else []
    )
    return render(request, "traffic/detail.html", {"sample": sample, "figures": figures})


@member_required
def sample_status(request: MemberRequest, sample_id: str) -> HttpResponse:
    """The progress fragment the detail page polls; asks for a full reload once finished."""
    sample = get_object_for_member(request, TrafficSample.objects.defer("charts", "profile"), sample_id)
    response = render(request, "traffic/_status.html", {"sample": sample})
    if not sample.is_pending and request.htmx:
        response["HX-Refresh"] = "true"
    return response


@member_required
@require_POST
def sample_delete(request: AuthenticatedRequest, sample_id: str) -> HttpResponse:
    sample = get_object_for_member(request, TrafficSample.objects.select_related("organization"), sample_id)
    try:
        services.traffic_sample_delete(actor=request.user, sample=sample)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("traffic:detail", sample_id=sample.id)
    messages.success(request, f"Deleted {sample.name}.")
    return redirect("traffic:list")
