from django.urls import path

from portal.benchmarks import views

app_name = "benchmarks"

urlpatterns = [
    path("", views.report_list, name="list"),
    path("new/", views.report_create, name="create"),
    path("<uuid:report_id>/", views.report_detail, name="detail"),
    path("<uuid:report_id>/status/", views.report_status, name="status"),
    path("<uuid:report_id>/share/", views.share_create, name="share"),
    path("<uuid:report_id>/share/<uuid:link_id>/revoke/", views.share_revoke, name="share_revoke"),
    path("shared/<str:token>/", views.shared_report, name="shared"),
]
