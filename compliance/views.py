"""HTML views of the compliance page: thin; they parse forms, call services and render."""

from __future__ import annotations

import tempfile

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from compliance import endpoint_sla, selectors, services
from compliance.forms import (
    BAACountersignForm,
    BAAForm,
    ConsoleFilterForm,
    OrganizationDeleteForm,
    ResidencyForm,
    RetentionForm,
    SLATermsForm,
    TwoFactorForm,
)
from compliance.models import BAARecord
from portal.accounts import rls
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import current_membership, get_object_for_member, member_required


def overview_page(request: MemberRequest, *, status: int = 200, **forms: object) -> HttpResponse:
    """The compliance page, with the forms given (bound, with their errors) in place of empty ones.
    Its SLA form posts to portal.sla (`sla_terms` there), which shows the page again this way."""
    organization = request.membership.organization
    regions = selectors.allowed_regions(organization=organization)
    retention = selectors.retention_settings(organization=organization)
    context = {
        "allowed_regions": regions,
        "residency_is_default": selectors.residency_is_default(organization=organization),
        "retention": retention,
        "baa_effective": selectors.baa_effective(organization=organization),
        "baas": selectors.baa_list(organization=organization),
        "events": selectors.audit_event_list(organization=organization)[:50],
        "residency_form": forms.get("residency_form") or ResidencyForm(initial={"allowed_regions": regions}),
        "retention_form": forms.get("retention_form") or RetentionForm(initial=retention),
        "baa_form": forms.get("baa_form") or BAAForm(),
        "delete_form": forms.get("delete_form") or OrganizationDeleteForm(),
        "sla_rows": endpoint_sla.endpoint_sla_rows(organization=organization),
        "sla_form": forms.get("sla_form") or SLATermsForm(),
        # Forms are shown to the roles that may use them (the services check again).
        "can_admin": request.membership.has_role("admin"),
        "is_owner": request.membership.has_role("owner"),
    }
    template = "compliance/_audit.html" if request.htmx else "compliance/overview.html"
    return render(request, template, context, status=status)


def _apply(form: object, exc: Exception) -> None:
    form.add_error(None, exc)  # type: ignore[attr-defined]


@member_required
@require_GET
def overview(request: MemberRequest) -> HttpResponse:
    return overview_page(request)


@member_required
@require_POST
def residency(request: MemberRequest) -> HttpResponse:
    form = ResidencyForm(request.POST)
    if form.is_valid():
        try:
            services.residency_policy_set(
                actor=request.user,
                organization=request.membership.organization,
                allowed_regions=form.cleaned_data["allowed_regions"],
            )
        except ValidationError as exc:
            _apply(form, exc)
        else:
            messages.success(request, "Data residency updated.")
            return redirect("compliance:overview")
    return overview_page(request, status=400, residency_form=form)


@member_required
@require_POST
def retention(request: MemberRequest) -> HttpResponse:
    form = RetentionForm(request.POST)
    if form.is_valid():
        try:
            services.retention_policy_set(
                actor=request.user,
                organization=request.membership.organization,
                **form.cleaned_data,
            )
        except ValidationError as exc:
            _apply(form, exc)
        else:
            messages.success(request, "Retention updated.")
            return redirect("compliance:overview")
    return overview_page(request, status=400, retention_form=form)


@member_required
@require_POST
def baa_create(request: MemberRequest) -> HttpResponse:
    form = BAAForm(request.POST, request.FILES)
    # The upload handler drops a file over the limit while it streams in; the document is
    # optional, so without this the BAA was recorded without the document that was sent.
    too_large = getattr(request, "upload_too_large", False)
    if too_large:
        form.add_error(
            "document", f"The file is larger than the limit of {settings.TRAFFIC_UPLOAD_MAX_BYTES:,} bytes."
        )
    if form.is_valid():
        try:
            services.baa_record_create(
                actor=request.user,
                organization=request.membership.organization,
                **form.cleaned_data,
            )
        except ValidationError as exc:
            _apply(form, exc)
        else:
            messages.success(request, "BAA recorded.")
            return redirect("compliance:overview")
    return overview_page(request, status=413 if too_large else 400, baa_form=form)


@member_required
@require_GET
def baa_document(request: MemberRequest, baa_id: str) -> FileResponse:
    baa = get_object_for_member(request, BAARecord.objects.select_related("document"), baa_id)
    if baa.document is None:
        raise Http404
    if not request.membership.has_role("admin"):
        raise PermissionDenied("Only an admin or above can download signed agreements.")
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - FileResponse closes it
    services.sensitive_object_read(obj=baa.document, target=spool)
    spool.seek(0)
    return FileResponse(spool, as_attachment=True, filename=f"baa-{baa.version}.pdf")


@member_required
@require_GET
def audit_export(request: MemberRequest) -> HttpResponse:
    try:
        name, body = services.audit_export(
            actor=request.user,
            organization=request.membership.organization,
            fmt=request.GET.get("export_format", "json"),
            region=request.GET.get("region") or None,
        )
    except ValidationError as exc:
        return HttpResponse("; ".join(exc.messages), status=400, content_type="text/plain")
    content_type = "application/json" if name.endswith(".json") else "text/csv"
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@member_required
@require_POST
def organization_delete(request: MemberRequest) -> HttpResponse:
    form = OrganizationDeleteForm(request.POST)
    if form.is_valid():
        try:
            services.organization_data_delete(
                actor=request.user,
                organization=request.membership.organization,
                confirm=form.cleaned_data["confirm"],
            )
        except ValidationError as exc:
            _apply(form, exc)
        else:
            messages.success(request, "The organization and all its data were deleted.")
            return redirect("accounts:dashboard")
    return overview_page(request, status=400, delete_form=form)


