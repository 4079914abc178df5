from django.apps import AppConfig


class SlaConfig(AppConfig):
    name = "portal.sla"
    label = "sla"
    verbose_name = "SLA agreements"

    def ready(self) -> None:
        # The endpoints' SLA rows on the compliance page and console, and the windows retention
        # freezes before their snapshots expire: compliance reaches both without importing this app.
        from compliance import endpoint_sla, holders
        from portal.sla.selectors import endpoint_sla_rows
        from portal.sla.services import SLA_HOLDER

        endpoint_sla.register(endpoint_sla_rows)
        holders.register(SLA_HOLDER)
