"""REST API views: thin; serializers check shape, services decide and write."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.contrib.auth import login
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, permissions, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import FormParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts import reauth, selectors, services
from portal.accounts.models import ApiToken, Invitation, Membership, Role
from portal.accounts.tenancy import SESSION_KEY
from portal.api import serializers as s
from portal.jobs import services as job_services
from portal.jobs.models import ServedModel, TuningJob
from portal.restkit.base import TenantScopedMixin, resolve_tenant
from portal.restkit.parsers import LimitedMultiPartParser
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample


def _roles(user: Any) -> dict[object, str]:
    return {m.organization_id: m.role for m in Membership.objects.filter(user=user)}


class SignupView(APIView):
    permission_classes = [permissions.AllowAny]
    authentication_classes: list[type] = []

    @extend_schema(request=s.SignupSerializer, responses={201: s.UserSerializer})
    def post(self, request: Request) -> Response:
        serializer = s.SignupSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = services.user_signup(**serializer.validated_data)
        return Response(s.UserSerializer(user).data, status=status.HTTP_201_CREATED)


class MeView(APIView):
    @extend_schema(responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        tenant = resolve_tenant(request)
        organizations = selectors.organization_list_for_user(user=request.user)
        if tenant is not None and tenant.token is not None:
            organizations = organizations.filter(id=tenant.organization.id)
        context = {"roles": _roles(request.user)}
        return Response(
            {
                "user": s.UserSerializer(request.user).data,
                "current_organization": (
                    s.OrganizationSerializer(tenant.organization, context=context).data if tenant else None
                ),
                "organizations": s.OrganizationSerializer(organizations, many=True, context=context).data,
            }
        )


class ReauthenticateView(APIView):
    """Confirms the signed-in person's password (and two-factor code) for this session, as the
    sensitive actions (creating tokens, deleting the organization) require. Sessions only."""

    permission_classes: ClassVar = [permissions.IsAuthenticated]

    @extend_schema(request=s.ReauthenticateSerializer, responses={200: None})
    def post(self, request: Request) -> Response:
        if isinstance(request.auth, ApiToken):
            raise PermissionDenied("An API token cannot re-authenticate: it is not a person's sign-in.")
        serializer = s.ReauthenticateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.user_reauthenticate(
            user=request.user,
            password=serializer.validated_data["password"],
            code=serializer.validated_data["code"],
            request=request._request,
        )
        reauth.mark_fresh(request._request, request.user)
        return Response({"detail": f"Confirmed for {settings.REAUTH_MAX_AGE_S // 60} minutes."})


class ActiveOrganizationView(APIView):
    """Switch the session's current organization (browser sessions; tokens are bound to one)."""

    extra_error_statuses = (404,)

    @extend_schema(request=s.ActiveOrganizationSerializer, responses=s.OrganizationSerializer)
    def put(self, request: Request) -> Response:
        if isinstance(request.auth, ApiToken):
            raise ValidationError(
                {"organization": "An API token is bound to its organization; it cannot switch."}
            )
        serializer = s.ActiveOrganizationSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = selectors.membership_get(
            user=request.user, organization_id=serializer.validated_data["organization"]
        )
        if membership is None:
            raise NotFound("No such organization.")
        request.session[SESSION_KEY] = str(membership.organization_id)
        return Response(
            s.OrganizationSerializer(membership.organization, context={"roles": _roles(request.user)}).data
        )


class OrganizationListCreateView(APIView):
    @extend_schema(responses=s.OrganizationSerializer(many=True))
    def get(self, request: Request) -> Response:
        organizations = selectors.organization_list_for_user(user=request.user)
        if isinstance(request.auth, ApiToken):
            organizations = organizations.filter(id=request.auth.organization_id)
        return Response(
            s.OrganizationSerializer(organizations, many=True, context={"roles": _roles(request.user)}).data
        )

    @extend_schema(request=s.OrganizationSerializer, responses={201: s.OrganizationSerializer})
    def post(self, request: Request) -> Response:
        if isinstance(request.auth, ApiToken):
            raise ValidationError(
                {"non_field_errors": ["Create organizations from a signed-in session, not a token."]}
            )
        serializer = s.OrganizationSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        organization = services.organization_create(
            actor=request.user, name=serializer.validated_data["name"]
        )
        if request.session.get(SESSION_KEY) is None:
            request.session[SESSION_KEY] = str(organization.id)
        return Response(
            s.OrganizationSerializer(organization, context={"roles": _roles(request.user)}).data,
            status=status.HTTP_201_CREATED,
        )


