from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "portal.endpoints"
    label = "endpoints"
    verbose_name = "Dedicated endpoints"

    def ready(self) -> None:
        # What this app keeps for an organization, for retention and organization deletion.
        from compliance import holders
        from portal.endpoints.services import ENDPOINTS_HOLDER

        holders.register(ENDPOINTS_HOLDER)
