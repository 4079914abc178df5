from __future__ import annotations

from typing import Any, cast

from django import forms
from django.conf import settings


class ResidencyForm(forms.Form):
    allowed_regions = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Allowed regions")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast(forms.MultipleChoiceField, self.fields["allowed_regions"])
        field.choices = [(r, r) for r in settings.COMPLIANCE_REGIONS]


class RetentionForm(forms.Form):
    sample_retention_days = forms.IntegerField(
        min_value=1, max_value=3650, label="Keep traffic samples (days)"
    )
    metric_retention_days = forms.IntegerField(
        min_value=35, max_value=3650, required=False, label="Keep endpoint metrics (days; default 400)"
    )
    retain_prompt_text = forms.BooleanField(
        required=False, label="Keep raw uploads (prompt text) until then (needs an effective BAA)"
    )


class BAAForm(forms.Form):
    counterparty = forms.CharField(max_length=200)
    version = forms.CharField(max_length=64)
    signed_on = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    effective_on = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    ends_on = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    document = forms.FileField(required=False, label="Signed document (PDF)")


class OrganizationDeleteForm(forms.Form):
    confirm = forms.CharField(max_length=64, label="Type the organization's slug to confirm")


class SLATermsForm(forms.Form):
    endpoint = forms.UUIDField(widget=forms.HiddenInput)
    metric = forms.ChoiceField(choices=[("ttft_p50_ms", "TTFT p50"), ("ttft_p95_ms", "TTFT p95")])
    target_ms = forms.FloatField(min_value=1, label="Target (ms)")


class ConsoleFilterForm(forms.Form):
    q = forms.CharField(required=False, label="Organization")
    baa = forms.ChoiceField(
        required=False, choices=[("", "Any BAA status"), ("yes", "BAA in effect"), ("no", "No BAA")]
    )
    sla = forms.ChoiceField(
        required=False,
        label="SLA",
        choices=[
            ("", "Any SLA status"),
            ("met", "Met"),
            ("breached", "Breached"),
            ("no data", "No data"),
            ("no terms", "No terms"),
        ],
    )


class TwoFactorForm(forms.Form):
    code = forms.CharField(
        max_length=32,
        label="6-digit code from your authenticator app (or a recovery code)",
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "autofocus": True}
        ),
    )


class BAACountersignForm(forms.Form):
    baa = forms.UUIDField(widget=forms.HiddenInput)
    effective_on = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    ends_on = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