class MemberListView(TenantScopedMixin, generics.ListAPIView):
    serializer_class = s.MembershipSerializer

    def tenant_queryset(self) -> QuerySet[Membership]:
        return Membership.objects.select_related("user").order_by("user__email")


class MemberDetailView(TenantScopedMixin, generics.RetrieveDestroyAPIView):
    """DELETE removes the member (or, on one's own membership, leaves); the service decides who may."""

    serializer_class = s.MembershipSerializer
    write_role = Role.VIEWER

    def tenant_queryset(self) -> QuerySet[Membership]:
        return Membership.objects.select_related("user", "organization")

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.membership_remove(actor=request.user, membership=self.get_object())  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    serializer_class = s.InvitationSerializer
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[Invitation]:
        return Invitation.objects.order_by("-created_at")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        invitation = services.invitation_create(
            actor=request.user, organization=self.tenant.organization, **serializer.validated_data
        )
        return Response(s.InvitationSerializer(invitation).data, status=status.HTTP_201_CREATED)


class InvitationDetailView(TenantScopedMixin, generics.RetrieveDestroyAPIView):
    """DELETE withdraws a pending invitation (it is kept, marked revoked, for the audit trail)."""

    serializer_class = s.InvitationSerializer
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[Invitation]:
        return Invitation.objects.select_related("organization")

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.invitation_revoke(actor=request.user, invitation=self.get_object())  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptView(APIView):
    @extend_schema(request=s.InvitationAcceptSerializer, responses=s.OrganizationSerializer)
    def post(self, request: Request) -> Response:
        serializer = s.InvitationAcceptSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            membership = services.invitation_accept(
                user=request.user, secret=serializer.validated_data["token"]
            )
        except services.InvitationError as exc:
            raise ValidationError({"token": [str(exc)]}) from None
        if not isinstance(request.auth, ApiToken):
            login(request._request, request.user, backend="django.contrib.auth.backends.ModelBackend")
            request.session[SESSION_KEY] = str(membership.organization_id)
        return Response(
            s.OrganizationSerializer(membership.organization, context={"roles": _roles(request.user)}).data
        )


# The schema is generated from `post`; a decorator on `create` was ignored there.
@extend_schema_view(post=extend_schema(responses={201: s.ApiTokenCreatedSerializer}))
class ApiTokenListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    serializer_class = s.ApiTokenSerializer
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.select_related("created_by").order_by("-created_at")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        issued = services.api_token_create(
            actor=request.user, organization=self.tenant.organization, name=serializer.validated_data["name"]
        )
        data = dict(s.ApiTokenSerializer(issued.token).data)
        data["token"] = issued.secret
        return Response(data, status=status.HTTP_201_CREATED)


class ApiTokenDetailView(TenantScopedMixin, generics.RetrieveDestroyAPIView):
    """DELETE revokes the token (it is kept, marked revoked, for the audit trail)."""

    serializer_class = s.ApiTokenSerializer
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.select_related("organization", "created_by")

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.api_token_revoke(actor=request.user, token=self.get_object())  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


