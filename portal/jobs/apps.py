from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "portal.jobs"
    label = "jobs"
    verbose_name = "Tuning jobs"

    def ready(self) -> None:
        # What this app keeps for an organization, for retention and organization deletion.
        from compliance import holders
        from portal.jobs.services import JOBS_HOLDER

        holders.register(JOBS_HOLDER)