@login_required
@require_POST
def baa_countersign(request: AuthenticatedRequest) -> HttpResponse:
    """The provider countersigns a customer's BAA (and sets its effective dates). A customer's
    owner or admin posting here for their own BAA is refused with 403 (and audited); anyone
    else gets 404, as for a BAA that does not exist."""
    form = BAACountersignForm(request.POST)
    if not form.is_valid():
        return HttpResponse(" ".join(str(m) for ms in form.errors.values() for m in ms), status=400)
    baa_id = form.cleaned_data["baa"]
    if services.is_provider(request.user):
        rls.scope_transaction(platform=True)  # the provider countersigns for every tenant
        baa = BAARecord.objects.select_related("organization").filter(pk=baa_id).first()
    else:
        baa = get_object_for_member(request, BAARecord.objects.select_related("organization"), baa_id)
        if not _member_is_admin(request):
            raise Http404
    if baa is None:
        raise Http404
    try:
        services.baa_countersign(
            actor=request.user,
            baa=baa,
            effective_on=form.cleaned_data["effective_on"],
            ends_on=form.cleaned_data["ends_on"],
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(
            request,
            f"BAA {baa.version} of {baa.organization.name} countersigned: in effect from {form.cleaned_data['effective_on']}.",
        )
    return redirect("compliance:console")


def _member_is_admin(request: HttpRequest) -> bool:
    membership = current_membership(request)
    return membership is not None and membership.has_role("admin")


def _is_platform_admin(user: object) -> bool:
    return bool(getattr(user, "is_superuser", False) or getattr(user, "staff_role", "") == "platform_admin")


@login_required
@require_GET
def console(request: AuthenticatedRequest) -> HttpResponse:
    """Every tenant's endpoints with SLA status, BAA status and residency (platform admins)."""
    if not _is_platform_admin(request.user):
        raise Http404
    rls.scope_transaction(platform=True)  # every tenant's endpoints: the console's whole point
    form = ConsoleFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    rows = selectors.console_rows(
        q=filters.get("q", ""), baa=filters.get("baa", ""), sla_status=filters.get("sla", "")
    )
    services.staff_access_record(
        actor=request.user, what="compliance console", data={k: v for k, v in filters.items() if v}
    )
    context = {"form": form, "rows": rows, "awaiting": selectors.baa_awaiting_countersignature()}
    return render(request, "compliance/console.html", context)


def _two_factor_target(request: HttpRequest) -> str:
    from django.urls import reverse
    from django.utils.http import url_has_allowed_host_and_scheme

    target = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = ""
    return target or reverse("accounts:dashboard")


@login_required
def two_factor(request: AuthenticatedRequest) -> HttpResponse:
    """Verify a code (or, the first time, set up the authenticator and confirm it).

    A GET changes nothing: it shows the key awaiting confirmation if there is one, else a
    button. Making a key (the first or a new one) is a POST, and so is confirming it; both need
    a fresh re-authentication (portal.accounts.reauth), so a password-only session left open
    cannot bind the account to an attacker's authenticator. The key stays the same across page
    loads until a code confirms it or the person asks for a new one."""
    from compliance import totp
    from compliance.middleware import TWO_FACTOR_KEY

    user = request.user
    confirmed = selectors.totp_confirmed(user=user)
    verified = request.session.get(TWO_FACTOR_KEY) == str(user.pk)
    form = TwoFactorForm()
    status = 200
    action = request.POST.get("action", "verify") if request.method == "POST" else ""
    if action == "new_key" and not confirmed:
        replaced = selectors.totp_pending_secret(user=user) is not None
        services.totp_enroll_start(user=user)
        if replaced:
            messages.info(request, "A new key was made: the previous one no longer works.")
        return redirect(request.get_full_path())
    if action == "new_recovery_codes" and confirmed and verified:
        codes = services.totp_recovery_codes_create(user=user)
        return _recovery_codes_page(request, codes=codes, target=_two_factor_target(request))
    if action == "verify":
        form = TwoFactorForm(request.POST)
        status = 400
        if form.is_valid():
            try:
                ok = services.totp_verify(user=user, code=form.cleaned_data["code"])
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                if ok:
                    request.session.cycle_key()
                    request.session[TWO_FACTOR_KEY] = str(user.pk)
                    if not confirmed:
                        # Enrolment just confirmed: the recovery codes are shown on this
                        # response only (a reload re-sends a used code, which is refused).
                        codes = services.totp_recovery_codes_create(user=user)
                        return _recovery_codes_page(request, codes=codes, target=_two_factor_target(request))
                    return redirect(_two_factor_target(request))
                form.add_error("code", "That code is not right (or was already used). Try the next one.")
    secret = None if confirmed else selectors.totp_pending_secret(user=user)
    context = {
        "form": form,
        "confirmed": confirmed,
        "verified": verified,
        "secret": secret,
        "uri": totp.provisioning_uri(secret, account=user.email) if secret else None,
        "required": selectors.two_factor_required(user=user),
        "recovery_codes_left": selectors.totp_recovery_codes_left(user=user) if confirmed else None,
        "next": request.POST.get("next") or request.GET.get("next", ""),
    }
    return render(request, "compliance/two_factor.html", context, status=status)


def _recovery_codes_page(request: HttpRequest, *, codes: list[str], target: str) -> HttpResponse:
    response = render(request, "compliance/recovery_codes.html", {"codes": codes, "target": target})
    response["Cache-Control"] = "no-store"
    return response