# The schema is generated from `post`; a decorator on `create` was ignored there.
@extend_schema_view(
    post=extend_schema(request=s.TrafficSampleUploadSerializer, responses={201: s.TrafficSampleSerializer})
)
class TrafficSampleListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    """Upload a traffic sample (multipart). It is validated and profiled in the background:
    poll the sample until `status` is `ready` (with `profile`) or `failed` (with `error`)."""

    serializer_class = s.TrafficSampleSerializer
    parser_classes = [LimitedMultiPartParser, FormParser]
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[TrafficSample]:
        return TrafficSample.objects.defer("charts")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # Parsing streams the file through the size-limited handler; LimitedMultiPartParser
        # refuses a file over the limit, naming the field.
        serializer = s.TrafficSampleUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        sample = traffic_services.traffic_sample_create(
            actor=request.user,
            organization=self.tenant.organization,
            name=serializer.validated_data["name"],
            upload=serializer.validated_data["file"],
            trace_format=serializer.validated_data["trace_format"],
            contains_phi=serializer.validated_data["contains_phi"],
        )
        return Response(s.TrafficSampleSerializer(sample).data, status=status.HTTP_201_CREATED)


class TrafficSampleDetailView(TenantScopedMixin, generics.RetrieveDestroyAPIView):
    serializer_class = s.TrafficSampleSerializer
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[TrafficSample]:
        return TrafficSample.objects.select_related("organization").defer("charts")

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        traffic_services.traffic_sample_delete(actor=request.user, sample=self.get_object())  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServedModelListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    serializer_class = s.ServedModelSerializer
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[ServedModel]:
        return ServedModel.objects.order_by("name")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        model = job_services.served_model_register(
            actor=request.user, organization=self.tenant.organization, **serializer.validated_data
        )
        return Response(s.ServedModelSerializer(model).data, status=status.HTTP_201_CREATED)


# The schema is generated from `post`; a decorator on `create` was ignored there.
@extend_schema_view(
    post=extend_schema(request=s.TuningJobCreateSerializer, responses={201: s.TuningJobSerializer})
)
class TuningJobListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    """Start a tuning job; poll it for live trials, the winner and the reasons."""

    serializer_class = s.TuningJobSerializer
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[TuningJob]:
        return TuningJob.objects.prefetch_related("trials")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = s.TuningJobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        data = dict(serializer.validated_data)
        organization = self.tenant.organization
        # Looked up inside the organization: another tenant's id is simply not found.
        sample = TrafficSample.objects.filter(
            organization=organization, id=data.pop("traffic_sample")
        ).first()
        model = ServedModel.objects.filter(organization=organization, id=data.pop("served_model")).first()
        errors = {}
        if sample is None:
            errors["traffic_sample"] = ["No such traffic sample."]
        if model is None:
            errors["served_model"] = ["No such model."]
        if sample is None or model is None:  # exactly when errors is not empty
            raise ValidationError(errors)
        job = job_services.tuning_job_create(
            actor=request.user, organization=organization, traffic_sample=sample, served_model=model, **data
        )
        return Response(s.TuningJobSerializer(job).data, status=status.HTTP_201_CREATED)


class TuningJobDetailView(TenantScopedMixin, generics.RetrieveAPIView):
    serializer_class = s.TuningJobSerializer

    def tenant_queryset(self) -> QuerySet[TuningJob]:
        return TuningJob.objects.prefetch_related("trials")


class TuningJobCancelView(TenantScopedMixin, generics.GenericAPIView):
    serializer_class = s.TuningJobSerializer
    write_role = Role.MEMBER

    def tenant_queryset(self) -> QuerySet[TuningJob]:
        return TuningJob.objects.select_related("organization")

    @extend_schema(request=None, responses=s.TuningJobSerializer)
    def post(self, request: Request, pk: str) -> Response:
        job = job_services.tuning_job_cancel(actor=request.user, job=self.get_object())  # type: ignore[arg-type]
        return Response(s.TuningJobSerializer(job).data)


# --- Billing (issue 10): owners and admins only, reads included ---------------------------------
from django.utils import timezone  # noqa: E402
from drf_spectacular.utils import OpenApiParameter  # noqa: E402
from rest_framework.exceptions import APIException  # noqa: E402

from portal.billing import selectors as billing_selectors  # noqa: E402
from portal.billing import services as billing_services  # noqa: E402
from portal.billing.config import billing_config  # noqa: E402
from portal.billing.models import SubscriptionStatus, UsageReport  # noqa: E402
from portal.billing.usage import month_start, parse_month  # noqa: E402
from portal.restkit.base import TenantRolePermission  # noqa: E402


