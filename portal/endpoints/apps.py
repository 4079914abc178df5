from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "portal.endpoints"
    label = "endpoints"
    verbose_name = "Dedicated endpoints"
