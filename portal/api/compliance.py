"""REST API of the compliance app (routed from portal/api/urls.py). It lives in the portal, above
compliance, which depends on no portal app but accounts (issue 22). Thin: serializers check
shape, services decide and write; every view is tenant-scoped through TenantScopedMixin."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser
from rest_framework.request import Request
from rest_framework.response import Response

from compliance import selectors, services, sla
from compliance.models import AuditEvent, BAARecord, ResidencyPolicy
from portal.accounts.models import Organization, Role
from portal.endpoints import selectors as endpoint_selectors
from portal.endpoints.models import Endpoint, SLATerms
from portal.restkit import fields as api_fields
from portal.restkit.base import TenantScopedMixin
from portal.restkit.parsers import LimitedMultiPartParser, StrictJSONParser
from portal.sla import services as sla_services


class ResidencySerializer(serializers.Serializer):
    allowed_regions = serializers.ListField(child=api_fields.CharField(max_length=32), allow_empty=False)
    is_default = serializers.BooleanField(read_only=True)


class RetentionSerializer(serializers.Serializer):
    sample_retention_days = serializers.IntegerField(min_value=1, max_value=3650)
    metric_retention_days = serializers.IntegerField(
        min_value=35, max_value=3650, required=False, allow_null=True
    )
    retain_prompt_text = serializers.BooleanField(default=False)


class BAASerializer(api_fields.ModelSerializer):
    recorded_by = api_fields.EmailField(source="recorded_by.email", read_only=True, allow_null=True)
    document_sha256 = api_fields.CharField(source="document.sha256", read_only=True, allow_null=True)
    document_region = api_fields.CharField(source="document.region", read_only=True, allow_null=True)
    countersigned_by = api_fields.EmailField(source="countersigned_by.email", read_only=True, allow_null=True)

    class Meta:
        model = BAARecord
        fields = [
            "id",
            "counterparty",
            "version",
            "signed_on",
            "effective_on",
            "ends_on",
            "recorded_by",
            "recorded_at",
            "document_sha256",
            "document_region",
            "countersigned_by",
            "countersigned_at",
        ]
        read_only_fields = [
            "id",
            "recorded_by",
            "recorded_at",
            "document_sha256",
            "document_region",
            "countersigned_by",
            "countersigned_at",
        ]


class BAACreateSerializer(BAASerializer):
    document = serializers.FileField(required=False, write_only=True)

    class Meta(BAASerializer.Meta):
        fields = [*BAASerializer.Meta.fields, "document"]


class AuditEventSerializer(api_fields.ModelSerializer):
    # The public id: the sequential key counts every tenant's events (see AuditEvent).
    id = serializers.UUIDField(source="public_id", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "seq",
            "created_at",
            "actor_label",
            "action",
            "target_type",
            "target_id",
            "request_id",
            "data",
            "before_digest",
            "after_digest",
            "prev_hash",
            "hash",
        ]
        read_only_fields = fields


class OrganizationDeleteSerializer(serializers.Serializer):
    confirm = api_fields.CharField(max_length=64, help_text="The organization's slug.")


class _OrganizationView(TenantScopedMixin, generics.GenericAPIView):
    """Settings that belong to the organization itself (one per tenant)."""

    def tenant_queryset(self) -> QuerySet[Any]:
        # Nothing is looked up by id here; the organization is the tenant itself.
        return ResidencyPolicy.objects.none()

    @property
    def organization(self) -> Organization:
        assert self.tenant is not None
        return self.tenant.organization


class ResidencyView(_OrganizationView):
    serializer_class = ResidencySerializer
    write_role = Role.OWNER

    def _body(self) -> dict[str, Any]:
        return {
            "allowed_regions": selectors.allowed_regions(organization=self.organization),
            "is_default": selectors.residency_is_default(organization=self.organization),
        }

    def get(self, request: Request) -> Response:
        return Response(self._body())

    def put(self, request: Request) -> Response:
        serializer = ResidencySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.residency_policy_set(
            actor=request.user, organization=self.organization, **serializer.validated_data
        )
        return Response(self._body())


class RetentionView(_OrganizationView):
    serializer_class = RetentionSerializer
    write_role = Role.OWNER

    def get(self, request: Request) -> Response:
        return Response(selectors.retention_settings(organization=self.organization))

    def put(self, request: Request) -> Response:
        serializer = RetentionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.retention_policy_set(
            actor=request.user, organization=self.organization, **serializer.validated_data
        )
        return Response(selectors.retention_settings(organization=self.organization))


# The schema is generated from `post`; a decorator on `create` was ignored there.
@extend_schema_view(post=extend_schema(request=BAACreateSerializer, responses={201: BAASerializer}))
class BAAListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    """Record a signed BAA (multipart, with the signed document) or list them."""

    serializer_class = BAASerializer
    parser_classes = [LimitedMultiPartParser, FormParser, StrictJSONParser]
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[BAARecord]:
        return BAARecord.objects.select_related("document", "recorded_by", "countersigned_by")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = BAACreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        record = services.baa_record_create(
            actor=request.user, organization=self.tenant.organization, **serializer.validated_data
        )
        return Response(BAASerializer(record).data, status=status.HTTP_201_CREATED)


class BAADetailView(TenantScopedMixin, generics.RetrieveAPIView):
    serializer_class = BAASerializer

    def tenant_queryset(self) -> QuerySet[BAARecord]:
        return BAARecord.objects.select_related("document", "recorded_by", "countersigned_by")


class AuditEventListView(TenantScopedMixin, generics.ListAPIView):
    serializer_class = AuditEventSerializer

    def tenant_queryset(self) -> QuerySet[AuditEvent]:
        return AuditEvent.objects.order_by("-seq")


class AuditExportView(_OrganizationView):
    """The organization's whole audit chain, with hashes, as a CSV or JSON download (admins)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("export_format", str, enum=["json", "csv"], default="json"),
            OpenApiParameter("region", str, required=False, description="Must be an allowed region."),
        ],
        responses={(200, "application/json"): OpenApiTypes.OBJECT, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponse:
        name, body = services.audit_export(
            actor=request.user,
            organization=self.organization,
            fmt=request.query_params.get("export_format", "json"),
            region=request.query_params.get("region") or None,
        )
        response = HttpResponse(
            body, content_type="application/json" if name.endswith(".json") else "text/csv"
        )
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


class OrganizationDataDeleteView(_OrganizationView):
    """Deletes all of the organization's data in every region; the audit trail remains."""

    serializer_class = OrganizationDeleteSerializer
    write_role = Role.OWNER

    @extend_schema(request=OrganizationDeleteSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        serializer = OrganizationDeleteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        counts = services.organization_data_delete(
            actor=request.user, organization=self.organization, confirm=serializer.validated_data["confirm"]
        )
        return Response(counts)


class CreditTierSerializer(serializers.Serializer):
    below_pct = serializers.FloatField(min_value=0, max_value=100)
    credit_pct = serializers.FloatField(min_value=0, max_value=100)


class SLATermsSerializer(serializers.Serializer):
    metric = serializers.ChoiceField(choices=SLATerms.Metric.choices, default=SLATerms.Metric.TTFT_P50)
    target_ms = serializers.FloatField(min_value=0)
    source = serializers.ChoiceField(choices=SLATerms.Source.choices, default=SLATerms.Source.ENGINE)
    credit_tiers = CreditTierSerializer(
        many=True,
        required=False,
        default=list,
        help_text="Tiers stored before SLA agreements existed. Customers do not set credits here: "
        "tiers other than the stored ones are refused (403, audited); credits come with the SLA "
        "agreement the provider proposes and the organization signs.",
    )
    min_coverage_pct = serializers.FloatField(min_value=0, max_value=100, default=90.0)


class EndpointSLASerializer(serializers.Serializer):
    terms = SLATermsSerializer(allow_null=True)
    report = serializers.DictField(
        allow_null=True, help_text="The window's compliance, breaches, gaps and credit."
    )
    frozen = serializers.BooleanField(help_text="True for a closed window's stored result.")


class EndpointSLAView(TenantScopedMixin, generics.GenericAPIView):
    """An endpoint's SLA terms and its compliance for one month (UTC; `?month=YYYY-MM`, default
    the current one), computed from stored metric snapshots; closed months come frozen."""

    serializer_class = EndpointSLASerializer
    write_role = Role.ADMIN
    # `credit_tiers` is a list of objects, which a form body cannot carry as the schema says:
    # DRF read a multipart `credit_tiers` part as absent and saved the terms without the tiers.
    parser_classes = [StrictJSONParser]

    def tenant_queryset(self) -> QuerySet[Any]:
        return Endpoint.objects.all()

    def _body(self, endpoint: Any) -> dict[str, Any]:
        terms = endpoint_selectors.sla_terms_get(endpoint=endpoint)
        if terms is None:
            return {"terms": None, "report": None, "frozen": False}
        month = self.request.query_params.get("month")
        moment = None
        if month:
            try:
                moment = sla.parse_month(month)
            except ValueError as exc:
                raise ValidationError({"month": [str(exc)]}) from None
        stored = terms.reports.filter(window_start=moment).first() if moment is not None else None
        if stored is not None:
            report, frozen = stored.result, True
        else:
            report, frozen = (
                selectors.sla_report_json(endpoint_selectors.sla_report(terms=terms, moment=moment), terms),
                False,
            )
        return {"terms": SLATermsSerializer(terms).data, "report": report, "frozen": frozen}

    @extend_schema(
        parameters=[OpenApiParameter("month", str, required=False, description="YYYY-MM (UTC)")],
        responses=EndpointSLASerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(self._body(self.get_object()))

    @extend_schema(request=SLATermsSerializer, responses=EndpointSLASerializer)
    def put(self, request: Request, pk: str) -> Response:
        endpoint = self.get_object()
        serializer = SLATermsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        data["credit_tiers"] = [dict(t) for t in data.get("credit_tiers", [])]
        sla_services.sla_terms_set(actor=request.user, endpoint=endpoint, **data)
        return Response(self._body(endpoint))
