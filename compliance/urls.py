from django.urls import path

from compliance import views

app_name = "compliance"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("residency/", views.residency, name="residency"),
    path("retention/", views.retention, name="retention"),
    path("baa/", views.baa_create, name="baa_create"),
    path("baa/<uuid:baa_id>/document/", views.baa_document, name="baa_document"),
    path("baa/countersign/", views.baa_countersign, name="baa_countersign"),
    path("audit/export/", views.audit_export, name="audit_export"),
    path("organization/delete/", views.organization_delete, name="organization_delete"),
    path("console/", views.console, name="console"),
    path("2fa/", views.two_factor, name="two_factor"),
]
