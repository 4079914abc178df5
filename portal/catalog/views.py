"""Catalog pages: any signed-in user reads the hardware and model catalogs; platform admins
override hardware prices. Price changes answer 404 to everyone else, as the compliance console
does, so they are not advertised."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.accounts.requests import AuthenticatedRequest
from portal.catalog import measured, selectors, services
from portal.catalog.forms import PriceOverrideForm
from serving.catalog import UnknownHardware


def _hardware_context(name: str) -> dict[str, Any]:
    try:
        context = selectors.hardware_detail(name=name)
    except UnknownHardware:
        raise Http404 from None
    hardware = context["hardware"]
    context["measured"] = measured.runs_for(name=hardware.name)
    return context


def _list_page(
    request: HttpRequest, *, form: PriceOverrideForm | None = None, status: int = 200
) -> HttpResponse:
    is_admin = selectors.user_is_platform_admin(request.user)
    context = {
        "rows": selectors.hardware_rows(),
        "is_admin": is_admin,
        "form": form or (PriceOverrideForm() if is_admin else None),
    }
    return render(request, "catalog/hardware_list.html", context, status=status)


def _detail_page(
    request: HttpRequest, name: str, *, form: PriceOverrideForm | None = None, status: int = 200
) -> HttpResponse:
    context = _hardware_context(name)
    is_admin = selectors.user_is_platform_admin(request.user)
    if form is None and is_admin:
        price = context["price"]
        form = PriceOverrideForm(
            fixed_hardware=context["hardware"].name,
            initial={
                "price_per_hour_usd": price.effective_text,
                "note": price.override.note if price.override else "",
            },
        )
    context.update(is_admin=is_admin, form=form)
    return render(request, "catalog/hardware_detail.html", context, status=status)


@login_required
@require_GET
def hardware_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request)


@login_required
@require_GET
def hardware_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _detail_page(request, name)


@login_required
@require_GET
def model_list(request: HttpRequest) -> HttpResponse:
    return render(request, "catalog/model_list.html", {"rows": selectors.model_rows()})


def _error_page(request: HttpRequest, form: PriceOverrideForm, exc: ValidationError | None) -> HttpResponse:
    """The form again with what is wrong: on the device's page, or the list for an unknown name."""
    if exc is not None:
        for field, problems in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, problems)
    name = str(form.data.get("hardware_name", ""))
    try:
        known = selectors.catalog_hardware(name).name
    except UnknownHardware:
        return _list_page(request, form=form, status=400)
    form.fields["hardware_name"].widget = forms.HiddenInput()
    return _detail_page(request, known, form=form, status=400)


@login_required
@require_POST
def price_set(request: AuthenticatedRequest) -> HttpResponse:
    if not selectors.user_is_platform_admin(request.user):
        raise Http404
    form = PriceOverrideForm(request.POST)
    if not form.is_valid():
        return _error_page(request, form, None)
    try:
        override = services.hardware_price_override_set(
            actor=request.user,
            hardware_name=form.cleaned_data["hardware_name"],
            price_per_hour_usd=form.cleaned_data["price_per_hour_usd"],
            note=form.cleaned_data["note"],
        )
    except ValidationError as exc:
        return _error_page(request, form, exc)
    messages.success(
        request,
        f"{override.hardware_name} is now priced at {override.price_per_hour_usd} USD per device-hour.",
    )
    return redirect("catalog:hardware_detail", name=override.hardware_name)


@login_required
@require_POST
def price_clear(request: AuthenticatedRequest) -> HttpResponse:
    if not selectors.user_is_platform_admin(request.user):
        raise Http404
    name = request.POST.get("hardware_name", "")
    try:
        services.hardware_price_override_clear(actor=request.user, hardware_name=name)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return _list_page(request, status=400)
    messages.success(request, f"{name}: the datasheet price applies again.")
    return redirect("catalog:hardware_detail", name=name)
