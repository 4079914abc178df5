"""Billing pages: overview with subscribe/manage redirects, the usage page, and the webhook.

Billing pages are for owners and admins (what the organization pays is not a viewer's
business); other roles get 403, and objects of another organization 404.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotFound, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from portal.accounts import rls
from portal.accounts.models import Role
from portal.accounts.requests import MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required
from portal.billing import selectors, services
from portal.billing.config import billing_config
from portal.billing.models import UsageReport
from portal.billing.usage import month_start, next_month, parse_month, previous_month


def billing_admin_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @member_required
    @wraps(view)
    def wrapper(request: MemberRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.membership.has_role(Role.ADMIN):
            raise PermissionDenied("Only an owner or admin can see and manage billing.")
        return view(request, *args, **kwargs)

    return wrapper


def _disabled(request: HttpRequest) -> HttpResponse:
    context = {
        "notice": selectors.billing_off_notice(user=request.user),
        "show_config": selectors.billing_operator(user=request.user),
    }
    return render(request, "billing/disabled.html", context)


@billing_admin_required
@require_GET
def overview(request: MemberRequest) -> HttpResponse:
    config = billing_config()
    if config is None:
        return _disabled(request)
    organization = request.membership.organization
    context = {
        "account": selectors.billing_account_get(organization=organization),
        "plans": sorted(config.plans),
        "checkout": request.GET.get("checkout", ""),
        "lines": selectors.usage_month(organization=organization, month=timezone.now()),
        "credits": selectors.invoice_credit_list(organization=organization)[:24],
    }
    return render(request, "billing/overview.html", context)


@billing_admin_required
@require_POST
def checkout(request: MemberRequest) -> HttpResponse:
    try:
        url = services.billing_checkout_start(
            actor=request.user,
            organization=request.membership.organization,
            plan=request.POST.get("plan", ""),
        )
    except (ValidationError, services.BillingError) as exc:
        messages.error(request, " ".join(getattr(exc, "messages", None) or [str(exc)]))
        return redirect("billing:overview")
    return redirect(url)


@billing_admin_required
@require_POST
def portal(request: MemberRequest) -> HttpResponse:
    try:
        url = services.billing_portal_start(
            actor=request.user,
            organization=request.membership.organization,
        )
    except (ValidationError, services.BillingError) as exc:
        messages.error(request, " ".join(getattr(exc, "messages", None) or [str(exc)]))
        return redirect("billing:overview")
    return redirect(url)


@billing_admin_required
@require_GET
def usage(request: MemberRequest) -> HttpResponse:
    if billing_config() is None:
        return _disabled(request)
    organization = request.membership.organization
    raw = request.GET.get("month", "")
    try:
        month = parse_month(raw) if raw else month_start(timezone.now())
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    context = {
        "account": selectors.billing_account_get(organization=organization),
        "month": month,
        "previous": previous_month(month),
        "next": next_month(month),
        "lines": selectors.usage_month(organization=organization, month=month),
        "reports": selectors.usage_report_list(organization=organization).filter(
            hour__gte=month, hour__lt=next_month(month)
        )[:200],
    }
    template = "billing/_usage.html" if request.htmx else "billing/usage.html"
    return render(request, template, context)


@billing_admin_required
@require_GET
def report_detail(request: HttpRequest, report_id: str) -> HttpResponse:
    report = get_object_for_member(request, UsageReport.objects.all(), report_id)
    return render(
        request,
        "billing/report_detail.html",
        {"report": report, "records": report.records.order_by("started_at")},
    )


@csrf_exempt
@require_POST
def webhook(request: HttpRequest) -> HttpResponse:
    """Stripe's events. Only a body signed with STRIPE_WEBHOOK_SECRET, timed now, is applied."""
    if billing_config() is None:
        return HttpResponseNotFound("Billing is not enabled.")
    try:
        event = services.webhook_verify(
            payload=request.body, signature_header=request.headers.get("Stripe-Signature")
        )
    except services.WebhookRejected as exc:
        return HttpResponseBadRequest(str(exc))
    # A verified platform call about whichever organization the event names.
    with rls.platform_transaction():
        outcome = services.webhook_event_process(event=event)
    return JsonResponse({"received": True, "outcome": outcome})
