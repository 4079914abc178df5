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
