from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings


class ResidencyForm(forms.Form):
    allowed_regions = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Allowed regions")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["allowed_regions"].choices = [(r, r) for r in settings.COMPLIANCE_REGIONS]


class RetentionForm(forms.Form):
    sample_retention_days = forms.IntegerField(
        min_value=1, max_value=3650, label="Keep traffic samples (days)"
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
