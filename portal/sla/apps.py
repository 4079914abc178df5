from django.apps import AppConfig


class SlaConfig(AppConfig):
    name = "portal.sla"
    label = "sla"
    verbose_name = "SLA agreements"
