"""API errors: Django's own exceptions become DRF responses with the field named, never a 500."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.restkit.parsers import too_large


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        detail: Any = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = exceptions.ValidationError(detail=detail)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(detail=str(exc) or None)
    # Django refuses these while parsing a form or multipart body; it would answer with an HTML
    # 400 page. The API says the same in JSON (a body too large is a 413, as for JSON bodies).
    elif isinstance(exc, RequestDataTooBig):
        exc = too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    elif isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        exc = exceptions.ParseError(detail=str(exc))
    return drf_exception_handler(exc, context)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 handler: the API answers in JSON, as its schema says, pages in HTML.

    A path the URL patterns do not match (e.g. `/api/v1/tokens/not-a-uuid/`) never reaches
    a DRF view, so without this the API answered such a request with the HTML error page.
    """
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)
