from django.urls import path

from portal.catalog import views

app_name = "catalog"

urlpatterns = [
    path("", views.hardware_list, name="hardware_list"),
    path("models/", views.model_list, name="model_list"),
    path("hardware/prices/", views.price_set, name="price_set"),
    path("hardware/prices/clear/", views.price_clear, name="price_clear"),
    path("hardware/<str:name>/", views.hardware_detail, name="hardware_detail"),
]
