from django.urls import path

from portal.endpoints import views

app_name = "endpoints"

urlpatterns = [
    path("", views.endpoint_list, name="list"),
    path("deploy/<uuid:job_id>/", views.endpoint_deploy, name="deploy"),
    path("<uuid:endpoint_id>/", views.endpoint_detail, name="detail"),
    path("<uuid:endpoint_id>/deployed/", views.endpoint_deployed, name="deployed"),
    path("<uuid:endpoint_id>/policy/", views.endpoint_policy, name="policy"),
    path("<uuid:endpoint_id>/promote/", views.endpoint_promote, name="promote"),
    path("<uuid:endpoint_id>/stop/", views.endpoint_stop, name="stop"),
]
