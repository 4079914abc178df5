"""SLA pages: an endpoint's agreement (versions, both signatures, the month's edge figure beside
the engine's), proposing and signing terms, the measuring point's ingest, the evidence pack, and
the compliance page's form for an endpoint's own monitoring targets.

Members of the endpoint's organization see its page; owners and admins sign and propose; platform
admins (the provider) reach every tenant's endpoints, each visit audited as staff access.
"""

from __future__ import annotations

import hmac
import json
import uuid
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from compliance import sla
from compliance.forms import SLATermsForm
from compliance.services import staff_access_record
from compliance.views import overview_page
from portal.accounts import rls
from portal.accounts.models import Role
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import current_membership, get_object_for_member, member_required
from portal.endpoints.models import Endpoint
from portal.sla import evidence, selectors, services
from portal.sla.models import SLAAgreement


def _endpoint_for(request: HttpRequest, endpoint_id: uuid.UUID | str) -> Endpoint:
    """The endpoint if the person is a member of its organization, or the provider; else 404."""
    if services.is_provider(request.user):
        rls.scope_transaction(platform=True)
        endpoint = Endpoint.objects.select_related("job", "organization").filter(pk=endpoint_id).first()
        if endpoint is None:
            raise Http404
        membership = current_membership(request)
        if membership is None or membership.organization_id != endpoint.organization_id:
            staff_access_record(
                actor=request.user,
                what="sla agreement",
                organization=endpoint.organization,
                data={"endpoint": str(endpoint.pk)},
            )
        return endpoint
    return get_object_for_member(request, Endpoint.objects.select_related("job", "organization"), endpoint_id)


def _agreement_for(request: HttpRequest, agreement_id: uuid.UUID | str) -> SLAAgreement:
    if services.is_provider(request.user):
        rls.scope_transaction(platform=True)
        agreement = SLAAgreement.objects.select_related("endpoint").filter(pk=agreement_id).first()
        if agreement is None:
            raise Http404
        return agreement
    return get_object_for_member(request, SLAAgreement.objects.select_related("endpoint"), agreement_id)


@member_required
@require_GET
def overview(request: MemberRequest) -> HttpResponse:
    organization = request.membership.organization
    rows = [
        {
            "endpoint": e,
            "in_force": selectors.sla_agreement_in_force(endpoint=e),
            "proposed": selectors.sla_agreement_proposed(endpoint=e),
        }
        for e in Endpoint.objects.filter(organization=organization).order_by("name")[:200]
    ]
    return render(
        request,
        "sla/overview.html",
        {"rows": rows, "periods": selectors.sla_period_list(organization=organization)[:24]},
    )


@login_required
@require_GET
def console(request: HttpRequest) -> HttpResponse:
    """The provider's view of every tenant's agreements: in force, awaiting a signature, the last
    closed month and its credit (platform admins; 404 to everyone else). Audited as staff access."""
    if not services.is_provider(request.user):
        raise Http404
    rls.scope_transaction(platform=True)  # every tenant's agreements: the console's whole point
    staff_access_record(actor=request.user, what="sla console")
    return render(request, "sla/console.html", {"rows": selectors.console_rows()})


