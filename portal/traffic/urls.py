from django.urls import path

from portal.traffic import views

app_name = "traffic"

urlpatterns = [
    path("", views.sample_list, name="list"),
    path("<uuid:sample_id>/", views.sample_detail, name="detail"),
    path("<uuid:sample_id>/status/", views.sample_status, name="status"),
    path("<uuid:sample_id>/delete/", views.sample_delete, name="delete"),
]
