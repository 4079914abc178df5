"""REST API of benchmark reports (routed from portal/api/urls.py): create one, poll its status,
read its result, and make (list, revoke) the customer's share links.

Benchmark reports are the sales engineers' tool: to anyone else (the prospect's own members
included) every route answers 404, as the staff pages do, so their existence is not advertised.
Through the API they are tenant-scoped like every other row: a sales engineer works on the
reports of the organization their session or token acts in (a member there, writes as a member
or above, within the token's cap). The cross-organization console stays on the staff pages.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, ClassVar

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, permissions, serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.accounts.models import Role
from portal.benchmarks import selectors, services
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink, BenchmarkTarget
from portal.restkit import fields as api_fields
from portal.restkit import jsonsafe
from portal.restkit.base import TenantRolePermission, TenantScopedMixin
from portal.restkit.parsers import StrictJSONParser
from portal.traffic.models import TrafficSample


class BenchmarkStaffPermission(permissions.BasePermission):
    """Sales engineers and platform admins; everyone else is told nothing exists (404)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not selectors.user_is_benchmark_staff(request.user):
            raise NotFound()
        return True


class _BenchmarkView(TenantScopedMixin):
    # Staff first: a prospect's viewer learns nothing from a 403 about the role a write needs.
    permission_classes: ClassVar = [
        permissions.IsAuthenticated,
        BenchmarkStaffPermission,
        TenantRolePermission,
    ]
    write_role = Role.MEMBER
    parser_classes: ClassVar = [StrictJSONParser]
    extra_error_statuses = (404,)  # every route, lists included, is a 404 to non-staff


# --- Serializers ------------------------------------------------------------------------------

_PRICE = {
    "max_digits": 12,
    "decimal_places": 4,
    "min_value": Decimal("0"),
    "required": False,
    "allow_null": True,
}
_TOKENS = {
    "min_value": 1,
    "max_value": services.MAX_TOKENS_CAP,
    "required": False,
    "allow_null": True,
    "default": None,
}


class TargetWriteSerializer(serializers.Serializer):
    name = api_fields.CharField(max_length=80)
    base_url = api_fields.CharField(
        max_length=500, help_text="OpenAI-compatible, e.g. https://api.example.com/v1"
    )
    model = api_fields.CharField(max_length=200)
    api_key = api_fields.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        default="",
        help_text="Stored sealed, never shown again.",
    )
    pricing = serializers.ChoiceField(choices=BenchmarkTarget.Pricing.choices)
    price_per_hour_usd = serializers.DecimalField(**_PRICE)
    price_input_per_mtok_usd = serializers.DecimalField(**_PRICE)
    price_output_per_mtok_usd = serializers.DecimalField(**_PRICE)
    send_ignore_eos = serializers.BooleanField(
        default=False, help_text="vLLM targets: outputs as long as the trace says (providers may refuse it)."
    )


class ReportCreateSerializer(serializers.Serializer):
    traffic_sample = serializers.UUIDField(help_text="A ready sample of this organization.")
    name = api_fields.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        default="",
        help_text="Default: the sample and targets.",
    )
    traffic_source = serializers.ChoiceField(
        choices=BenchmarkReport.TrafficSource.choices, default=BenchmarkReport.TrafficSource.PROSPECT
    )
    load_multipliers = serializers.ListField(
        child=serializers.FloatField(min_value=0, max_value=services.MAX_MULTIPLIER),
        min_length=1,
        max_length=services.MAX_LEVELS,
        help_text="Multiples of the sample's peak rate, each above 0, each once.",
    )
    duration_s = serializers.FloatField(min_value=1, max_value=3600, help_text="Per load level and target.")
    request_timeout_s = serializers.FloatField(min_value=1, max_value=600, default=60.0)
    max_prompt_tokens = serializers.IntegerField(**_TOKENS)
    max_output_tokens = serializers.IntegerField(**_TOKENS)
    targets = serializers.ListField(
        child=TargetWriteSerializer(), min_length=1, max_length=services.MAX_TARGETS
    )