class BillingUnavailable(APIException):
    status_code = 502
    default_detail = "Stripe could not be reached."


class BillingRolePermission(TenantRolePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        tenant = view.tenant
        if not tenant.has_role(Role.ADMIN):
            self.message = f"Billing needs the admin role or above; you act as {tenant.role}."
            return False
        return True


class _BillingView(TenantScopedMixin):
    permission_classes = [permissions.IsAuthenticated, BillingRolePermission]
    write_role = Role.ADMIN


class BillingAccountView(_BillingView, APIView):
    @extend_schema(responses=s.BillingAccountSerializer)
    def get(self, request: Request) -> Response:
        assert self.tenant is not None
        config = billing_config()
        account = billing_selectors.billing_account_get(organization=self.tenant.organization)
        data = {
            "enabled": config is not None,
            "how_to_enable": ""
            if config is not None
            else billing_selectors.billing_off_notice(user=request.user),
            "status": account.status if account else SubscriptionStatus.NONE,
            "plan": account.plan if account else "",
            "current_period_end": account.current_period_end if account else None,
            "usage_billed_from": account.usage_billed_from if account else None,
            "plans": sorted(config.plans) if config else [],
        }
        return Response(s.BillingAccountSerializer(data).data)


class BillingUsageView(_BillingView, APIView):
    @extend_schema(
        parameters=[OpenApiParameter("month", str, description="YYYY-MM (UTC); this month if omitted")],
        responses=s.BillingUsageSerializer,
    )
    def get(self, request: Request) -> Response:
        assert self.tenant is not None
        raw = request.query_params.get("month", "")
        try:
            month = parse_month(raw) if raw else month_start(timezone.now())
        except ValueError as exc:
            raise ValidationError({"month": [str(exc)]}) from None
        lines = billing_selectors.usage_month(organization=self.tenant.organization, month=month)
        data = {
            "month": f"{month:%Y-%m}",
            "lines": [
                {
                    "meter": line.meter,
                    "dimension": line.dimension,
                    "duration_ms": line.duration_ms,
                    "billable_minutes": line.billable_minutes,
                    "reported_minutes": line.reported_minutes,
                    "pending_minutes": line.pending_minutes,
                    "unbilled_minutes": line.unbilled_minutes,
                }
                for line in lines
            ],
        }
        return Response(s.BillingUsageSerializer(data).data)


class UsageReportListView(_BillingView, generics.ListAPIView):
    serializer_class = s.UsageReportSerializer

    def tenant_queryset(self) -> QuerySet[UsageReport]:
        return UsageReport.objects.order_by("-hour", "meter", "dimension", "sequence")


class UsageReportDetailView(_BillingView, generics.RetrieveAPIView):
    serializer_class = s.UsageReportSerializer

    def tenant_queryset(self) -> QuerySet[UsageReport]:
        return UsageReport.objects.all()


class BillingCheckoutView(_BillingView, APIView):
    """Start a subscription: returns the Stripe Checkout URL to send the person to."""

    extra_error_statuses = (502,)  # BillingUnavailable

    @extend_schema(request=s.BillingCheckoutSerializer, responses=s.BillingRedirectSerializer)
    def post(self, request: Request) -> Response:
        serializer = s.BillingCheckoutSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        try:
            url = billing_services.billing_checkout_start(
                actor=request.user,
                organization=self.tenant.organization,
                plan=serializer.validated_data["plan"],
            )
        except billing_services.BillingError as exc:
            raise BillingUnavailable(str(exc)) from None
        return Response({"url": url})


class BillingPortalView(_BillingView, APIView):
    """Manage the subscription: returns the Stripe customer portal URL."""

    extra_error_statuses = (502,)  # BillingUnavailable

    @extend_schema(request=None, responses=s.BillingRedirectSerializer)
    def post(self, request: Request) -> Response:
        assert self.tenant is not None
        try:
            url = billing_services.billing_portal_start(
                actor=request.user, organization=self.tenant.organization
            )
        except billing_services.BillingError as exc:
            raise BillingUnavailable(str(exc)) from None
        return Response({"url": url})
