"""Counts and times every request for the operator's metrics (route names, never paths)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from portal.ops.metrics import HTTP_LATENCY, HTTP_REQUESTS

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = (match.view_name if match is not None else "") or "unmatched"
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUESTS.labels(route=route, method=method, status=f"{response.status_code // 100}xx").inc()
        HTTP_LATENCY.labels(route=route).observe(time.perf_counter() - started)
        return response