class ReportSerializer(api_fields.ModelSerializer):
    """A report's settings and progress (`status`: queued, running, succeeded, failed)."""

    traffic_sample = serializers.UUIDField(source="traffic_sample_id", read_only=True, allow_null=True)
    load_multipliers = serializers.ListField(child=serializers.FloatField(), read_only=True)
    sample_summary = serializers.DictField(read_only=True)
    cells_done = serializers.SerializerMethodField(
        help_text="Replays finished (one per load level and target)."
    )
    cells_total = serializers.SerializerMethodField()

    class Meta:
        model = BenchmarkReport
        fields = [
            "id",
            "name",
            "status",
            "error",
            "traffic_sample",
            "sample_name",
            "sample_summary",
            "traffic_source",
            "peak_rps",
            "load_multipliers",
            "duration_s",
            "request_timeout_s",
            "max_prompt_tokens",
            "max_output_tokens",
            "cells_done",
            "cells_total",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_cells_done(self, report: BenchmarkReport) -> int:
        levels = (report.results or {}).get("levels") or []
        return sum(len(level.get("cells") or {}) for level in levels if isinstance(level, dict))

    def get_cells_total(self, report: BenchmarkReport) -> int:
        return len(report.load_multipliers or []) * report.targets.count()


class TargetSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = api_fields.CharField()
    model = api_fields.CharField()
    base_url = api_fields.CharField()
    pricing = serializers.ChoiceField(choices=BenchmarkTarget.Pricing.choices)
    price_label = api_fields.CharField()
    has_api_key = serializers.BooleanField()
    send_ignore_eos = serializers.BooleanField()


class ResultSerializer(serializers.Serializer):
    """The measured table: per load level, one row per target (`cell` null where that replay has
    not run yet; a finished report has every cell, failures counted by kind)."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=BenchmarkReport.Status.choices)
    finished = serializers.BooleanField()
    conditions = serializers.DictField()
    attribution = serializers.DictField(allow_null=True)
    targets = TargetSerializer(many=True)
    levels = serializers.ListField(child=serializers.DictField())


class ShareLinkSerializer(api_fields.ModelSerializer):
    state = serializers.SerializerMethodField()
    created_by = api_fields.EmailField(source="created_by.email", read_only=True, allow_null=True)

    class Meta:
        model = BenchmarkShareLink
        fields = ["id", "state", "created_by", "created_at", "expires_at", "revoked_at", "view_count"]
        read_only_fields = fields

    def get_state(self, link: BenchmarkShareLink) -> str:
        return selectors.share_link_state(link)


class ShareLinkCreatedSerializer(ShareLinkSerializer):
    url = api_fields.CharField(read_only=True, help_text="The customer's link; shown only now.")

    class Meta(ShareLinkSerializer.Meta):
        fields = [*ShareLinkSerializer.Meta.fields, "url"]
        read_only_fields = fields


class ShareLinkCreateSerializer(serializers.Serializer):
    days = serializers.IntegerField(
        min_value=services.SHARE_DAYS_MIN,
        max_value=services.SHARE_DAYS_MAX,
        default=7,
        help_text="Valid for.",
    )


# --- Views ------------------------------------------------------------------------------------


def _spec(data: dict[str, Any]) -> services.TargetSpec:
    return services.TargetSpec(
        name=data["name"],
        base_url=data["base_url"],
        model=data["model"],
        api_key=data["api_key"],
        pricing=data["pricing"],
        price_per_hour_usd=data.get("price_per_hour_usd"),
        price_input_per_mtok_usd=data.get("price_input_per_mtok_usd"),
        price_output_per_mtok_usd=data.get("price_output_per_mtok_usd"),
        send_ignore_eos=data["send_ignore_eos"],
    )


@extend_schema_view(post=extend_schema(request=ReportCreateSerializer, responses={201: ReportSerializer}))
class ReportListCreateView(_BenchmarkView, generics.ListCreateAPIView):
    """The organization's benchmark reports, newest first; create one (it runs in the background:
    poll it until `status` is `succeeded` or `failed`, then read `result/`)."""

    serializer_class = ReportSerializer

    def tenant_queryset(self) -> QuerySet[BenchmarkReport]:
        return BenchmarkReport.objects.prefetch_related("targets").order_by("-created_at")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = ReportCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        assert self.tenant is not None
        # Looked up inside the organization: another tenant's sample is simply not found.
        sample = TrafficSample.objects.filter(
            organization=self.tenant.organization, id=data["traffic_sample"]
        ).first()
        if sample is None:
            raise ValidationError({"traffic_sample": ["No such traffic sample."]})
        report = services.benchmark_report_create(
            actor=request.user,
            traffic_sample=sample,
            targets=[_spec(target) for target in data["targets"]],
            load_multipliers=data["load_multipliers"],
            duration_s=data["duration_s"],
            request_timeout_s=data["request_timeout_s"],
            max_prompt_tokens=data["max_prompt_tokens"],
            max_output_tokens=data["max_output_tokens"],
            traffic_source=data["traffic_source"],
            name=data["name"],
        )
        return Response(ReportSerializer(report).data, status=status.HTTP_201_CREATED)


class ReportDetailView(_BenchmarkView, generics.RetrieveAPIView):
    """A report's status and progress (poll this while it runs)."""

    serializer_class = ReportSerializer

    def tenant_queryset(self) -> QuerySet[BenchmarkReport]:
        return BenchmarkReport.objects.prefetch_related("targets")


