from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from compliance import urls as compliance_urls
from portal.ops import views as ops_views
from portal.plotting import PLOTLY_JS
from portal.sla import urls as sla_urls


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def plotly_js(request: HttpRequest) -> HttpResponseRedirect:
    """The old address of plotly.js: on to the vendored bundle, a static file (hashed name,
    compressed, cached for a year). Pages load `{% static PLOTLY_JS %}` directly; this keeps
    a page that still names `{% url 'plotly-js' %}` drawing (one small redirect more).
    Not cached: the target's name changes whenever the bundle does."""
    return HttpResponseRedirect(static(PLOTLY_JS))


urlpatterns = [
    path("", include("portal.accounts.urls")),
    path("traffic/", include("portal.traffic.urls")),
    path("jobs/", include("portal.jobs.urls")),
    path("endpoints/", include("portal.endpoints.urls")),
    path("billing/", include("portal.billing.urls")),
    path("benchmarks/", include("portal.benchmarks.urls")),
    path("catalog/", include("portal.catalog.urls")),
    # The compliance page's SLA terms form is portal.sla's to handle (the endpoints are its to
    # read), under the compliance page's names.
    path(
        "compliance/",
        include((compliance_urls.urlpatterns + sla_urls.compliance_urlpatterns, compliance_urls.app_name)),
    ),
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
