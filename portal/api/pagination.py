"""Pagination that refuses what its schema does not allow.

DRF's LimitOffsetPagination silently falls back to its defaults on `limit=abc` or
`offset=-5`, so a client's mistake passes unnoticed and the schema's `integer` is a lie. Here
`limit` (1..MAX_LIMIT) and `offset` (0 or more) are plain decimal integers given at most once,
and anything else is a 400 naming the parameter; the schema states the same bounds.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_LIMIT = 500


class StrictLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def _integer(self, request: Request, name: str, minimum: int, maximum: int | None) -> int | None:
        values = request.query_params.getlist(name)
        if not values:
            return None
        bound = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        message = f"Give `{name}` once, as a whole number {bound}."
        raw = values[0]
        if len(values) > 1 or not (raw.isascii() and raw.isdigit()):
            raise ValidationError({name: [message]})
        value = int(raw)
        if value < minimum or (maximum is not None and value > maximum):
            raise ValidationError({name: [message]})
        return value

    def get_limit(self, request: Request) -> int | None:
        value = self._integer(request, self.limit_query_param, 1, self.max_limit)
        return self.default_limit if value is None else value

    def get_offset(self, request: Request) -> int:
        value = self._integer(request, self.offset_query_param, 0, None)
        return 0 if value is None else value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_limit)
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"].update(minimum=0)
        return parameters
