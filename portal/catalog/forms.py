from __future__ import annotations

from typing import Any

from django import forms

from portal.catalog.models import NOTE_MAX_CHARS
from serving.catalog import HARDWARE


class PriceOverrideForm(forms.Form):
    """The override form; the service validates the values (one set of messages for every caller)."""

    hardware_name = forms.CharField(max_length=64, label="Hardware")
    # Text, not a DecimalField: the service says what is wrong with a price in the catalog's terms.
    price_per_hour_usd = forms.CharField(max_length=32, label="Price per device-hour (USD)")
    note = forms.CharField(
        max_length=NOTE_MAX_CHARS,
        required=False,
        label="Note (where the price comes from)",
    )

    def __init__(self, *args: Any, fixed_hardware: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["hardware_name"]
        if fixed_hardware is not None:
            field.widget = forms.HiddenInput()
            field.initial = fixed_hardware
        else:
            field.widget = forms.Select(choices=[(name, hw.display_name) for name, hw in HARDWARE.items()])
