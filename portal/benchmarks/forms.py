from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms

from portal.benchmarks import selectors, services
from portal.benchmarks.models import BenchmarkReport, BenchmarkTarget
from portal.traffic.models import TrafficSample


class _SampleChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: TrafficSample) -> str:
        peak = ((obj.profile or {}).get("arrival") or {}).get("peak_rps_60s") or 0
        return f"{obj.organization.name}: {obj.name} (peak {peak:.2f} req/s)"


class BenchmarkReportForm(forms.Form):
    name = forms.CharField(max_length=120, required=False, help_text="Defaults to the sample and targets.")
    traffic_sample = _SampleChoice(queryset=None, to_field_name="id", label="Prospect's traffic sample")
    traffic_source = forms.ChoiceField(
        choices=BenchmarkReport.TrafficSource.choices,
        initial=BenchmarkReport.TrafficSource.PROSPECT,
        label="Where the sample comes from (for the report's attribution)",
    )
    load_multipliers = forms.CharField(
        initial="0.5, 1, 1.25",
        label="Load plan (multiples of the sample's peak rate)",
        help_text="Comma-separated, e.g. 0.5, 1, 1.25",
    )
    duration_s = forms.FloatField(initial=60, label="Duration per load level and target (s)")
    request_timeout_s = forms.FloatField(initial=60, label="Request timeout (s)")
    max_prompt_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=services.MAX_TOKENS_CAP,
        label=f"Cap prompt tokens (optional, 1-{services.MAX_TOKENS_CAP:,})",
    )
    max_output_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=services.MAX_TOKENS_CAP,
        label=f"Cap output tokens (optional, 1-{services.MAX_TOKENS_CAP:,})",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # `fields` is typed as plain `Field`s; this is the declared choice field above.
        cast(
            forms.ModelChoiceField, self.fields["traffic_sample"]
        ).queryset = selectors.benchmark_sample_choices()

    def clean_load_multipliers(self) -> list[float]:
        try:
            return services.parse_load_plan(self.cleaned_data["load_multipliers"])
        except forms.ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["load_multipliers"]) from None


class BenchmarkTargetForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="e.g. Current provider, Tailguard tuned")
    base_url = forms.CharField(
        max_length=500, label="Base URL", help_text="OpenAI-compatible, e.g. https://api.example.com/v1"
    )
    model = forms.CharField(max_length=200)
    api_key = forms.CharField(
        max_length=500,
        required=False,
        label="API key (stored encrypted, never shown again)",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )
    pricing = forms.ChoiceField(
        choices=BenchmarkTarget.Pricing.choices, initial=BenchmarkTarget.Pricing.HOURLY
    )
    price_per_hour_usd = forms.DecimalField(
        required=False, max_digits=12, decimal_places=4, label="Price per hour (USD)"
    )
    price_input_per_mtok_usd = forms.DecimalField(
        required=False, max_digits=12, decimal_places=4, label="Price per 1M input tokens (USD)"
    )
    price_output_per_mtok_usd = forms.DecimalField(
        required=False, max_digits=12, decimal_places=4, label="Price per 1M output tokens (USD)"
    )
    send_ignore_eos = forms.BooleanField(
        required=False, label="vLLM endpoint: send ignore_eos (outputs as long as the trace says)"
    )

    # An extra target form counts as used once any of these is filled in (the pricing select and
    # the checkbox always carry a value, so they alone do not make a target).
    _SIGNIFICANT = (
        "name",
        "base_url",
        "model",
        "api_key",
        "price_per_hour_usd",
        "price_input_per_mtok_usd",
        "price_output_per_mtok_usd",
    )

    def has_changed(self) -> bool:
        return any(name in self.changed_data for name in self._SIGNIFICANT)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        for field, problem in services.target_spec_errors(self.spec()).items():
            self.add_error(field, problem)
        return data

    def spec(self) -> services.TargetSpec:
        data = self.cleaned_data

        def price(name: str) -> Decimal | None:
            value = data.get(name)
            return value if isinstance(value, Decimal) else None

        return services.TargetSpec(
            name=data.get("name", ""),
            base_url=data.get("base_url", ""),
            model=data.get("model", ""),
            api_key=data.get("api_key", ""),
            pricing=data.get("pricing", ""),
            price_per_hour_usd=price("price_per_hour_usd"),
            price_input_per_mtok_usd=price("price_input_per_mtok_usd"),
            price_output_per_mtok_usd=price("price_output_per_mtok_usd"),
            send_ignore_eos=bool(data.get("send_ignore_eos")),
        )


class _TargetFormSet(forms.BaseFormSet):
    default_error_messages = {
        **forms.BaseFormSet.default_error_messages,
        "too_few_forms": "Add at least one target.",
        "too_many_forms": "Use at most %(num)d targets.",
    }

    def clean(self) -> None:
        if any(self.errors):
            return
        names = [f.cleaned_data["name"].strip() for f in self.forms if f.has_changed() and f.cleaned_data]
        if len(set(names)) != len(names):
            raise forms.ValidationError("Give each target a different name.")

    def specs(self) -> list[services.TargetSpec]:
        return [f.spec() for f in self.forms if f.has_changed() and f.cleaned_data]


# formset_factory builds a subclass of `formset`; the stubs give only the base class.
BenchmarkTargetFormSet = cast(
    "type[_TargetFormSet]",
    forms.formset_factory(
        BenchmarkTargetForm,
        formset=_TargetFormSet,
        extra=services.MAX_TARGETS - 1,
        min_num=1,
        max_num=services.MAX_TARGETS,
        validate_min=True,
        validate_max=True,
    ),
)


class ShareLinkForm(forms.Form):
    days = forms.IntegerField(
        min_value=services.SHARE_DAYS_MIN,
        max_value=services.SHARE_DAYS_MAX,
        initial=7,
        label=f"Link valid for (days, {services.SHARE_DAYS_MIN}-{services.SHARE_DAYS_MAX})",
    )
