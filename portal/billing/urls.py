from django.urls import path

from portal.billing import views

app_name = "billing"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("checkout/", views.checkout, name="checkout"),
    path("portal/", views.portal, name="portal"),
    path("usage/", views.usage, name="usage"),
    path("usage/reports/<uuid:report_id>/", views.report_detail, name="report_detail"),
    path("webhook/", views.webhook, name="webhook"),
]
