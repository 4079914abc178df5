"""REST API of endpoints (routed from portal/api/urls.py): the organization's endpoints, deploying
a tuning job's winner (once per `Idempotency-Key`), promoting another job's winner, stopping and
starting again, the live metrics the endpoint page charts, and the continual loop's policy.

Thin: every write is a service of `portal.endpoints` (which checks the role again, under the
token's cap) and every read a selector. Members and above change things; viewers read.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.accounts.models import Role
from portal.endpoints import policy, selectors, services
from portal.endpoints.models import Endpoint, EndpointRevision
from portal.jobs.models import TuningJob
from portal.restkit import fields as api_fields
from portal.restkit import jsonsafe
from portal.restkit.base import TenantScopedMixin
from portal.restkit.parsers import StrictJSONParser

IDEMPOTENCY_HEADER = "Idempotency-Key"


class EndpointSerializer(api_fields.ModelSerializer):
    served_model = serializers.UUIDField(source="served_model_id", read_only=True)
    model_name = api_fields.CharField(source="served_model.name", read_only=True)
    job = serializers.UUIDField(source="job_id", read_only=True, allow_null=True)
    pool = api_fields.CharField(source="pool.name", read_only=True, allow_null=True)
    base_url = serializers.SerializerMethodField(help_text="The OpenAI base URL clients use (ends in /v1).")
    model = serializers.SerializerMethodField(
        help_text="The `model` every request names: the name the engine serves (GET {base_url}/models lists it)."
    )
    config = serializers.DictField(read_only=True, help_text="The engine configuration now serving.")
    moe_tables = serializers.SerializerMethodField(
        help_text="The tuned fused-MoE table files (vLLM's file names) the engine reads; empty: vLLM's own."
    )
    moe_tables_note = api_fields.CharField(
        read_only=True, help_text="Why a tuning job's MoE tables were not shipped with it, if they were not."
    )

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "name",
            "status",
            "status_detail",
            "served_model",
            "model_name",
            "job",
            "pool",
            "base_url",
            "model",
            "api_key_prefix",
            "config",
            "moe_tables",
            "moe_tables_note",
            "created_at",
            "stopped_at",
        ]
        read_only_fields = fields

    def get_moe_tables(self, endpoint: Endpoint) -> list[str]:
        return sorted(endpoint.moe_tables or {})

    def get_base_url(self, endpoint: Endpoint) -> str:
        return selectors.endpoint_base_url(endpoint)

    def get_model(self, endpoint: Endpoint) -> str:
        return selectors.endpoint_model_id(endpoint)


class EndpointKeySerializer(EndpointSerializer):
    api_key = api_fields.CharField(
        read_only=True,
        allow_null=True,
        help_text="The endpoint's API key, shown only in the response that made it; null on a replay.",
    )

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "api_key"]
        read_only_fields = fields


class RevisionSerializer(api_fields.ModelSerializer):
    job = serializers.UUIDField(source="job_id", read_only=True, allow_null=True)
    config = serializers.DictField(read_only=True)

    class Meta:
        model = EndpointRevision
        fields = [
            "generation",
            "config",
            "reason",
            "job",
            "trial_number",
            "measured_ttft_p50_ms",
            "measured_ttft_p95_ms",
            "measured_tokens_per_s",
            "moe_tables_digest",
            "moe_tables_note",
            "created_at",
        ]
        read_only_fields = fields


class DeploySerializer(serializers.Serializer):
    name = api_fields.CharField(
        max_length=120, required=False, allow_blank=True, default="", help_text="Default: '<model> (tuned)'."
    )
    pool = api_fields.CharField(
        max_length=63, required=False, allow_null=True, default=None, help_text="Default: the job's pool."
    )


class PromoteSerializer(serializers.Serializer):
    job = serializers.UUIDField(help_text="A finished tuning job of the same model, with a winner.")


def _limit(name: str) -> dict[str, int]:
    low, high, _message = policy.POLICY_LIMITS[name]
    return {"min_value": low, "max_value": high}


class PolicySerializer(serializers.Serializer):
    """The continual loop's policy; the bounds are `portal.endpoints.policy.POLICY_LIMITS`."""

    auto_retune = serializers.BooleanField(help_text="Re-tune automatically on drift or SLO erosion.")
    retune_cooldown_s = serializers.IntegerField(**_limit("retune_cooldown_s"))
    retune_max_per_day = serializers.IntegerField(**_limit("retune_max_per_day"))
    retune_budget_trials = serializers.IntegerField(**_limit("retune_budget_trials"))
    detect_window_s = serializers.IntegerField(**_limit("detect_window_s"))


