"""Request parsers that refuse bad bodies with a 4xx that says why.

Bodies above DATA_UPLOAD_MAX_MEMORY_SIZE are refused by Django while DRF reads them
(RequestDataTooBig); `portal.api.errors` turns that into a JSON 413 naming the limit.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser, MultiPartParser


class RequestBodyTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "request_too_large"


def too_large(limit: int) -> RequestBodyTooLarge:
    return RequestBodyTooLarge(
        f"The request body is larger than the limit of {limit:,} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)."
    )


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            # json.loads gives up on deep nesting ([[[[...]]]], 200 KB is enough) with
            # RecursionError, which DRF does not catch: it was a 500.
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply.") from None


class LimitedMultiPartParser(MultiPartParser):
    """Names the file field whose upload crossed TRAFFIC_UPLOAD_MAX_BYTES.

    The upload handler drops such a file while it streams in; without this check the view saw
    the field as simply missing, and an optional file (a BAA's signed document) was lost while
    the record was written without it.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        request = getattr((parser_context or {}).get("request"), "_request", None)
        if getattr(request, "upload_too_large", False):
            field = getattr(request, "upload_too_large_field", None) or "file"
            limit = settings.TRAFFIC_UPLOAD_MAX_BYTES
            raise exceptions.ValidationError(
                {field: [f"The file is larger than the limit of {limit:,} bytes."]}
            )
        return parsed
