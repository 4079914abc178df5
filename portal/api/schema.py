"""The OpenAPI schema states the errors the API really answers with.

drf-spectacular documents only the success response of each operation; a client (or a fuzzer)
reading the schema would then take every 400, 401, 403 and 404 for a contract breach. Each
operation gets the error responses its shape implies, with their bodies:

- 400 `{"<field>": ["message", ...]}` (DRF's field errors, or `detail` for an unreadable body)
  wherever a request body, a query parameter or a write can be refused;
- 401/403 `{"detail": "..."}` wherever authentication is required;
- 404 `{"detail": "..."}` wherever the path names an object (another tenant's is a 404 too);
- 413 `{"detail": "..."}` wherever a request body is read (bodies above the limit), and 415
  there too (a media type the operation does not read);
- and any a view names in `extra_error_statuses` (e.g. 502 when Stripe cannot be reached).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework import permissions, serializers

WRITES = {"POST", "PUT", "PATCH", "DELETE"}


class ErrorDetailSerializer(serializers.Serializer):
    detail = serializers.CharField()


FIELD_ERRORS_SCHEMA = {
    "type": "object",
    "description": "Field name (or `non_field_errors`, or `detail`) to what is wrong with it.",
    "additionalProperties": {},
}

DESCRIPTIONS = {
    400: "The request was refused; the body names each field and what is wrong with it.",
    401: "Not authenticated (no, malformed, unknown, expired or revoked credentials).",
    403: "Authenticated, but not allowed this (role, two-factor, or no organization).",
    404: "No such object in your organization (another organization's answers the same).",
    413: "The request body is larger than the limit.",
    415: "The request body's media type is not one this operation reads.",
    502: "An upstream service could not be reached.",
}


class PortalAutoSchema(AutoSchema):
    def _needs_auth(self) -> bool:
        view = self.view
        if not getattr(view, "authentication_classes", None):
            return False
        return any(not issubclass(p, permissions.AllowAny) for p in view.permission_classes)

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation
        statuses: set[int] = set(getattr(self.view, "extra_error_statuses", ()))
        if has_body or self.method in WRITES or any(p["in"] == "query" for p in parameters):
            statuses.add(400)
        if self._needs_auth():
            statuses |= {401, 403}
        if any(p["in"] == "path" for p in parameters):
            statuses.add(404)
        if has_body:
            statuses |= {413, 415}
        detail = self.resolve_serializer(ErrorDetailSerializer, "response").ref
        responses = operation.setdefault("responses", {})
        for status in sorted(statuses):
            body = FIELD_ERRORS_SCHEMA if status == 400 else detail
            responses.setdefault(
                str(status),
                {"description": DESCRIPTIONS[status], "content": {"application/json": {"schema": body}}},
            )
        return operation
