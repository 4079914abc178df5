"""On PostgreSQL, audit rows refuse UPDATE and DELETE from any role, the application's included.

A trigger rather than a REVOKE, because the application often connects as the table's owner
(and in tests as a superuser), which a REVOKE does not bind. SQLite (the embedded setup) has no
such guard; the hash chain still makes any edit detectable there (`manage.py verify_audit`).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION compliance_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % of compliance_auditevent is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER compliance_auditevent_append_only
    BEFORE UPDATE OR DELETE ON compliance_auditevent
    FOR EACH ROW EXECUTE FUNCTION compliance_auditevent_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS compliance_auditevent_append_only ON compliance_auditevent;
DROP FUNCTION IF EXISTS compliance_auditevent_append_only();
"""


def _on_postgresql(sql: str):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("compliance", "0002_audit_chain_residency_baa_storage")]

    operations = [migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP))]
