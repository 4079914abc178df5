"""Audit events get a random public id (issue 27 finding 14): the integer key counts every
tenant's events together, so it stays inside the server.

Existing rows need a value, but on PostgreSQL audit rows refuse every UPDATE (0003's trigger),
whoever asks, and that is not to be lifted for a migration. So there the column is added with a
volatile default, which PostgreSQL fills in while it rewrites the table (no row is updated), and
the default is dropped again: new events get theirs from the model. SQLite (the embedded setup)
has no such trigger: the column is added and filled row by row. The hashes do not cover the id,
so every chain verifies as before.
"""

import uuid

from django.db import migrations, models

POSTGRESQL_FORWARD = """
ALTER TABLE compliance_auditevent ADD COLUMN public_id uuid NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE compliance_auditevent ALTER COLUMN public_id DROP DEFAULT;
ALTER TABLE compliance_auditevent ADD CONSTRAINT compliance_auditevent_public_id_key UNIQUE (public_id);
"""


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_FORWARD, params=None)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("ALTER TABLE compliance_auditevent ADD COLUMN public_id char(32) NULL")
        cursor.execute("SELECT id FROM compliance_auditevent")
        for (row_id,) in cursor.fetchall():
            cursor.execute(
                "UPDATE compliance_auditevent SET public_id = %s WHERE id = %s", [uuid.uuid4().hex, row_id]
            )
        cursor.execute(
            "CREATE UNIQUE INDEX compliance_auditevent_public_id_key ON compliance_auditevent (public_id)"
        )


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE compliance_auditevent DROP COLUMN public_id", params=None)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP INDEX IF EXISTS compliance_auditevent_public_id_key")
        cursor.execute("ALTER TABLE compliance_auditevent DROP COLUMN public_id")


class Migration(migrations.Migration):
    dependencies = [("compliance", "0008_baa_countersignature")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="auditevent",
                    name="public_id",
                    field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
