from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from portal.traffic.models import TrafficSample


class TrafficSampleForm(forms.Form):
    name = forms.CharField(max_length=120)
    trace_format = forms.ChoiceField(
        choices=TrafficSample.Format.choices,
        initial=TrafficSample.Format.AUTO,
        label="Format",
        required=False,
    )
    file = forms.FileField(allow_empty_file=False)
    # Needs an effective BAA (compliance.services.upload_admit says why when there is none).
    contains_phi = forms.BooleanField(
        required=False, label="This sample contains PHI (protected health information)"
    )

    def __init__(self, *args: Any, upload_too_large: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.upload_too_large = upload_too_large

    def full_clean(self) -> None:
        super().full_clean()
        if self.upload_too_large:
            # The handler dropped the file mid-stream; say why instead of "required".
            limit = settings.TRAFFIC_UPLOAD_MAX_BYTES
            self.errors["file"] = self.error_class([f"The file is larger than the limit of {limit:,} bytes."])
            self.cleaned_data.pop("file", None)
