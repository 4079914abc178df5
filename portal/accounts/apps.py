from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AccountsConfig(AppConfig):
    name = "portal.accounts"
    label = "accounts"
    verbose_name = "Accounts and tenancy"

    def ready(self) -> None:
        # Once per `migrate` (and per test flush): a tenant table added after the row-level
        # security migration gets its policy without a migration of its own.
        post_migrate.connect(_cover_new_tenant_tables, sender=self, dispatch_uid="tailguard_rls")


def _cover_new_tenant_tables(sender: AppConfig, using: str, apps: Any = None, **kwargs: Any) -> None:
    from django.apps import apps as live_apps
    from django.db import connections
    from django.db.migrations.recorder import MigrationRecorder

    from portal.accounts import rls

    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    # Unapplied (a rollback past it, or not migrated yet): the wall stays down as asked.
    recorder = MigrationRecorder(connection)
    app_label, name = rls.MIGRATION
    if not recorder.has_table() or not recorder.migration_qs.filter(app=app_label, name=name).exists():
        return
    rls.rls_enable(registry=apps or live_apps, connection=connection, only_missing=True)
