from django.urls import path

from portal.alerts import views

app_name = "alerts"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("channels/new/", views.channel_create, name="channel_create"),
    path("channels/<uuid:channel_id>/", views.channel_update, name="channel_update"),
    path("channels/<uuid:channel_id>/delete/", views.channel_delete, name="channel_delete"),
    path("deliveries/<uuid:delivery_id>/retry/", views.delivery_retry, name="delivery_retry"),
]
