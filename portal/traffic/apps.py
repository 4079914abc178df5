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
        # Sample ingests whose worker died, queued again by the one beat.
        from portal.outbox import recovery
        from portal.traffic.services import traffic_samples_recover

        recovery.register("traffic_samples", lambda now: len(traffic_samples_recover(now=now)))
