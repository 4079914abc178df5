"""GET /metrics for Prometheus: `Authorization: Bearer <METRICS_TOKEN>`; 404 while unset."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from portal.accounts import rls
from portal.ops.metrics import exposition


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse(
            "Send Authorization: Bearer <METRICS_TOKEN>.\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    rls.scope_transaction(platform=True)  # platform-wide counts, whatever the connection's role
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
