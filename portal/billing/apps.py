from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "portal.billing"
    label = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        # Jobs sit below billing: a past-due subscription refuses new jobs through their
        # admission checks (portal.jobs.admission), not by jobs importing billing.
        from portal.billing.services import billing_assert_can_start_jobs
        from portal.jobs import admission

        admission.register(
            "billing", lambda organization: billing_assert_can_start_jobs(organization=organization)
        )