class MetricsSerializer(serializers.Serializer):
    """What the endpoint page charts, for one range (`portal.endpoints.selectors.endpoint_dashboard`)."""

    range = serializers.ChoiceField(choices=list(selectors.RANGES))
    status = api_fields.CharField()
    slo = serializers.DictField(help_text="The SLO the endpoint was tuned for (p50/p95 TTFT targets).")
    series = serializers.DictField(
        help_text="Aligned lists: `taken_at` and one per metric; null where nothing was measured."
    )
    sla = serializers.DictField(
        help_text="SLA compliance per window (the SLA terms', or the SLO's per hour)."
    )
    history = serializers.ListField(child=serializers.DictField(), help_text="Every generation, in order.")
    serving_generation = serializers.IntegerField(allow_null=True)
    iterations = serializers.ListField(child=serializers.DictField(), help_text="The loop's, newest first.")
    last_snapshot = serializers.DictField(allow_null=True)


def _write(request: Request, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class EndpointListView(TenantScopedMixin, generics.ListAPIView):
    """The organization's endpoints, newest first (stopped ones included)."""

    serializer_class = EndpointSerializer

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.select_related("served_model", "pool").order_by("-created_at")


class EndpointDetailView(TenantScopedMixin, generics.RetrieveAPIView):
    serializer_class = EndpointSerializer

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.select_related("served_model", "pool")


class _EndpointAction(TenantScopedMixin, generics.GenericAPIView):
    serializer_class = EndpointSerializer
    write_role = Role.MEMBER
    parser_classes = [StrictJSONParser]

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.select_related("organization", "served_model", "pool", "job")


class JobDeployView(_EndpointAction):
    """Deploy the job's winner as a new endpoint. Send an `Idempotency-Key` header: the same key
    for the same job again (a retry, a double click) answers 200 with the endpoint it made and
    no key; the first answers 201 with the endpoint's API key, shown this once."""

    def tenant_queryset(self) -> QuerySet[TuningJob]:  # type: ignore[override]
        return TuningJob.objects.select_related("organization", "served_model", "pool")

    @extend_schema(
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                # A raw schema: the bounds are part of the contract (a fuzzer tries past them).
                {"type": "string", "minLength": 1, "maxLength": services.IDEMPOTENCY_KEY_MAX},
                location=OpenApiParameter.HEADER,
                required=True,
                description="Any text, new for each deploy (a UUID will do).",
            )
        ],
        request=DeploySerializer,
        responses={201: EndpointKeySerializer, 200: EndpointKeySerializer},
    )
    def post(self, request: Request, pk: str) -> Response:
        job: Any = self.get_object()
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if not key or len(key) > services.IDEMPOTENCY_KEY_MAX:
            raise ValidationError(
                {
                    IDEMPOTENCY_HEADER: [
                        f"Send an {IDEMPOTENCY_HEADER} header of 1 to {services.IDEMPOTENCY_KEY_MAX} "
                        "characters, new for each deploy: a retry with the same key deploys once."
                    ]
                }
            )
        data = _write(request, DeploySerializer)
        endpoint, api_key = services.endpoint_deploy_keyed(
            actor=request.user,
            job=job,
            idempotency_key=key,
            name=data["name"],
            pool=data["pool"],
        )
        body = {**EndpointSerializer(endpoint).data, "api_key": api_key}
        return Response(body, status=status.HTTP_201_CREATED if api_key is not None else status.HTTP_200_OK)


class EndpointPromoteView(_EndpointAction):
    """Re-deploy a running endpoint with another job's winner, at the same address and key; the
    old engine drains once the new one is healthy. Answers the new generation."""

    @extend_schema(request=PromoteSerializer, responses={201: RevisionSerializer})
    def post(self, request: Request, pk: str) -> Response:
        endpoint: Any = self.get_object()
        data = _write(request, PromoteSerializer)
        assert self.tenant is not None
        # Looked up inside the organization: another tenant's job is simply not found.
        job = TuningJob.objects.filter(organization=self.tenant.organization, id=data["job"]).first()
        if job is None:
            raise ValidationError({"job": ["No such tuning job."]})
        revision = services.endpoint_promote(actor=request.user, endpoint=endpoint, job=job)
        return Response(RevisionSerializer(revision).data, status=status.HTTP_201_CREATED)


