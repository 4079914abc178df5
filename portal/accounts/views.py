"""HTML views of the accounts app: thin; they parse forms, call services and render."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from portal.accounts import reauth, selectors, services
from portal.accounts.forms import (
    ApiTokenForm,
    EmailAuthenticationForm,
    InvitationForm,
    OrganizationForm,
    OrganizationSwitchForm,
    ReauthForm,
    SignupForm,
)
from portal.accounts.models import ApiToken, Invitation, Role
from portal.accounts.ports import compliance
from portal.accounts.requests import AuthenticatedRequest, MemberRequest
from portal.accounts.tenancy import get_object_for_member, member_required, set_current_organization


def _safe_next(request: HttpRequest, default: str) -> str:
    candidate = request.POST.get("next") or request.GET.get("next") or ""
    if candidate and url_has_allowed_host_and_scheme(candidate, allowed_hosts={request.get_host()}):
        return candidate
    return default


class SignInView(auth_views.LoginView):
    """Django's sign-in page; a session started with a password goes into the audit trail
    (failures and throttled attempts are recorded by the authentication backend)."""

    template_name = "accounts/login.html"
    authentication_form = EmailAuthenticationForm
    redirect_authenticated_user = True

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        compliance().signed_in(user=form.get_user(), request=self.request)
        # A password just given: sensitive actions need no second prompt for a while.
        reauth.mark_fresh(self.request)
        return response


class SignOutView(auth_views.LogoutView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user if request.user.is_authenticated else None
        response = super().post(request, *args, **kwargs)
        if user is not None:
            compliance().signed_out(user=user, request=request)
        return response


def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("accounts:dashboard")
    return render(request, "accounts/home.html")


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("accounts:dashboard")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.user_signup(
                email=form.cleaned_data["email"],
                password=form.cleaned_data["password"],
                full_name=form.cleaned_data["full_name"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            reauth.mark_fresh(request)
            return redirect(_safe_next(request, reverse("accounts:organization_create")))
    status = 400 if request.method == "POST" else 200
    return render(
        request, "accounts/signup.html", {"form": form, "next": _safe_next(request, "")}, status=status
    )


@login_required
@require_http_methods(["GET", "POST"])
def reauthenticate(request: AuthenticatedRequest) -> HttpResponse:
    """Password (and two-factor code) again, before a sensitive action (portal.accounts.reauth)."""
    target = reauth.safe_next(
        request, request.POST.get("next") or request.GET.get("next", ""), reverse("accounts:dashboard")
    )
    form = ReauthForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.user_reauthenticate(
                user=request.user,
                password=form.cleaned_data["password"],
                code=form.cleaned_data["code"],
                request=request,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            reauth.mark_fresh(request)
            return redirect(target)
    status = 400 if request.method == "POST" else 200
    context = {
        "form": form,
        "next": target,
        "needs_code": compliance().second_factor_confirmed(user=request.user),
    }
    return render(request, "accounts/reauth.html", context, status=status)


@member_required
def dashboard(request: MemberRequest) -> HttpResponse:
    membership = request.membership
    organization = membership.organization
    context = {
        "members": selectors.member_list(organization=organization),
        "token_count": selectors.api_token_list(organization=organization)
        .filter(revoked_at__isnull=True)
        .count(),
        "events": compliance().recent_events(organization=organization, limit=10),
    }
    return render(request, "accounts/dashboard.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def organization_create(request: AuthenticatedRequest) -> HttpResponse:
    form = OrganizationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            organization = services.organization_create(actor=request.user, name=form.cleaned_data["name"])
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            set_current_organization(request, organization)
            messages.success(request, f"Created {organization.name}.")
            return redirect("accounts:dashboard")
    status = 400 if request.method == "POST" else 200
    return render(request, "accounts/organization_create.html", {"form": form}, status=status)


@login_required
@require_POST
def organization_switch(request: AuthenticatedRequest) -> HttpResponse:
    form = OrganizationSwitchForm(request.POST)
    if not form.is_valid():
        raise Http404
    membership = selectors.membership_get(
        user=request.user, organization_id=form.cleaned_data["organization"]
    )
    if membership is None:
        raise Http404
    set_current_organization(request, membership.organization)
    return redirect(_safe_next(request, reverse("accounts:dashboard")))


def _members_page(request: MemberRequest, form: InvitationForm, status: int = 200) -> HttpResponse:
    organization = request.membership.organization
    context = {
        "form": form,
        "members": selectors.member_list(organization=organization),
        "invitations": selectors.invitation_list_pending(organization=organization),
        "can_invite": request.membership.has_role(Role.ADMIN),
    }
    return render(request, "accounts/members.html", context, status=status)


@member_required
@require_http_methods(["GET", "POST"])
def members(request: MemberRequest) -> HttpResponse:
    if request.method == "GET":
        return _members_page(request, InvitationForm())
    form = InvitationForm(request.POST)
    if form.is_valid():
        try:
            invitation = services.invitation_create(
                actor=request.user,
                organization=request.membership.organization,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Invitation sent to {invitation.email}.")
            return redirect("accounts:members")
    return _members_page(request, form, status=400)


@member_required
@require_POST
def member_remove(request: MemberRequest, membership_id: int) -> HttpResponse:
    membership = selectors.member_get(
        organization=request.membership.organization,
        membership_id=membership_id,
    )
    if membership is None:
        raise Http404
    leaving = membership.user_id == request.user.pk
    try:
        services.membership_remove(actor=request.user, membership=membership)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("accounts:members")
    if leaving:
        messages.success(request, f"You left {membership.organization.name}.")
        return redirect("accounts:dashboard")
    messages.success(request, f"Removed {membership.user.email}; their API tokens no longer work.")
    return redirect("accounts:members")


@member_required
@require_POST
def invitation_revoke(request: AuthenticatedRequest, invitation_id: str) -> HttpResponse:
    invitation = get_object_for_member(request, Invitation.objects.all(), invitation_id)
    try:
        services.invitation_revoke(actor=request.user, invitation=invitation)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Invitation to {invitation.email} withdrawn.")
    return redirect("accounts:members")


@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, secret: str) -> HttpResponse:
    if not request.user.is_authenticated or request.method == "GET":
        return render(request, "accounts/invitation_accept.html", {"secret": secret})
    try:
        membership = services.invitation_accept(user=request.user, secret=secret)
    except services.InvitationError as exc:
        return render(
            request, "accounts/invitation_accept.html", {"secret": secret, "error": str(exc)}, status=400
        )
    set_current_organization(request, membership.organization)
    messages.success(request, f"You joined {membership.organization.name} as {membership.role}.")
    return redirect("accounts:dashboard")


def _tokens_page(
    request: MemberRequest, form: ApiTokenForm, issued: services.IssuedToken | None = None, status: int = 200
) -> HttpResponse:
    organization = request.membership.organization
    context = {
        "form": form,
        "tokens": selectors.api_token_list(organization=organization),
        "issued": issued,
        "can_create": request.membership.has_role(Role.MEMBER),
    }
    template = "accounts/_tokens.html" if request.htmx else "accounts/tokens.html"
    return render(request, template, context, status=status)


@member_required
@require_http_methods(["GET", "POST"])
def api_tokens(request: MemberRequest) -> HttpResponse:
    if request.method == "GET":
        return _tokens_page(request, ApiTokenForm())
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            issued = services.api_token_create(
                actor=request.user,
                organization=request.membership.organization,
                name=form.cleaned_data["name"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            # Rendered, not redirected: the secret is shown on this response only.
            return _tokens_page(request, ApiTokenForm(), issued=issued)
    return _tokens_page(request, form, status=400)


@member_required
@require_POST
def api_token_revoke(request: MemberRequest, token_id: str) -> HttpResponse:
    token = get_object_for_member(request, ApiToken.objects.select_related("organization"), token_id)
    try:
        services.api_token_revoke(actor=request.user, token=token)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Revoked token {token.name}.")
    if request.htmx:
        return _tokens_page(request, ApiTokenForm())
    return redirect("accounts:api_tokens")