@login_required
@require_GET
def endpoint_detail(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    endpoint = _endpoint_for(request, endpoint_id)
    provider = services.is_provider(request.user)
    membership = current_membership(request)
    is_customer_admin = (
        membership is not None
        and membership.organization_id == endpoint.organization_id
        and membership.has_role(Role.ADMIN)
    )
    in_force = selectors.sla_agreement_in_force(endpoint=endpoint)
    raw = request.GET.get("month", "")
    try:
        moment = sla.parse_month(raw) if raw else timezone.now()
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    start, end = sla.month_window(moment)
    figures = (
        selectors.sla_window(agreement=in_force, window_start=start, window_end=end)
        if in_force is not None
        else None
    )
    context = {
        "endpoint": endpoint,
        "in_force": in_force,
        "proposed": selectors.sla_agreement_proposed(endpoint=endpoint),
        "history": selectors.sla_agreement_history(endpoint=endpoint)[:50],
        "figures": figures,
        "month": start,
        "provider": provider,
        "is_customer_admin": is_customer_admin,
        "derived": services.sla_terms_derive(endpoint=endpoint) if provider else None,
        "errors": request.session.pop("sla_errors", None),
    }
    return render(request, "sla/endpoint.html", context)


def _terms_from_post(request: HttpRequest) -> dict[str, Any]:
    terms: dict[str, Any] = {
        key: request.POST.get(key, "")
        for key in ("ttft_p50_ms", "ttft_p95_ms", "availability_pct", "peak_rps", "interval_s")
    }
    terms["derived_from_job"] = request.POST.get("derived_from_job", "")
    # Provider-only fields are passed on only when the form sent them: the customer's form has
    # none, and a customer's request that carries them is refused (and audited) by the service.
    for key in ("min_coverage_pct", "monthly_fee_cents", "currency"):
        if key in request.POST:
            terms[key] = request.POST[key]
    if "credit_tiers" in request.POST:
        try:
            terms["credit_tiers"] = json.loads(request.POST["credit_tiers"] or "[]")
        except ValueError:
            terms["credit_tiers"] = "not json"
    return terms


@login_required
@require_POST
def propose(request: AuthenticatedRequest, endpoint_id: str) -> HttpResponse:
    endpoint = _endpoint_for(request, endpoint_id)
    try:
        agreement = services.sla_agreement_propose(
            actor=request.user, endpoint=endpoint, terms=_terms_from_post(request)
        )
    except ValidationError as exc:
        request.session["sla_errors"] = exc.messages
        return redirect("sla:endpoint", endpoint_id=endpoint.pk)
    messages.success(
        request, f"Version {agreement.version} proposed; it is in force once the other side signs it."
    )
    return redirect("sla:endpoint", endpoint_id=endpoint.pk)


@login_required
@require_POST
def sign(request: AuthenticatedRequest, agreement_id: str) -> HttpResponse:
    agreement = _agreement_for(request, agreement_id)
    try:
        services.sla_agreement_sign(actor=request.user, agreement=agreement)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Version {agreement.version} signed by both sides: it is in force.")
    return redirect("sla:endpoint", endpoint_id=agreement.endpoint_id)


@login_required
@require_POST
def decline(request: AuthenticatedRequest, agreement_id: str) -> HttpResponse:
    agreement = _agreement_for(request, agreement_id)
    try:
        services.sla_agreement_decline(actor=request.user, agreement=agreement)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Version {agreement.version} declined.")
    return redirect("sla:endpoint", endpoint_id=agreement.endpoint_id)


@member_required
@require_POST
def sla_terms(request: MemberRequest) -> HttpResponse:
    """The compliance page's form: an endpoint's own monitoring targets (`compliance:sla_terms`).
    Refused input shows the compliance page again, with the form's errors."""
    form = SLATermsForm(request.POST)
    if form.is_valid():
        data = dict(form.cleaned_data)
        endpoint = get_object_for_member(
            request, Endpoint.objects.select_related("organization"), data.pop("endpoint")
        )
        try:
            services.sla_terms_set(actor=request.user, endpoint=endpoint, **data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"SLA terms saved for {endpoint.name}.")
            return redirect("compliance:overview")
    return overview_page(request, status=400, sla_form=form)


@csrf_exempt
@require_POST
def edge_ingest(request: HttpRequest) -> HttpResponse:
    """The measuring point's batches: `Authorization: Bearer <SLA_EDGE_INGEST_TOKEN>`, a JSON body
    {"endpoint": id, "covered_from": unix s, "covered_to": unix s, "requests": [{"id",
    "arrived_at", "ttft_ms", "status"}]}. Answers 200 with what was stored, 400 naming the first
    bad field (nothing stored), 401 without the token, 404 when ingest is off or the endpoint does
    not exist."""
    token = settings.SLA_EDGE_INGEST_TOKEN
    if not token:
        raise Http404
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return JsonResponse({"error": "Send Authorization: Bearer <SLA_EDGE_INGEST_TOKEN>."}, status=401)
    try:
        payload = json.loads(request.body)
    except ValueError as exc:
        return JsonResponse({"error": f"The body is not JSON: {exc}"}, status=400)
    try:
        endpoint_id = uuid.UUID(str(payload.get("endpoint") if isinstance(payload, dict) else ""))
    except ValueError:
        return JsonResponse({"error": 'Name the endpoint: "endpoint" must be its id.'}, status=400)
    rls.scope_transaction(platform=True)  # the measuring point serves every tenant's endpoints
    endpoint = Endpoint.objects.filter(pk=endpoint_id).first()
    if endpoint is None:
        return JsonResponse({"error": f"No endpoint {endpoint_id}."}, status=404)
    try:
        outcome = services.edge_batch_record(endpoint=endpoint, payload=payload)
    except ValidationError as exc:
        return JsonResponse({"error": " ".join(exc.messages)}, status=400)
    return JsonResponse(outcome)


@member_required
@require_GET
def evidence_pack(request: MemberRequest) -> HttpResponse:
    organization = request.membership.organization
    raw = request.GET.get("month", "")
    try:
        month = sla.parse_month(raw) if raw else sla.month_window(timezone.now())[0]
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    try:
        name, body = evidence.evidence_pack_build(actor=request.user, organization=organization, month=month)
    except ValidationError as exc:
        return HttpResponseBadRequest(" ".join(exc.messages))
    response = HttpResponse(body, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
