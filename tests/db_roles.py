"""Run part of a test through the application's database role, so row-level security binds it.

The suite connects as the `postgres` superuser, which row-level security never binds. Inside
`application_role()` every new connection of this process (this thread's, and the live
server's request threads', which share the settings dict) logs in as the role production's web
processes use instead: `manage.py db_app_role` makes it (no superuser, no BYPASSRLS, owns
nothing). Build the test's data before entering; read stored state inside with
`rls.platform_transaction()`, as platform code would.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection

from portal.accounts import rls


@contextmanager
def application_role() -> Iterator[str]:
    """Yields the role's name; `database_url(rls.DEFAULT_WORKER_ROLE)` is the workers' URL."""
    if connection.vendor != "postgresql":
        pytest.skip("row-level security is PostgreSQL's (SQLite has none)")
    call_command("db_app_role", stdout=io.StringIO())
    call_command("db_app_role", "--worker", stdout=io.StringIO())
    original = dict(connection.settings_dict)
    connection.close()
    # In place: the dict is shared by every thread's connection to this alias.
    connection.settings_dict.update(USER=rls.DEFAULT_APP_ROLE, PASSWORD="")
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_user, usesuper, usebypassrls FROM pg_user WHERE usename = current_user"
            )
            assert cursor.fetchone() == (rls.DEFAULT_APP_ROLE, False, False)
        yield rls.DEFAULT_APP_ROLE
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)


def database_url(role: str) -> str:
    """The test database's URL as `role` (trust authentication: no password)."""
    s = connection.settings_dict
    return f"postgres://{role}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
