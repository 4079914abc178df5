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
        # Job steps and trials whose message was lost or whose worker died, for the one beat.
        from portal.jobs.services import tuning_jobs_redispatch
        from portal.outbox import recovery

        recovery.register("tuning_jobs", lambda now: tuning_jobs_redispatch(now=now))
