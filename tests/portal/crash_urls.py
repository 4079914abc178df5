"""The portal's URLs plus two views that crash, for the error-page tests."""

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import path

from portal.urls import handler404, handler500
from portal.urls import urlpatterns as portal_urlpatterns

__all__ = ["handler404", "handler500", "urlpatterns"]


def crash(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret-internal-detail: /srv/tailguard/keys")


def crash_in_the_database(request: HttpRequest) -> HttpResponse:
    # A failed statement leaves the request's transaction unusable: the 500 page cannot query.
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM secret_internal_table_that_does_not_exist")
    return HttpResponse("unreachable")


urlpatterns = [
    path("crash-for-test/", crash),
    path("api/v1/crash-for-test/", crash),
    path("crash-in-the-database/", crash_in_the_database),
    *portal_urlpatterns,
]
