"""Error pages: the site's own 404, 403, CSRF and 500 pages, never Django's technical ones.

A person who hits a wrong address, a page their role does not allow, an expired form or a crash
keeps the navigation and gets a sentence on what to do next; nothing of the server's internals
(URL patterns, settings, tracebacks, exception text) reaches them. The API answers the same
cases in JSON, as its schema says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseForbidden,
    HttpResponseServerError,
    JsonResponse,
)
from django.template import loader
from django.urls import get_resolver
from django.views.decorators.csrf import requires_csrf_token

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"

# Served when even the site's 500 page cannot be drawn (the database is gone, a context
# processor fails): plain HTML with no template, no query and no static file behind it.
PLAIN_500 = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Something went wrong · Tailguard</title>
<style>body{font-family:system-ui,sans-serif;margin:3rem auto;max-width:40rem;color:#1d2430;padding:0 1rem}
a{color:#1b6ef3}</style></head>
<body><p><a href="/">Tailguard</a></p><h1>Something went wrong on our side</h1>
<p>The error was recorded for the operators. Nothing you sent was half-saved: try again in a minute.</p>
<p><a href="/dashboard/">Back to the dashboard</a></p></body></html>
"""


@requires_csrf_token
def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: the site's page with its navigation, or plain HTML if that cannot be drawn."""
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": "Server error: it was recorded; try again in a minute."}, status=500)
    body: str
    try:
        body = loader.render_to_string("500.html", request=request)
    except Exception:
        # The page's own failure is logged beside the original error; the person still gets a page.
        logger.exception("the 500 page could not be rendered; served the plain one")
        body = PLAIN_500
    return HttpResponseServerError(body)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: almost always a form left open past its session, or cookies blocked."""
    body = loader.render_to_string("403_csrf.html", request=request)
    return HttpResponseForbidden(body)


class FriendlyNotFoundMiddleware:
    """With DEBUG on (`make run`), every "not found" gets the site's 404 page, as in production.

    Django's debug page for an address that matches nothing lists every URL pattern of the
    project to whoever typed it; for a 404 raised inside a view (a missing object, or another
    tenant's, which answers exactly like a missing one) it names the view and the query. A
    developer reads both in the code; a person trying the portal on `make run` should see what a
    customer sees. Other exceptions keep Django's debug page in development.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.DEBUG and response.status_code == 404 and request.resolver_match is None:
            return _not_found(request, Http404())
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if settings.DEBUG and isinstance(exception, Http404):
            return _not_found(request, exception)
        return None  # without DEBUG, Django calls the same handler itself


def _not_found(request: HttpRequest, exception: Http404) -> HttpResponse:
    handler = get_resolver().resolve_error_handler(404)
    return handler(request, exception)  # type: ignore[call-arg]  # stubs give the handler one argument; 404's takes two
