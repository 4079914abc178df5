"""API serializers: shape and field validation only; services decide and write."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.accounts.models import ApiToken, Invitation, Membership, Organization, Role, User
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.jobs.services import BUDGET_HELP
from portal.restkit import fields as api_fields
from portal.traffic.models import TrafficSample
from tuning.search.job import (
    BUDGET_MIN_ERROR,
    DEFAULT_CAPACITY_STEPS,
    MAX_BUDGET_TRIALS,
    MAX_CAPACITY_MULTIPLE,
    MAX_CAPACITY_STEPS,
    MAX_CONFIRM_REPEATS,
    MAX_PEAK_RPS,
    MAX_TOKENS,
    MIN_BUDGET_TRIALS,
)
from tuning.workload.synth import MIN_LENGTH_SCALE

# A free-form object that may be absent (null), e.g. a job's selection before it has one.
NULLABLE_OBJECT = {"type": "object", "additionalProperties": {}, "nullable": True}


class SignupSerializer(serializers.Serializer):
    email = api_fields.EmailField(max_length=254)
    password = api_fields.CharField(max_length=128, write_only=True, style={"input_type": "password"})
    full_name = api_fields.CharField(max_length=200, required=False, allow_blank=True, default="")


class UserSerializer(api_fields.ModelSerializer):
    class Meta:
        model = User
        fields = ["id", "email", "full_name", "staff_role"]
        read_only_fields = fields


class OrganizationSerializer(api_fields.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Organization
        fields = ["id", "name", "slug", "created_at", "role"]
        read_only_fields = ["id", "slug", "created_at", "role"]

    def get_role(self, obj: Organization) -> str | None:
        roles: dict[object, str] = self.context.get("roles", {})
        return roles.get(obj.id)


class MembershipSerializer(api_fields.ModelSerializer):
    email = api_fields.EmailField(source="user.email", read_only=True)
    full_name = api_fields.CharField(source="user.full_name", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "full_name", "role", "created_at"]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    user = UserSerializer()
    current_organization = OrganizationSerializer(allow_null=True)
    organizations = OrganizationSerializer(many=True)


class ActiveOrganizationSerializer(serializers.Serializer):
    organization = serializers.UUIDField()


class InvitationSerializer(api_fields.ModelSerializer):
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "created_at", "expires_at", "sent_at", "accepted_at", "revoked_at"]
        read_only_fields = ["id", "created_at", "expires_at", "sent_at", "accepted_at", "revoked_at"]
        # Uniqueness and the rest are the service's decision.
        validators: list[object] = []


class InvitationAcceptSerializer(serializers.Serializer):
    token = api_fields.CharField(max_length=200, help_text="The secret at the end of the emailed link.")


class ApiTokenSerializer(api_fields.ModelSerializer):
    created_by = api_fields.EmailField(source="created_by.email", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "role", "created_by", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "role", "created_by", "created_at", "last_used_at", "revoked_at"]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = api_fields.CharField(read_only=True, help_text="The secret. Shown only in this response.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = [*ApiTokenSerializer.Meta.read_only_fields, "token"]


class TrafficSampleSerializer(api_fields.ModelSerializer):
    class Meta:
        model = TrafficSample
        fields = [
            "id",
            "name",
            "requested_format",
            "detected_format",
            "status",
            "size_bytes",
            "progress_bytes",
            "error",
            "profile",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class TrafficSampleUploadSerializer(serializers.Serializer):
    name = api_fields.CharField(max_length=120)
    trace_format = serializers.ChoiceField(
        choices=TrafficSample.Format.choices, default=TrafficSample.Format.AUTO
    )
    file = serializers.FileField(allow_empty_file=False)
    contains_phi = serializers.BooleanField(
        required=False, default=False, help_text="The log holds protected health information (needs a BAA)."
    )


class ServedModelSerializer(api_fields.ModelSerializer):
    class Meta:
        model = ServedModel
        fields = ["id", "name", "path", "architecture", "num_params", "created_at"]
        read_only_fields = ["id", "architecture", "num_params", "created_at"]
        validators: list[object] = []


class TrialSerializer(api_fields.ModelSerializer):
    result = serializers.SerializerMethodField()

    class Meta:
        model = Trial
        fields = [
            "number",
            "label",
            "assignment",
            "status",
            "attempts",
            "result",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(NULLABLE_OBJECT)
    def get_result(self, obj: Trial) -> dict[str, object] | None:
        # The golden-set answers are bulky and of no use to a client.
        return {k: v for k, v in (obj.result or {}).items() if k != "capture"} or None


class TuningJobSerializer(api_fields.ModelSerializer):
    trials = TrialSerializer(many=True, read_only=True)
    pool = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="The hardware pool's name (null: none)."
    )
    selection = serializers.SerializerMethodField()
    confirmation = serializers.SerializerMethodField()
    caps = serializers.SerializerMethodField()
    moe_tables = serializers.SerializerMethodField(
        help_text="The fused-MoE table files (vLLM's file names) the job's last step tuned; empty: none."
    )

    class Meta:
        model = TuningJob
        fields = [
            "id",
            "name",
            "traffic_sample",
            "served_model",
            "spec",
            "status",
            "cancel_requested",
            "error",
            "winner_trial",
            "phase",
            "pool",
            "selection",
            "confirmation",
            "caps",
            "moe_tables",
            "moe_tables_note",
            "trials",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(NULLABLE_OBJECT)
    def get_selection(self, obj: TuningJob) -> dict[str, object] | None:
        return obj.report_section("selection")

    @extend_schema_field(NULLABLE_OBJECT)
    def get_confirmation(self, obj: TuningJob) -> dict[str, object] | None:
        return obj.report_section("confirmation")

    @extend_schema_field(NULLABLE_OBJECT)
    def get_caps(self, obj: TuningJob) -> dict[str, object] | None:
        return obj.report_section("caps")

    def get_moe_tables(self, obj: TuningJob) -> list[str]:
        return sorted(obj.moe_tables or {})


class TuningJobCreateSerializer(serializers.Serializer):
    name = api_fields.CharField(max_length=120, required=False, allow_blank=True, default="")
    traffic_sample = serializers.UUIDField()
    served_model = serializers.UUIDField()
    slo = api_fields.CharField(max_length=300, help_text='e.g. "ttft_p50_ms<=600,ttft_p95_ms<=1500"')
    peak_rps = serializers.FloatField(min_value=0.001, max_value=MAX_PEAK_RPS)
    headroom = serializers.FloatField(default=1.25, min_value=1.0, max_value=10.0)
    hardware = api_fields.CharField(default="local-cpu")
    pool = api_fields.CharField(
        max_length=63,
        required=False,
        allow_null=True,
        default=None,
        help_text="Hardware pool whose hosts run the trials (GET /api/v1/pools/); it sets the hardware. Null: this deployment's workers.",
    )
    budget_trials = serializers.IntegerField(
        default=6,
        min_value=MIN_BUDGET_TRIALS,
        max_value=MAX_BUDGET_TRIALS,
        help_text=BUDGET_HELP,
        error_messages={"min_value": BUDGET_MIN_ERROR},
    )
    strategy = serializers.ChoiceField(choices=["tpe", "grid"], default="tpe")
    duration_s = serializers.FloatField(default=20.0, min_value=5, max_value=3600)
    repeats = serializers.IntegerField(default=2, min_value=1, max_value=10)
    confirm_repeats = serializers.IntegerField(
        default=3,
        min_value=0,
        max_value=MAX_CONFIRM_REPEATS,
        help_text="Interleaved confirmation rounds (3 or more; 0 skips confirmation: the result is unconfirmed).",
    )
    capacity_steps = serializers.ListField(
        child=serializers.FloatField(min_value=1.0, max_value=MAX_CAPACITY_MULTIPLE),
        max_length=MAX_CAPACITY_STEPS,
        default=list(DEFAULT_CAPACITY_STEPS),
        help_text="Load multiples of the target tried in each trial while the SLO holds, rising ([] skips the probe).",
    )
    max_prompt_tokens = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_TOKENS,
        help_text="Cap on replayed prompts; null: the sample's p99 within the hardware's replay limit.",
    )
    max_output_tokens = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_TOKENS
    )
    max_model_len = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=16, max_value=MAX_TOKENS
    )
    length_scale = serializers.FloatField(
        default=1.0,
        min_value=MIN_LENGTH_SCALE,
        max_value=1.0,
        help_text=(
            "Replay every prompt and output at this factor of its length (1: real lengths); the caps "
            "apply to the scaled lengths, and the job's caps line states the factor and the share shortened."
        ),
    )


# --- Billing (issue 10) -----------------------------------------------------------------------
from portal.billing.models import UsageReport  # noqa: E402


class BillingAccountSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    how_to_enable = api_fields.CharField(allow_blank=True)
    status = api_fields.CharField()
    plan = api_fields.CharField(allow_blank=True)
    current_period_end = serializers.DateTimeField(allow_null=True)
    usage_billed_from = serializers.DateTimeField(allow_null=True)
    plans = serializers.ListField(child=api_fields.CharField())


class BillingUsageLineSerializer(serializers.Serializer):
    meter = api_fields.CharField()
    dimension = api_fields.CharField(allow_blank=True, help_text="Hardware type of endpoint hours.")
    duration_ms = serializers.IntegerField()
    billable_minutes = serializers.IntegerField(help_text="Rounded per UTC hour; billed or to be billed.")
    reported_minutes = serializers.IntegerField(help_text="Already accepted by Stripe.")
    pending_minutes = serializers.IntegerField()
    unbilled_minutes = serializers.IntegerField(help_text="Usage before the subscription started.")


class BillingUsageSerializer(serializers.Serializer):
    month = api_fields.CharField(help_text="YYYY-MM (UTC)")
    lines = BillingUsageLineSerializer(many=True)


class UsageReportSerializer(api_fields.ModelSerializer):
    class Meta:
        model = UsageReport
        fields = [
            "id",
            "meter",
            "dimension",
            "hour",
            "sequence",
            "quantity",
            "event_name",
            "idempotency_key",
            "status",
            "attempts",
            "error",
            "created_at",
            "sent_at",
        ]
        read_only_fields = fields


class BillingCheckoutSerializer(serializers.Serializer):
    plan = api_fields.CharField(max_length=64)


class BillingRedirectSerializer(serializers.Serializer):
    url = api_fields.URLField(help_text="Send the person here (Stripe Checkout or the customer portal).")


class ReauthenticateSerializer(serializers.Serializer):
    password = api_fields.CharField(max_length=128, trim_whitespace=False)
    code = api_fields.CharField(
        max_length=32, required=False, allow_blank=True, default="", help_text="Once two-factor is set up."
    )
