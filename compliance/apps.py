from django.apps import AppConfig


class ComplianceConfig(AppConfig):
    name = "compliance"
    verbose_name = "Compliance: audit trail, BAA, residency, SLAs"

    def ready(self) -> None:
        # Accounts sits below compliance and reaches the audit trail and the second factor only
        # through its port (portal.accounts.ports), filled here.
        from compliance.accounts_port import AccountsCompliance
        from portal.accounts import ports

        ports.register(AccountsCompliance())
