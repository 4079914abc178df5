from __future__ import annotations

from typing import Any

from django import forms

from portal.endpoints.policy import POLICY_LIMITS


class EndpointPolicyForm(forms.Form):
    """Reads the policy's fields as types; the ranges are `policy.endpoint_policy_set`'s to check
    (its messages are the ones shown), the browser only gets them as min/max hints."""

    auto_retune = forms.BooleanField(required=False, label="Re-tune automatically on drift or SLO erosion")
    retune_cooldown_s = forms.IntegerField(label="Cool-down after an iteration (s)")
    retune_max_per_day = forms.IntegerField(label="Re-tuning jobs per day, at most")
    retune_budget_trials = forms.IntegerField(label="Budget per re-tuning job (live trials)")
    detect_window_s = forms.IntegerField(label="Live traffic compared per check (s)")

    def __init__(self, *args: Any, read_only: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (low, high, _) in POLICY_LIMITS.items():
            self.fields[name].widget.attrs.update({"min": low, "max": high})
        if read_only:
            for field in self.fields.values():
                field.disabled = True
