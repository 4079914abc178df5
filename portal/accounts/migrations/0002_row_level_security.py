"""On PostgreSQL, row-level security on every tenant table: the second tenant wall.

The tables come from the historical app registry (every model with an `organization` key), so
this migration depends on the latest migration of every app that has tenant models. Tenant
tables that later migrations add are covered by the `post_migrate` check in
`portal.accounts.apps` (it runs after every `migrate` once this migration is applied). SQLite has
no row-level security: a no-op there. See `portal/accounts/rls.py`.
"""

from django.db import migrations

from portal.accounts import rls


def enable(apps, schema_editor):  # type: ignore[no-untyped-def]
    rls.rls_enable(registry=apps, connection=schema_editor.connection)


def disable(apps, schema_editor):  # type: ignore[no-untyped-def]
    rls.rls_disable(registry=apps, connection=schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("benchmarks", "0001_initial"),
        ("billing", "0001_initial"),
        ("catalog", "0001_initial"),
        ("compliance", "0006_metric_retention"),
        ("endpoints", "0002_continual_loop"),
        ("jobs", "0002_dispatch_outbox"),
        ("traffic", "0001_initial"),
    ]

    operations = [migrations.RunPython(enable, disable)]
