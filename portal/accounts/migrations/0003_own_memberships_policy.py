"""On PostgreSQL, the membership table's second, read-only policy: a user's own memberships.

A web request declares its signed-in user (`tailguard.user_id`) before it knows which
organization it acts in; this policy shows that user's memberships so the organization can be
chosen among them. Re-applies every tenant policy (idempotent). See `portal/accounts/rls.py`.
"""

from django.db import migrations

from portal.accounts import rls


def enable(apps, schema_editor):  # type: ignore[no-untyped-def]
    rls.rls_enable(registry=apps, connection=schema_editor.connection)


def disable(apps, schema_editor):  # type: ignore[no-untyped-def]
    rls.own_memberships_disable(registry=apps, connection=schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_row_level_security")]

    operations = [migrations.RunPython(enable, disable)]
