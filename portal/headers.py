"""Security headers on every response: a Content-Security-Policy and its companions.

The pages run no inline script: htmx, plotly.js and the charts' initialiser are files served
by the portal itself, and figures travel as JSON data blocks (`json_script`), which a policy
does not execute. So `script-src` is the portal's own origin plus a per-response nonce, for the
few third-party pages whose templates start their script inline (the API's Swagger page,
overridden in templates/drf_spectacular to carry the nonce). An injected `<script>`, an event
handler attribute or a `javascript:` URL runs nowhere.

Styles allow inline: plotly.js and Redoc insert `<style>` elements at run time (plotly's modebar,
Redoc's styled components) and neither can be handed a nonce; CSS cannot run code.

Forms may post to the portal and be redirected to the billing provider's pages only
(CSP_FORM_ACTION_EXTRA); nothing may frame the portal; plugins and `<base>` are off.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

NONCE_ATTR = "csp_nonce"


def content_security_policy(nonce: str) -> str:
    form_action = " ".join(["'self'", *settings.CSP_FORM_ACTION_EXTRA])
    directives = [
        "default-src 'self'",
        f"script-src 'self' 'nonce-{nonce}'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        # Redoc's search runs in a worker it builds from a blob.
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'none'",
        f"form-action {form_action}",
        "frame-ancestors 'none'",
    ]
    return "; ".join(directives)


PERMISSIONS_POLICY = ", ".join(
    f"{feature}=()"
    for feature in (
        "camera",
        "microphone",
        "geolocation",
        "payment",
        "usb",
        "display-capture",
        "interest-cohort",
    )
)


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = secrets.token_urlsafe(16)
        setattr(request, NONCE_ATTR, nonce)
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", content_security_policy(nonce))
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        response.headers.setdefault("Cross-Origin-Resource-Policy", "same-origin")
        return response