class ReportResultView(_BenchmarkView, generics.GenericAPIView):
    serializer_class = ResultSerializer

    def tenant_queryset(self) -> QuerySet[BenchmarkReport]:
        return BenchmarkReport.objects.prefetch_related("targets")

    @extend_schema(responses=ResultSerializer)
    def get(self, request: Request, pk: str) -> Response:
        report: Any = self.get_object()
        view = selectors.benchmark_report_view(report=report)
        attribution = view["attribution"]
        body = {
            "id": report.id,
            "status": report.status,
            "finished": not report.is_pending,
            "conditions": view["conditions"],
            "attribution": None
            if attribution is None
            else {
                "title": attribution.title,
                "source": attribution.source,
                "url": attribution.url,
                "licence": attribution.licence,
            },
            "targets": view["targets"],
            "levels": [
                {
                    "multiplier": level["multiplier"],
                    "rate_rps": level["rate_rps"],
                    "label": level["label"],
                    "num_requests_planned": level["num_requests_planned"],
                    "rows": [
                        {"target": row["target"]["id"], "cell": row["cell"], "errors": row["error_rows"]}
                        for row in level["rows"]
                    ],
                }
                for level in view["levels"]
            ],
        }
        return Response(jsonsafe.finite(ResultSerializer(body).data))


class ShareLinkListCreateView(_BenchmarkView, generics.GenericAPIView):
    """The report's share links (no secrets); make one for a finished report: its URL is in this
    response only (the secret is stored as a digest). The link needs no login and answers 404
    once expired or revoked."""

    serializer_class = ShareLinkSerializer

    def tenant_queryset(self) -> QuerySet[BenchmarkReport]:
        return BenchmarkReport.objects.all()

    @extend_schema(responses=ShareLinkSerializer(many=True))
    def get(self, request: Request, pk: str) -> Response:
        report: Any = self.get_object()
        links = selectors.benchmark_share_links(report=report)
        return self.get_paginated_response(ShareLinkSerializer(self.paginate_queryset(links), many=True).data)

    @extend_schema(request=ShareLinkCreateSerializer, responses={201: ShareLinkCreatedSerializer})
    def post(self, request: Request, pk: str) -> Response:
        report: Any = self.get_object()
        serializer = ShareLinkCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        link, secret = services.benchmark_share_create(
            actor=request.user,
            report=report,
            days=serializer.validated_data["days"],
        )
        url = request.build_absolute_uri(reverse("benchmarks:shared", kwargs={"token": secret}))
        return Response({**ShareLinkSerializer(link).data, "url": url}, status=status.HTTP_201_CREATED)


class ShareLinkDetailView(_BenchmarkView, generics.GenericAPIView):
    """DELETE revokes the link at once (kept, marked revoked, for the audit trail)."""

    serializer_class = ShareLinkSerializer

    def tenant_queryset(self) -> QuerySet[BenchmarkShareLink]:
        return BenchmarkShareLink.objects.select_related("created_by")

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, pk: str, link_id: str) -> Response:
        assert self.tenant is not None
        link = (
            self.get_queryset().filter(report_id=pk, pk=link_id).first()  # the report's own links only
        )
        if link is None:
            raise NotFound()
        services.benchmark_share_revoke(actor=request.user, link=link)
        return Response(status=status.HTTP_204_NO_CONTENT)


__all__ = [
    "ReportDetailView",
    "ReportListCreateView",
    "ReportResultView",
    "ShareLinkDetailView",
    "ShareLinkListCreateView",
]
