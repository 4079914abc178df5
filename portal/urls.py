from pathlib import Path

import plotly
from django.contrib import admin
from django.http import FileResponse, HttpRequest, JsonResponse
from django.urls import include, path
from django.views.decorators.cache import cache_control
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from portal.ops import views as ops_views


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


_PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@cache_control(public=True, max_age=86400)
def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.js from the installed `plotly` package, so no page needs a CDN."""
    return FileResponse(_PLOTLY_JS.open("rb"), content_type="text/javascript")


urlpatterns = [
    path("", include("portal.accounts.urls")),
    path("traffic/", include("portal.traffic.urls")),
    path("jobs/", include("portal.jobs.urls")),
    path("endpoints/", include("portal.endpoints.urls")),
    path("billing/", include("portal.billing.urls")),
    path("benchmarks/", include("portal.benchmarks.urls")),
    path("catalog/", include("portal.catalog.urls")),
    path("compliance/", include("compliance.urls")),
    path("sla/", include("portal.sla.urls")),
    path("alerts/", include("portal.alerts.urls")),
    path("api/v1/", include("portal.api.urls")),
    path("vendor/plotly.min.js", plotly_js, name="plotly-js"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", ops_views.metrics, name="metrics"),
]

# The API answers an unmatched path in JSON; pages get the HTML 404 page.
handler404 = "portal.api.errors.page_not_found"
# A crash keeps the site's navigation (or falls back to plain HTML), never a traceback.
handler500 = "portal.errors.server_error"
