from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "portal.traffic"
    label = "traffic"
    verbose_name = "Traffic samples"
