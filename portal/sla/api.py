"""REST API of SLA agreements (routed from portal/api/urls.py): the organization's agreements
with both signatures, signing one (owners and admins), proposing other targets, and an
endpoint's month judged at the edge beside the engine's figure. Thin: services decide."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from compliance import sla
from portal.accounts.models import Role
from portal.endpoints.models import Endpoint
from portal.restkit import fields as api_fields
from portal.restkit.base import TenantScopedMixin
from portal.restkit.parsers import StrictJSONParser
from portal.sla import evidence, selectors, services
from portal.sla.models import SLAAgreement


class AgreementSerializer(api_fields.ModelSerializer):
    endpoint = serializers.UUIDField(source="endpoint_id", read_only=True)
    provider_signed_by = api_fields.EmailField(
        source="provider_signed_by.email", read_only=True, allow_null=True
    )
    customer_signed_by = api_fields.EmailField(
        source="customer_signed_by.email", read_only=True, allow_null=True
    )

    class Meta:
        model = SLAAgreement
        fields = [
            "id",
            "endpoint",
            "version",
            "status",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "availability_pct",
            "peak_rps",
            "interval_s",
            "credit_tiers",
            "min_coverage_pct",
            "monthly_fee_cents",
            "currency",
            "proposed_by_side",
            "provider_signed_by",
            "provider_signed_at",
            "customer_signed_by",
            "customer_signed_at",
            "in_force_from",
            "in_force_until",
        ]
        read_only_fields = fields


class ProposalSerializer(serializers.Serializer):
    """The targets a customer may propose; credit terms stay the provider's (sending them is 403)."""

    ttft_p50_ms = serializers.FloatField(min_value=1, max_value=600_000, required=False, allow_null=True)
    ttft_p95_ms = serializers.FloatField(min_value=1, max_value=600_000, required=False, allow_null=True)
    availability_pct = serializers.FloatField(min_value=50, max_value=100, required=False, allow_null=True)
    peak_rps = serializers.FloatField(min_value=0.001, max_value=5000)
    interval_s = serializers.IntegerField(min_value=60, max_value=3600, default=300)
    credit_tiers = serializers.ListField(child=serializers.DictField(), required=False, max_length=10)
    monthly_fee_cents = serializers.IntegerField(required=False, min_value=0, max_value=100_000_000)


class AgreementListView(TenantScopedMixin, generics.ListAPIView):
    """Every SLA agreement version of the organization's endpoints, newest first."""

    serializer_class = AgreementSerializer

    def tenant_queryset(self) -> QuerySet[SLAAgreement]:
        return SLAAgreement.objects.select_related("provider_signed_by", "customer_signed_by").order_by(
            "endpoint_id", "-version"
        )


class AgreementSignView(TenantScopedMixin, generics.GenericAPIView):
    """The customer's signature on the provider's proposal (owners and admins); with both
    signatures the version comes into force."""

    serializer_class = AgreementSerializer
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[SLAAgreement]:
        return SLAAgreement.objects.select_related("endpoint")

    @extend_schema(request=None, responses=AgreementSerializer)
    def post(self, request: Request, pk: str) -> Response:
        agreement = services.sla_agreement_sign(actor=request.user, agreement=self.get_object())  # type: ignore[arg-type]
        return Response(AgreementSerializer(agreement).data)


class EndpointProposalView(TenantScopedMixin, generics.GenericAPIView):
    """The customer proposes other targets for an endpoint whose terms are in force; the
    provider countersigns. Credit tiers and the fee are refused (403, audited)."""

    serializer_class = ProposalSerializer
    write_role = Role.ADMIN
    parser_classes = [StrictJSONParser]

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.all()

    @extend_schema(request=ProposalSerializer, responses={201: AgreementSerializer})
    def post(self, request: Request, pk: str) -> Response:
        endpoint = self.get_object()
        serializer = ProposalSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        agreement = services.sla_agreement_propose(
            actor=request.user,
            endpoint=endpoint,  # type: ignore[arg-type]
            terms=dict(serializer.validated_data),
        )
        return Response(AgreementSerializer(agreement).data, status=status.HTTP_201_CREATED)


class EndpointReportView(TenantScopedMixin, generics.GenericAPIView):
    """The endpoint's month (`?month=YYYY-MM`, UTC; default the current one) judged at the edge
    on every criterion of the terms in force, with the engine's histogram figure beside it."""

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.all()

    @extend_schema(
        parameters=[OpenApiParameter("month", str, required=False, description="YYYY-MM (UTC)")],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, pk: str) -> Response:
        endpoint: Any = self.get_object()
        raw = request.query_params.get("month")
        try:
            moment = sla.parse_month(raw) if raw else timezone.now()
        except ValueError as exc:
            raise ValidationError({"month": [str(exc)]}) from None
        agreement = selectors.sla_agreement_in_force(endpoint=endpoint)
        if agreement is None:
            return Response({"agreement": None, "report": None})
        start, end = sla.month_window(moment)
        return Response(
            {
                "agreement": AgreementSerializer(agreement).data,
                "report": selectors.sla_window(agreement=agreement, window_start=start, window_end=end),
            }
        )


class EvidencePackView(TenantScopedMixin, generics.GenericAPIView):
    """The compliance evidence pack for one month (`?month=YYYY-MM`, default the current one): a
    zip an auditor checks with `python -m compliance.verify_export` (owners and admins)."""

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.none()

    @extend_schema(
        parameters=[OpenApiParameter("month", str, required=False, description="YYYY-MM (UTC)")],
        responses={(200, "application/zip"): OpenApiTypes.BINARY},
    )
    def get(self, request: Request) -> HttpResponse:
        assert self.tenant is not None
        raw = request.query_params.get("month")
        try:
            month = sla.parse_month(raw) if raw else sla.month_window(timezone.now())[0]
        except ValueError as exc:
            raise ValidationError({"month": [str(exc)]}) from None
        name, body = evidence.evidence_pack_build(
            actor=request.user,
            organization=self.tenant.organization,
            month=month,
        )
        response = HttpResponse(body, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
