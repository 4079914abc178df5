from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms

from portal.accounts.models import Organization
from portal.jobs import selectors
from portal.jobs.services import BUDGET_HELP
from portal.pools.selectors import pools_for
from tuning.search.job import (
    BUDGET_MIN_ERROR,
    HARDWARE,
    MAX_BUDGET_TRIALS,
    MAX_CONFIRM_REPEATS,
    MAX_PEAK_RPS,
    MAX_TOKENS,
    MIN_BUDGET_TRIALS,
    JobSpecError,
    parse_capacity_steps,
)
from tuning.workload.synth import MIN_LENGTH_SCALE

if TYPE_CHECKING:
    from portal.jobs.models import ServedModel
    from portal.traffic.models import TrafficSample


class ServedModelForm(forms.Form):
    name = forms.CharField(max_length=120)
    path = forms.CharField(max_length=500, help_text="A model directory on the serving host.")


def _own_samples_and_models(form: forms.Form, organization: Organization) -> None:
    """Limit a form's `traffic_sample` and `served_model` choices to the organization's own
    (ready samples; `fields` is typed as plain `Field`s, these are declared choice fields)."""
    cast(forms.ModelChoiceField, form.fields["traffic_sample"]).queryset = selectors.ready_samples(
        organization=organization
    )
    cast(forms.ModelChoiceField, form.fields["served_model"]).queryset = selectors.served_model_list(
        organization=organization
    )


class TuningJobForm(forms.Form):
    name = forms.CharField(max_length=120, required=False)
    traffic_sample: forms.ModelChoiceField[TrafficSample] = forms.ModelChoiceField(
        queryset=None, to_field_name="id"
    )
    served_model: forms.ModelChoiceField[ServedModel] = forms.ModelChoiceField(
        queryset=None, to_field_name="id", label="Model"
    )
    ttft_p50_ms = forms.FloatField(min_value=1, label="p50 TTFT ≤ (ms)", initial=600)
    ttft_p95_ms = forms.FloatField(min_value=1, label="p95 TTFT ≤ (ms)", initial=1500)
    tpot_p50_ms = forms.FloatField(min_value=1, required=False, label="p50 TPOT ≤ (ms, optional)")
    peak_rps = forms.FloatField(min_value=0.001, max_value=MAX_PEAK_RPS, label="Peak request rate (req/s)")
    headroom = forms.FloatField(min_value=1.0, max_value=10.0, initial=1.25)
    hardware = forms.ChoiceField(choices=[(name, name) for name in HARDWARE])
    pool = forms.ChoiceField(
        required=False,
        label="Hardware pool",
        help_text="Engine hosts that run the trials (their hardware replaces the choice above). Blank: this deployment's own workers.",
    )
    budget_trials = forms.IntegerField(
        min_value=MIN_BUDGET_TRIALS,
        max_value=MAX_BUDGET_TRIALS,
        initial=6,
        label="Search budget (live trials)",
        help_text=BUDGET_HELP,
        error_messages={"min_value": BUDGET_MIN_ERROR},
    )
    strategy = forms.ChoiceField(
        choices=[("tpe", "Bayesian search (TPE)"), ("grid", "auto_tune grid")], initial="tpe"
    )
    # The trial length, as the API takes it; blank keeps the service's defaults.
    duration_s = forms.FloatField(
        required=False,
        min_value=5,
        max_value=3600,
        label="Load per level (s, optional)",
        help_text="How long each trial replays the traffic at each rate (default 20).",
    )
    repeats = forms.IntegerField(
        required=False, min_value=1, max_value=10, label="Repeats at the target rate (optional; default 2)"
    )
    confirm_repeats = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_CONFIRM_REPEATS,
        label="Confirmation rounds (optional; default 3)",
        help_text=(
            "The finalists and both baselines are re-measured in this many interleaved rounds on fresh "
            "engines; a winner is declared only when its 95% interval clears the baseline. 0 skips it "
            "(the result is then marked unconfirmed); otherwise 3 or more."
        ),
    )
    capacity_steps = forms.CharField(
        required=False,
        max_length=60,
        label="Load steps beyond the target (optional; default 1.5, 2, 3, 4)",
        help_text=(
            "Multiples of the target rate each trial also replays, one after another while the SLO "
            "holds, to find how much more load it sustains: fewer steps, shorter trials. 'none' skips it."
        ),
    )
    max_prompt_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_TOKENS,
        label="Prompt cap (tokens, optional)",
        help_text="Longer prompts are replayed clipped. Blank: the sample's p99 within this hardware's replay limit.",
    )
    max_output_tokens = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_TOKENS, label="Output cap (tokens, optional)"
    )
    max_model_len = forms.IntegerField(
        required=False,
        min_value=16,
        max_value=MAX_TOKENS,
        label="Context length (tokens, optional)",
        help_text="Blank: the caps rounded up, within the model's context.",
    )
    length_scale = forms.FloatField(
        required=False,
        min_value=MIN_LENGTH_SCALE,
        max_value=1.0,
        label="Length scale (optional; default 1)",
        help_text=(
            "Where this hardware cannot replay your real lengths in reasonable time: every prompt and "
            "output is replayed at this factor of its length (0.5: half), which keeps the shape of "
            "your length mix where a cap clips only the long ones. The caps then apply to the scaled "
            "lengths. The job page states the factor and the share of requests shortened."
        ),
    )

    def __init__(self, *args: Any, organization: Organization, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _own_samples_and_models(self, organization)
        pools = pools_for(organization=organization)
        cast(forms.ChoiceField, self.fields["pool"]).choices = [("", "—")] + [
            (p.name, f"{p.name} ({p.accelerator} x{p.devices_per_host}, {p.region})") for p in pools
        ]

    def clean_capacity_steps(self) -> tuple[float, ...] | None:
        text = self.cleaned_data.get("capacity_steps") or ""
        if not text.strip():
            return None
        try:
            return parse_capacity_steps(text)
        except JobSpecError as exc:
            raise forms.ValidationError(exc.message) from None

    def trial_length(self) -> dict[str, Any]:
        """The trial-length settings the user gave (the service defaults the rest)."""
        keys = (
            "duration_s",
            "repeats",
            "confirm_repeats",
            "capacity_steps",
            "max_prompt_tokens",
            "max_output_tokens",
            "max_model_len",
            "length_scale",
        )
        return {k: self.cleaned_data[k] for k in keys if self.cleaned_data.get(k) is not None}

    def slo(self) -> str:
        data = self.cleaned_data
        terms = [f"ttft_p50_ms<={data['ttft_p50_ms']:g}", f"ttft_p95_ms<={data['ttft_p95_ms']:g}"]
        if data.get("tpot_p50_ms"):
            terms.append(f"tpot_p50_ms<={data['tpot_p50_ms']:g}")
        return ",".join(terms)


class WhatIfForm(forms.Form):
    """A sample, a model and latency targets: the simulator's forecast per hardware (a GET form)."""

    traffic_sample: forms.ModelChoiceField[TrafficSample] = forms.ModelChoiceField(
        queryset=None, to_field_name="id", label="Traffic sample"
    )
    served_model: forms.ModelChoiceField[ServedModel] = forms.ModelChoiceField(
        queryset=None, to_field_name="id", label="Model"
    )
    ttft_p50_ms = forms.FloatField(min_value=1, max_value=3_600_000, label="p50 TTFT ≤ (ms)", initial=600)
    ttft_p95_ms = forms.FloatField(min_value=1, max_value=3_600_000, label="p95 TTFT ≤ (ms)", initial=1500)

    def __init__(self, *args: Any, organization: Organization, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _own_samples_and_models(self, organization)