class EndpointStopView(_EndpointAction):
    """Revoke the endpoint's key at once and stop it in the background (status `stopping`, then
    `stopped`). Stopping a stopped endpoint is a 400."""

    @extend_schema(request=None, responses={202: EndpointSerializer})
    def post(self, request: Request, pk: str) -> Response:
        endpoint: Any = self.get_object()
        services.endpoint_stop(actor=request.user, endpoint=endpoint)
        endpoint.refresh_from_db()
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_202_ACCEPTED)


class EndpointStartView(_EndpointAction):
    """Start a stopped (or failed) endpoint again with its last configuration (a pool's endpoint
    on whichever host of the pool takes it: read `base_url` again once it is healthy). A stopped
    endpoint's key was revoked: the answer carries its new key, shown this once (null where a
    failed endpoint kept its key). A running one is a 400."""

    @extend_schema(request=None, responses={202: EndpointKeySerializer})
    def post(self, request: Request, pk: str) -> Response:
        endpoint, api_key = services.endpoint_start_again(
            actor=request.user,
            endpoint=self.get_object(),  # type: ignore[arg-type]
        )
        body = {**EndpointSerializer(endpoint).data, "api_key": api_key}
        return Response(body, status=status.HTTP_202_ACCEPTED)


class EndpointMetricsView(TenantScopedMixin, generics.GenericAPIView):
    """Live metrics over a range (`15m`, `1h` every scrape; `6h`, `24h`, `7d` bucketed), the SLO, SLA
    compliance per window, the optimization history and the loop's iterations: the data the
    endpoint page charts. Gaps are null, never zeros."""

    serializer_class = MetricsSerializer

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.select_related("organization", "served_model", "job", "pool")

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "range", str, enum=list(selectors.RANGES), description=f"Default {selectors.DEFAULT_RANGE}."
            )
        ],
        responses=MetricsSerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        endpoint: Any = self.get_object()
        asked = request.query_params.getlist("range")
        if len(asked) > 1 or (asked and asked[0] not in selectors.RANGES):
            raise ValidationError({"range": [f"Give `range` once, one of: {', '.join(selectors.RANGES)}."]})
        range_name = asked[0] if asked else selectors.DEFAULT_RANGE
        data = selectors.endpoint_dashboard(
            endpoint=endpoint, range_name=range_name, now=selectors.dashboard_now()
        )
        body = {
            "range": range_name,
            "status": endpoint.status,
            **{name: data[name] for name in ("slo", "series", "sla", "serving_generation", "iterations")},
            # The page's own display copy of each row ("when") is the ISO `created_at` here.
            "history": [{k: v for k, v in row.items() if k != "when"} for row in data["history"]],
            "last_snapshot": data["last_snapshot"],
        }
        return Response(jsonsafe.finite(body))


class EndpointPolicyView(TenantScopedMixin, generics.GenericAPIView):
    """The continual loop's re-tuning policy: read it (everyone), replace it (members and above;
    every field, each within its bounds; a change is audited)."""

    serializer_class = PolicySerializer
    write_role = Role.MEMBER
    parser_classes = [StrictJSONParser]

    def tenant_queryset(self) -> QuerySet[Endpoint]:
        return Endpoint.objects.select_related("organization")

    @extend_schema(responses=PolicySerializer)
    def get(self, request: Request, pk: str) -> Response:
        return Response(PolicySerializer(policy.policy_values(self.get_object())).data)  # type: ignore[arg-type]

    @extend_schema(request=PolicySerializer, responses=PolicySerializer)
    def put(self, request: Request, pk: str) -> Response:
        endpoint: Any = self.get_object()
        data = _write(request, PolicySerializer)
        endpoint = policy.endpoint_policy_set(actor=request.user, endpoint=endpoint, **data)
        return Response(PolicySerializer(policy.policy_values(endpoint)).data)


__all__ = [
    "EndpointDetailView",
    "EndpointListView",
    "EndpointMetricsView",
    "EndpointPolicyView",
    "EndpointPromoteView",
    "EndpointStartView",
    "EndpointStopView",
    "JobDeployView",
]
