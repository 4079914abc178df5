"""Alert pages: the organization's channels (who hears about what), recent alerts and the
delivery log. Owners and admins manage channels; members may look."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.accounts.models import Role
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required
from portal.alerts import selectors, services
from portal.alerts.models import AlertChannel, AlertDelivery, AlertKind


def _page(
    request: MemberRequest, *, status: int = 200, errors: dict[str, list[str]] | None = None
) -> HttpResponse:
    organization = request.membership.organization
    context = {
        "channels": selectors.alert_channel_list(organization=organization),
        "alerts": selectors.alert_recent(organization=organization),
        "kinds": AlertKind.choices,
        "can_manage": request.membership.has_role(Role.ADMIN),
        "own_email": request.user.email,
        "errors": errors or {},
        "posted": request.POST if request.method == "POST" else {},
        "new_secret": request.session.pop("alerts_new_secret", None),
    }
    return render(request, "alerts/overview.html", context, status=status)


@member_required
@require_GET
def overview(request: MemberRequest) -> HttpResponse:
    return _page(request)


@member_required
@require_POST
def channel_create(request: MemberRequest) -> HttpResponse:
    try:
        channel = services.alert_channel_create(
            actor=request.user,
            organization=request.membership.organization,
            kind=request.POST.get("kind", ""),
            name=request.POST.get("name", ""),
            target=request.POST.get("target", ""),
            kinds=request.POST.getlist("kinds"),
        )
    except ValidationError as exc:
        return _page(
            request,
            status=400,
            errors=exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages},
        )
    if channel.secret:
        # Shown once, on the next page, then gone from the session.
        request.session["alerts_new_secret"] = {"name": channel.name, "secret": channel.secret}
    messages.success(request, f"Alert channel {channel.name} added.")
    return redirect("alerts:overview")


@member_required
@require_POST
def channel_update(request: AuthenticatedRequest, channel_id: str) -> HttpResponse:
    channel = get_object_for_member(request, AlertChannel.objects.all(), channel_id)
    try:
        services.alert_channel_update(
            actor=request.user,
            channel=channel,
            kinds=request.POST.getlist("kinds"),
            enabled=request.POST.get("enabled") == "on",
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Alert channel {channel.name} updated.")
    return redirect("alerts:overview")


@member_required
@require_POST
def channel_delete(request: AuthenticatedRequest, channel_id: str) -> HttpResponse:
    channel = get_object_for_member(request, AlertChannel.objects.all(), channel_id)
    name = channel.name
    services.alert_channel_delete(actor=request.user, channel=channel)
    messages.success(request, f"Alert channel {name} removed.")
    return redirect("alerts:overview")


@member_required
@require_POST
def delivery_retry(request: AuthenticatedRequest, delivery_id: str) -> HttpResponse:
    delivery = get_object_for_member(request, AlertDelivery.objects.all(), delivery_id)
    try:
        services.alert_delivery_retry(actor=request.user, delivery=delivery)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "The alert will be sent again.")
    return redirect("alerts:overview")
