from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "portal.alerts"
    label = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        # Deliveries that are due (retries, and those whose dispatch was lost), sent by the one
        # beat after everything else: a slow receiver holds up nothing but alerts.
        from portal.alerts.services import alert_deliveries_due
        from portal.outbox import recovery

        recovery.register(
            "alert_deliveries", lambda now: alert_deliveries_due(now=now), phase=recovery.DELIVER
        )
