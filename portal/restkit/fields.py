"""Serializer fields whose limits mean what the schema says.

DRF trims surrounding whitespace before it checks `max_length`, so a name of 101 characters
(one of them a leading space) passed a documented `maxLength: 100`; and it turns a JSON number
into text, so `{"name": 1e999}` made a token named "inf" where the schema says `string`. These
fields take text only and check the length of the text as sent, then trim as DRF does;
`ModelSerializer` maps model text fields to them. Everything else behaves as in DRF.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from rest_framework import serializers


class _TextAsSent:
    max_length: int | None

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")  # type: ignore[attr-defined]
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)  # type: ignore[attr-defined]
        return super().to_internal_value(data)  # type: ignore[misc]


class CharField(_TextAsSent, serializers.CharField):
    """DRF's CharField, taking text only and checking its length as sent."""


class EmailField(_TextAsSent, serializers.EmailField):
    """DRF's EmailField, taking text only and checking its length as sent."""


class URLField(_TextAsSent, serializers.URLField):
    """DRF's URLField, taking text only and checking its length as sent."""


class SlugField(_TextAsSent, serializers.SlugField):
    """DRF's SlugField, taking text only and checking its length as sent."""


class ModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: CharField,
        models.TextField: CharField,
        models.EmailField: EmailField,
        models.URLField: URLField,
        models.SlugField: SlugField,
    }
