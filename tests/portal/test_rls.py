"""Row-level security, the second tenant wall, tried through the application's own role.

The suite itself connects as the `postgres` superuser, which row-level security never binds, so
these tests open a second connection to the test database as the role `manage.py db_app_role`
sets up (no superuser, no BYPASSRLS, owns nothing) and query tenant tables with the filter a
careless view would forget: no WHERE at all. Alice's and Charlie's organizations both have rows
(memberships and audit events at least), committed so that the other connection sees them.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.sql import emit_post_migrate_signal
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg import errors, sql

from portal.accounts import rls
from portal.accounts.models import Membership, Role

# Database roles are the PostgreSQL cluster's, not one test database's: every test that makes
# them runs on one xdist worker (`--dist loadgroup`), never two at once.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("db_roles")]

ROLE = rls.DEFAULT_APP_ROLE
APP_ALIAS = "rls_app"


@pytest.fixture
def postgres() -> None:
    if connection.vendor != "postgresql":
        if os.environ.get("CI"):
            pytest.fail("CI runs on PostgreSQL: row-level security must be tested there")
        pytest.skip("row-level security is PostgreSQL's (SQLite has none)")


@pytest.fixture
def app_role(postgres: None) -> str:
    # Idempotent, and run twice on purpose: a second run must neither fail nor change anything.
    for _ in range(2):
        call_command("db_app_role", stdout=io.StringIO())
    return ROLE


@pytest.fixture
def app_conn(app_role: str) -> Iterator[psycopg.Connection]:
    """The test database, as the application role (a psycopg connection, transactions explicit)."""
    s = connection.settings_dict
    conn = psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"], user=app_role
    )
    try:
        yield conn
    finally:
        conn.close()  # before the flush: an open transaction would hold its locks


@pytest.fixture
def app_alias(app_role: str) -> Iterator[str]:
    """A Django database alias for the same database as the application role, for the ORM.

    Made as a connection object rather than a DATABASES entry: Django's test case allows
    dynamically created connections, and nothing else (no flush) ever touches it.
    """
    app = type(connections[DEFAULT_DB_ALIAS])(
        {**connection.settings_dict, "USER": app_role, "PASSWORD": ""}, APP_ALIAS
    )
    connections[APP_ALIAS] = app
    try:
        yield APP_ALIAS
    finally:
        app.close()
        del connections[APP_ALIAS]


@pytest.fixture
def world(alice, alice_org, bob, charlie):  # type: ignore[no-untyped-def]
    charlie_org = charlie.memberships.get().organization
    return alice_org, charlie_org


def _tables() -> list[rls.TenantTable]:
    return rls.tenant_tables(apps, connection)


def _owner_counts() -> dict[str, dict[uuid.UUID | None, int]]:
    """What the superuser (no row security) sees: rows per organization, per tenant table."""
    counts: dict[str, dict[uuid.UUID | None, int]] = {}
    with connection.cursor() as cursor:
        for t in _tables():
            cursor.execute(
                sql.SQL("SELECT {c}, count(*) FROM {t} GROUP BY {c}")
                .format(c=sql.Identifier(t.column), t=sql.Identifier(t.table))
                .as_string(cursor.connection)
            )
            counts[t.table] = dict(cursor.fetchall())
    return counts


def _select_all(conn: psycopg.Connection, table: rls.TenantTable) -> list[uuid.UUID | None]:
    # The forgotten filter: every row of the table, no WHERE.
    query = sql.SQL("SELECT {c} FROM {t}").format(
        c=sql.Identifier(table.column), t=sql.Identifier(table.table)
    )
    return [row[0] for row in conn.execute(query).fetchall()]


def _set_local(conn: psycopg.Connection, name: str, value: str) -> None:
    conn.execute("SELECT set_config(%s, %s, true)", [name, value])


# --- Coverage ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_tenant_table_has_forced_row_security_and_the_policy(postgres: None) -> None:
    tables = {t.label: t for t in _tables()}
    # The registry walk finds the tenant models (a broken walk would make the check vacuous).
    assert len(tables) >= 20
    for label in ("accounts.Membership", "accounts.ApiToken", "jobs.TuningJob", "compliance.AuditEvent"):
        assert label in tables
    assert {t.column for t in tables.values()} == {"organization_id"}
    assert rls.rls_missing(registry=apps, connection=connection) == []
    # Read back from the catalog independently of `rls_missing`.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, p.polcmd, p.polpermissive,"
            " pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid)"
            " FROM pg_class c LEFT JOIN pg_policy p ON p.polrelid = c.oid AND p.polname = %s"
            " WHERE c.relname = ANY(%s)",
            [rls.POLICY_NAME, [t.table for t in tables.values()]],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    assert set(rows) == {t.table for t in tables.values()}
    for table, (enabled, forced, command, permissive, using, check) in rows.items():
        assert (enabled, forced, command, permissive) == (True, True, "*", True), table
        assert using == check, table
        assert rls.TENANT_SETTING in using and rls.SCOPE_SETTING in using, table


@pytest.mark.django_db
def test_a_tenant_table_without_the_policy_is_reported_and_migrate_covers_it(postgres: None) -> None:
    # What a new tenant model looks like before anything covers it (rolled back with the test).
    with connection.cursor() as cursor:
        cursor.execute(f"DROP POLICY {rls.POLICY_NAME} ON jobs_trial")
        cursor.execute("ALTER TABLE accounts_invitation NO FORCE ROW LEVEL SECURITY")
    assert rls.rls_missing(registry=apps, connection=connection) == ["accounts_invitation", "jobs_trial"]
    # `migrate` ends with this signal; the accounts app's handler re-covers what is missing.
    emit_post_migrate_signal(verbosity=0, interactive=False, db=DEFAULT_DB_ALIAS)
    assert rls.rls_missing(registry=apps, connection=connection) == []


# --- Through the application role ----------------------------------------------------------


def test_with_alices_tenant_an_unfiltered_select_returns_only_her_rows(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    alice_org, charlie_org = world
    owner = _owner_counts()
    # Charlie's rows exist (the superuser sees them), so hiding them is the policy's doing.
    assert owner["accounts_membership"] == {alice_org.id: 2, charlie_org.id: 1}
    assert owner["compliance_auditevent"].get(charlie_org.id, 0) >= 1
    with app_conn.transaction():
        _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
        rows = app_conn.execute("SELECT * FROM accounts_membership").fetchall()
        assert len(rows) == 2
        for table in _tables():
            seen = _select_all(app_conn, table)
            assert set(seen) <= {alice_org.id}, table.table
            assert len(seen) == owner[table.table].get(alice_org.id, 0), table.table
    with app_conn.transaction():
        _set_local(app_conn, rls.TENANT_SETTING, str(charlie_org.id))
        assert _select_all(
            app_conn, rls.TenantTable("", "accounts_membership", "organization_id", "uuid")
        ) == [charlie_org.id]


def test_with_no_tenant_nothing_is_visible_and_nothing_can_be_written(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    alice_org, _ = world
    before = _owner_counts()
    with app_conn.transaction():
        for table in _tables():
            assert _select_all(app_conn, table) == [], table.table
    # The role has the privileges (a refusal below is the policy's, not a missing GRANT).
    with app_conn.transaction():
        assert app_conn.execute(
            "SELECT has_table_privilege(current_user, 'accounts_membership', 'INSERT')"
        ).fetchone() == (True,)
    with pytest.raises(errors.InsufficientPrivilege, match="row-level security"), app_conn.transaction():
        app_conn.execute(
            "INSERT INTO accounts_membership (organization_id, user_id, role, created_at)"
            " VALUES (%s, (SELECT id FROM accounts_user WHERE email = 'charlie@other.test'), %s, now())",
            [alice_org.id, Role.OWNER],
        )
    with app_conn.transaction():
        assert app_conn.execute("DELETE FROM accounts_membership").rowcount == 0
        assert app_conn.execute("UPDATE accounts_membership SET role = %s", [Role.OWNER]).rowcount == 0
    assert _owner_counts() == before


def test_alices_tenant_cannot_write_another_organizations_rows(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    alice_org, charlie_org = world
    before = _owner_counts()
    insert = (
        "INSERT INTO accounts_membership (organization_id, user_id, role, created_at)"
        " VALUES (%s, (SELECT id FROM accounts_user WHERE email = 'alice@acme.test'), %s, now())"
    )
    with pytest.raises(errors.InsufficientPrivilege, match="row-level security"), app_conn.transaction():
        _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
        app_conn.execute(insert, [charlie_org.id, Role.OWNER])
    # Moving one of her own rows into Charlie's organization is refused too (WITH CHECK).
    with pytest.raises(errors.InsufficientPrivilege, match="row-level security"), app_conn.transaction():
        _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
        app_conn.execute("UPDATE accounts_membership SET organization_id = %s", [charlie_org.id])
    with app_conn.transaction():
        _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
        # Charlie's rows are out of reach: no WHERE, yet his row survives.
        app_conn.execute("DELETE FROM accounts_membership WHERE organization_id = %s", [charlie_org.id])
        assert app_conn.execute("SELECT count(*) FROM accounts_membership").fetchone() == (2,)
    assert _owner_counts() == before


def test_the_application_role_cannot_switch_the_wall_off(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    before = _owner_counts()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolsuper, rolbypassrls, rolcanlogin,"
            " (SELECT count(*) FROM pg_tables WHERE tableowner = rolname) FROM pg_roles WHERE rolname = %s",
            [ROLE],
        )
        assert cursor.fetchone() == (False, False, True, 0)
    for statement in (
        "ALTER TABLE accounts_membership DISABLE ROW LEVEL SECURITY",
        "ALTER TABLE accounts_membership NO FORCE ROW LEVEL SECURITY",
        f"DROP POLICY {rls.POLICY_NAME} ON accounts_membership",
    ):
        with pytest.raises(errors.InsufficientPrivilege, match="must be owner"), app_conn.transaction():
            app_conn.execute(statement)
    # TRUNCATE ignores row security, so the role is never granted it.
    with pytest.raises(errors.InsufficientPrivilege, match="permission denied"), app_conn.transaction():
        app_conn.execute("TRUNCATE accounts_membership CASCADE")
    # Asking PostgreSQL to skip row security makes the query fail rather than see everything.
    with pytest.raises(errors.InsufficientPrivilege, match="row-level security"), app_conn.transaction():
        app_conn.execute("SET LOCAL row_security = off")
        app_conn.execute("SELECT * FROM accounts_membership")
    assert _owner_counts() == before


def test_the_tenant_ends_with_its_transaction_on_the_same_connection(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    alice_org, _ = world
    membership = rls.TenantTable("accounts.Membership", "accounts_membership", "organization_id", "uuid")
    for end in (app_conn.commit, app_conn.rollback):
        _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
        assert len(_select_all(app_conn, membership)) == 2
        end()
        # The next transaction of the same session: the setting is empty, nothing is visible.
        assert app_conn.execute("SELECT current_setting(%s, true)", [rls.TENANT_SETTING]).fetchone() == ("",)
        assert _select_all(app_conn, membership) == []
        app_conn.rollback()
    # In autocommit every statement is its own transaction: a SET LOCAL dies with it.
    app_conn.autocommit = True
    _set_local(app_conn, rls.TENANT_SETTING, str(alice_org.id))
    assert _select_all(app_conn, membership) == []


def test_the_platform_scope_sees_every_tenants_rows(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    owner = _owner_counts()
    with app_conn.transaction():
        _set_local(app_conn, rls.SCOPE_SETTING, rls.PLATFORM_SCOPE)
        for table in _tables():
            seen = _select_all(app_conn, table)
            counts: dict[uuid.UUID | None, int] = {}
            for org in seen:
                counts[org] = counts.get(org, 0) + 1
            assert counts == owner[table.table], table.table
    with app_conn.transaction():
        # Any other scope value is no scope at all.
        _set_local(app_conn, rls.SCOPE_SETTING, "Platform")
        assert app_conn.execute("SELECT count(*) FROM accounts_membership").fetchone() == (0,)


# --- The portal's plumbing, through the ORM as the application role ------------------------------


def test_tenant_transaction_filters_an_unfiltered_queryset(world, app_alias) -> None:  # type: ignore[no-untyped-def]
    alice_org, charlie_org = world
    memberships = Membership.objects.using(app_alias)
    with rls.tenant_transaction(alice_org.id, using=app_alias):
        assert sorted(memberships.values_list("organization_id", flat=True)) == [alice_org.id] * 2
        with pytest.raises(Exception, match="row-level security"), transaction.atomic(using=app_alias):
            memberships.filter(organization=alice_org).update(organization=charlie_org)
    # The same (persistent) connection afterwards: no tenant, nothing.
    assert memberships.count() == 0
    with transaction.atomic(using=app_alias):
        assert memberships.count() == 0
    with rls.platform_transaction(using=app_alias):
        assert memberships.count() == 3
        # A tenant block inside platform work narrows it, and the platform scope comes back after.
        with rls.tenant_transaction(str(charlie_org.id), using=app_alias):
            assert list(memberships.values_list("organization_id", flat=True)) == [charlie_org.id]
        assert memberships.count() == 3
        # A failed inner block rolls back to its savepoint, its setting with it.
        with pytest.raises(ZeroDivisionError), rls.tenant_transaction(alice_org.id, using=app_alias):
            assert memberships.count() == 2
            _ = 1 / 0
        assert memberships.count() == 3
    assert memberships.count() == 0
    assert Membership.objects.filter(organization=alice_org).count() == 2  # the update was refused


@pytest.mark.django_db
def test_tenant_transaction_refuses_an_id_that_is_not_an_organization_id() -> None:
    for bad in ("", "1 OR true", "'; RESET ALL; --", 42):
        with pytest.raises(ValueError, match="organization_id"), rls.tenant_transaction(bad):
            pass


@pytest.mark.django_db
def test_db_app_role_refuses_the_owner_and_bad_names(postgres: None) -> None:
    from django.core.management.base import CommandError

    owner = connection.settings_dict["USER"]
    with pytest.raises(CommandError, match="owner"):
        call_command("db_app_role", "--role", owner, stdout=io.StringIO())
    with pytest.raises(CommandError, match="role"):
        call_command("db_app_role", "--role", 'x"; DROP TABLE accounts_membership; --', stdout=io.StringIO())
    with pytest.raises(CommandError, match="TG_RLS_TEST_UNSET"):
        call_command("db_app_role", "--password-env", "TG_RLS_TEST_UNSET", stdout=io.StringIO())
    assert connection.introspection.table_names().count("accounts_membership") == 1


# --- A user's own memberships, and the request's scope -------------------------------------------


def test_a_declared_user_sees_only_their_own_memberships_and_writes_none(world, app_conn) -> None:  # type: ignore[no-untyped-def]
    alice_org, charlie_org = world
    before = _owner_counts()
    charlie_id = Membership.objects.get(organization=charlie_org).user_id
    with app_conn.transaction():
        _set_local(app_conn, rls.USER_SETTING, str(charlie_id))
        rows = app_conn.execute("SELECT organization_id, user_id FROM accounts_membership").fetchall()
        assert rows == [(charlie_org.id, charlie_id)]
        # Read-only: the user's own row cannot be changed or removed through this policy.
        assert app_conn.execute("UPDATE accounts_membership SET role = %s", [Role.OWNER]).rowcount == 0
        assert app_conn.execute("DELETE FROM accounts_membership").rowcount == 0
        # Nothing else of any tenant's becomes visible with it.
        assert (
            _select_all(app_conn, rls.TenantTable("", "compliance_auditevent", "organization_id", "uuid"))
            == []
        )
    with pytest.raises(errors.InsufficientPrivilege, match="row-level security"), app_conn.transaction():
        _set_local(app_conn, rls.USER_SETTING, str(charlie_id))
        app_conn.execute(
            "INSERT INTO accounts_membership (organization_id, user_id, role, created_at) VALUES (%s, %s, %s, now())",
            [alice_org.id, charlie_id, Role.OWNER],
        )
    assert _owner_counts() == before


@pytest.mark.django_db
def test_a_membership_table_without_the_own_memberships_policy_is_reported(postgres: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP POLICY {rls.OWN_MEMBERSHIPS_POLICY} ON accounts_membership")
    assert rls.rls_missing(registry=apps, connection=connection) == ["accounts_membership"]
    emit_post_migrate_signal(verbosity=0, interactive=False, db=DEFAULT_DB_ALIAS)
    assert rls.rls_missing(registry=apps, connection=connection) == []


def test_scope_transaction_sets_the_tenant_of_the_open_transaction_only(world, app_alias) -> None:  # type: ignore[no-untyped-def]
    alice_org, charlie_org = world
    memberships = Membership.objects.using(app_alias)
    with pytest.raises(RuntimeError, match="open transaction"):
        rls.scope_transaction(organization_id=alice_org.id, using=app_alias)
    with transaction.atomic(using=app_alias):
        assert memberships.count() == 0
        rls.scope_transaction(organization_id=alice_org.id, using=app_alias)
        assert memberships.count() == 2
        # Later in the same transaction (a request that learns its tenant from an API token).
        rls.scope_transaction(organization_id=charlie_org.id, using=app_alias)
        assert memberships.count() == 1
        rls.scope_transaction(platform=True, using=app_alias)
        assert memberships.count() == 3
    assert memberships.count() == 0
    with pytest.raises(ValueError, match="organization_id"), transaction.atomic(using=app_alias):
        rls.scope_transaction(organization_id="1 OR true", using=app_alias)


def test_the_request_middleware_rolls_back_a_server_errors_writes(world) -> None:  # type: ignore[no-untyped-def]
    from django.http import HttpResponse
    from django.test import RequestFactory

    from compliance.models import AuditEvent
    from compliance.services import audit_record
    from portal.accounts.middleware import RequestScopeMiddleware

    alice_org, _ = world
    before = AuditEvent.objects.filter(organization=alice_org).count()

    def view(status: int) -> HttpResponse:
        audit_record(actor=None, organization=alice_org, action="test.write")
        return HttpResponse(status=status)

    request = RequestFactory().get("/")
    assert RequestScopeMiddleware(lambda r: view(500))(request).status_code == 500
    assert AuditEvent.objects.filter(organization=alice_org).count() == before
    assert RequestScopeMiddleware(lambda r: view(200))(request).status_code == 200
    assert AuditEvent.objects.filter(organization=alice_org).count() == before + 1
