from django.urls import path

from portal.sla import views

app_name = "sla"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("console/", views.console, name="console"),
    path("endpoints/<uuid:endpoint_id>/", views.endpoint_detail, name="endpoint"),
    path("endpoints/<uuid:endpoint_id>/propose/", views.propose, name="propose"),
    path("agreements/<uuid:agreement_id>/sign/", views.sign, name="sign"),
    path("agreements/<uuid:agreement_id>/decline/", views.decline, name="decline"),
    path("edge/", views.edge_ingest, name="edge_ingest"),
    path("evidence/", views.evidence_pack, name="evidence_pack"),
]

# The compliance page's form for an endpoint's own monitoring targets posts here; it keeps its
# place among the compliance page's addresses (`compliance:sla_terms`, /compliance/sla/):
# portal/urls.py mounts it there.
compliance_urlpatterns = [
    path("sla/", views.sla_terms, name="sla_terms"),
]
