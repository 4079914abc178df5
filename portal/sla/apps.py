from django.apps import AppConfig


class SlaConfig(AppConfig):
    name = "portal.sla"
    label = "sla"
    verbose_name = "SLA agreements"

    def ready(self) -> None:
        # The endpoints' SLA rows on the compliance page and console: compliance shows them
        # without importing this app.
        from compliance import endpoint_sla
        from portal.sla.selectors import endpoint_sla_rows

        endpoint_sla.register(endpoint_sla_rows)
