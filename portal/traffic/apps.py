from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "portal.traffic"
    label = "traffic"
    verbose_name = "Traffic samples"

    def ready(self) -> None:
        # What this app keeps for an organization, for retention and organization deletion.
        from compliance import holders
        from portal.traffic.services import TRAFFIC_HOLDER

        holders.register(TRAFFIC_HOLDER)
