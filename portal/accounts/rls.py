"""PostgreSQL row-level security: the second tenant wall, below the ORM's filters.

Every tenant table (every model with an `organization` foreign key, found in the app registry
so that a new tenant model is covered as soon as it is migrated) has row-level security enabled
and *forced*, and one policy: a row is visible, and may be written, only when its
`organization_id` equals the transaction's tenant (`tailguard.organization_id`), or when the
transaction declared the platform-wide scope (`tailguard.scope = 'platform'`, for cross-tenant
platform work: the admin SLA console, beat tasks). With neither set, nothing is visible and every
insert is refused, so a query that forgot its `organization` filter returns nothing instead of
another tenant's rows.

The settings are only ever set transaction-locally (`set_config(name, value, true)`, i.e.
`SET LOCAL`, with the value as a bound parameter), by `tenant_transaction()`,
`platform_transaction()` and `scope_transaction()`: they end with the transaction, so a pooled
or persistent connection never carries one request's tenant into the next. After such a
transaction PostgreSQL keeps the custom setting defined but empty, hence the `NULLIF(..., '')`
in the policy. A third setting, `tailguard.user_id`, names the signed-in user: a second policy,
read-only, on the membership table shows that user's own memberships, so a request can choose
its organization among them before it has a tenant.

Every web request runs in one transaction scoped this way (`RequestScopeMiddleware`): the
tenant is the session's current organization, or the API token's; staff tools and the admin
declare the platform scope; a request with neither sees no tenant rows at all.

The wall binds only a role that is neither a superuser, nor has BYPASSRLS, nor owns the tables
(FORCE makes the owner subject too, but production should not connect as the owner anyway):
`manage.py db_app_role` creates such a role. The test suite connects as the `postgres`
superuser, which bypasses row-level security, so the policies change nothing for it. SQLite has
no row-level security: there every function here is a no-op and the context managers only open
`transaction.atomic()`.

This is a guard against a forgotten filter, not against hostile SQL: code that can run
arbitrary statements as the application role can also set the platform scope.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.apps.registry import Apps
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

TENANT_SETTING = "tailguard.organization_id"
SCOPE_SETTING = "tailguard.scope"
# The signed-in user, so that a request can find its own memberships before it knows its tenant.
USER_SETTING = "tailguard.user_id"
PLATFORM_SCOPE = "platform"
POLICY_NAME = "tailguard_tenant_isolation"
# A second, read-only policy on the membership table: a user's own memberships are visible to a
# transaction that declared that user (which organization a request acts in is chosen from them).
OWN_MEMBERSHIPS_POLICY = "tailguard_own_memberships"
OWN_MEMBERSHIPS_MODEL = "accounts.Membership"
# The migration that turns the wall on; after it, every `migrate` re-checks new tenant tables.
MIGRATION = ("accounts", "0002_row_level_security")
DEFAULT_APP_ROLE = "tailguard_app"
# Celery workers and beat do platform work across tenants (a job's rows, every endpoint's
# scrapes): their role bypasses row-level security but, like the web role, owns nothing.
DEFAULT_WORKER_ROLE = "tailguard_worker"
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"  # never TRUNCATE: it ignores row security


@dataclass(frozen=True)
class TenantTable:
    label: str  # the model's "app_label.ModelName"
    table: str  # its database table
    column: str  # the organization foreign key's column
    column_type: str  # that column's database type (uuid), what the tenant setting is cast to


def tenant_tables(registry: Apps, connection: BaseDatabaseWrapper) -> list[TenantTable]:
    """Every table of a model with an `organization` key, in the given (live or historical) registry."""
    found = []
    for model in registry.get_models():
        meta = model._meta
        if not meta.managed or meta.proxy:
            continue
        for field in meta.concrete_fields:
            if field.name == "organization" and field.is_relation:
                column_type = field.db_type(connection)
                if column_type is None:
                    raise ImproperlyConfigured(f"{meta.label}.organization has no database column type")
                found.append(TenantTable(meta.label, meta.db_table, field.column, column_type))
    return sorted(found, key=lambda t: t.table)


def _policy_predicate(table: TenantTable) -> str:
    # Each setting is read in a scalar subquery: PostgreSQL evaluates it once per statement (an
    # InitPlan) rather than once per row, and can match the tenant against the column's index.
    return (
        f"((SELECT current_setting('{SCOPE_SETTING}', true)) = '{PLATFORM_SCOPE}'"
        f" OR {_quote(table.column)} = "
        f"(SELECT NULLIF(current_setting('{TENANT_SETTING}', true), '')::{table.column_type}))"
    )


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def rls_missing(*, registry: Apps, connection: BaseDatabaseWrapper) -> list[str]:
    """Tenant tables without forced row-level security or without the policy (names, sorted)."""
    if connection.vendor != "postgresql":
        return []
    tables = tenant_tables(registry, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname
            FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
            WHERE c.relname = ANY(%s)
              AND c.relrowsecurity AND c.relforcerowsecurity
              AND EXISTS (SELECT 1 FROM pg_policy p
                          WHERE p.polrelid = c.oid AND p.polname = %s AND p.polcmd = '*')
            """,
            [[t.table for t in tables], POLICY_NAME],
        )
        covered = {row[0] for row in cursor.fetchall()}
        own = _own_memberships(connection)
        if own is not None:
            cursor.execute(
                "SELECT 1 FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()"
                " WHERE c.relname = %s AND p.polname = %s AND p.polcmd = 'r'",
                [own[0], OWN_MEMBERSHIPS_POLICY],
            )
            if cursor.fetchone() is None:
                covered.discard(own[0])
    return sorted(t.table for t in tables if t.table not in covered)


def _own_memberships(
    connection: BaseDatabaseWrapper, registry: Apps | None = None
) -> tuple[str, str, str] | None:
    """The membership table, its user column and that column's type (None without the model)."""
    if registry is None:
        from django.apps import apps as live_apps

        registry = live_apps
    try:
        model = registry.get_model(OWN_MEMBERSHIPS_MODEL)
    except LookupError:
        return None
    field = model._meta.get_field("user")
    column_type = field.db_type(connection)
    if column_type is None:
        raise ImproperlyConfigured(f"{OWN_MEMBERSHIPS_MODEL}.user has no database column type")
    return model._meta.db_table, field.column, column_type


def rls_enable(*, registry: Apps, connection: BaseDatabaseWrapper, only_missing: bool = False) -> list[str]:
    """Enable and force row-level security with the tenant policy on every tenant table.

    Idempotent: the policy is dropped and created again, so a changed predicate reaches tables
    that already had one. Returns the tables it (re)applied.
    """
    if connection.vendor != "postgresql":
        return []
    tables = tenant_tables(registry, connection)
    if only_missing:
        missing = set(rls_missing(registry=registry, connection=connection))
        tables = [t for t in tables if t.table in missing]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        for table in tables:
            name = _quote(table.table)
            predicate = _policy_predicate(table)
            # Identifiers come from the models' metadata, quoted; the statement has no values.
            cursor.execute(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY")
            cursor.execute(f"ALTER TABLE {name} FORCE ROW LEVEL SECURITY")
            cursor.execute(f"DROP POLICY IF EXISTS {POLICY_NAME} ON {name}")
            cursor.execute(
                f"CREATE POLICY {POLICY_NAME} ON {name} AS PERMISSIVE FOR ALL TO PUBLIC"
                f" USING {predicate} WITH CHECK {predicate}"
            )
        own = _own_memberships(connection, registry)
        if own is not None and own[0] in {t.table for t in tables}:
            own_table, column, column_type = own
            cursor.execute(f"DROP POLICY IF EXISTS {OWN_MEMBERSHIPS_POLICY} ON {_quote(own_table)}")
            # SELECT only: what a user may see of their own memberships, never write.
            cursor.execute(
                f"CREATE POLICY {OWN_MEMBERSHIPS_POLICY} ON {_quote(own_table)} AS PERMISSIVE FOR SELECT TO PUBLIC"
                f" USING ({_quote(column)} ="
                f" (SELECT NULLIF(current_setting('{USER_SETTING}', true), '')::{column_type}))"
            )
    return [t.table for t in tables]


def rls_disable(*, registry: Apps, connection: BaseDatabaseWrapper) -> None:
    """Undo `rls_enable` (the migration's reverse)."""
    if connection.vendor != "postgresql":
        return
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        for table in tenant_tables(registry, connection):
            name = _quote(table.table)
            cursor.execute(f"DROP POLICY IF EXISTS {OWN_MEMBERSHIPS_POLICY} ON {name}")
            cursor.execute(f"DROP POLICY IF EXISTS {POLICY_NAME} ON {name}")
            cursor.execute(f"ALTER TABLE {name} NO FORCE ROW LEVEL SECURITY")
            cursor.execute(f"ALTER TABLE {name} DISABLE ROW LEVEL SECURITY")


def own_memberships_disable(*, registry: Apps, connection: BaseDatabaseWrapper) -> None:
    """Drop the membership table's own-memberships policy (its migration's reverse)."""
    own = _own_memberships(connection, registry) if connection.vendor == "postgresql" else None
    if own is not None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP POLICY IF EXISTS {OWN_MEMBERSHIPS_POLICY} ON {_quote(own[0])}")


# --- Transaction-scoped tenant -------------------------------------------------------------


def _as_uuid(organization_id: object) -> uuid.UUID:
    if isinstance(organization_id, uuid.UUID):
        return organization_id
    try:
        return uuid.UUID(str(organization_id))
    except ValueError:
        raise ValueError(f"organization_id {organization_id!r} is not an organization id (a UUID)") from None


@contextmanager
def _scoped(using: str | None, organization_id: str, scope: str) -> Iterator[None]:
    connection = transaction.get_connection(using)
    if connection.vendor != "postgresql":
        with transaction.atomic(using=using):
            yield
        return
    # Nested inside another transaction, the outer one's tenant comes back when this block ends
    # (SET LOCAL lasts to the end of the whole transaction, not of the savepoint).
    nested = connection.in_atomic_block
    previous: tuple[str, str] | None = None
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            if nested:
                cursor.execute(
                    "SELECT coalesce(current_setting(%s, true), ''), coalesce(current_setting(%s, true), '')",
                    [TENANT_SETTING, SCOPE_SETTING],
                )
                previous = cursor.fetchone()
            _set_local(cursor, organization_id, scope)
        yield
    if previous is not None:
        # Only on success: a failed block rolled back to its savepoint, settings included.
        with connection.cursor() as cursor:
            _set_local(cursor, *previous)


def _set_local(cursor: object, organization_id: str, scope: str) -> None:
    cursor.execute(  # type: ignore[attr-defined]
        "SELECT set_config(%s, %s, true), set_config(%s, %s, true)",
        [TENANT_SETTING, organization_id, SCOPE_SETTING, scope],
    )


def scope_transaction(
    *,
    organization_id: object = None,
    platform: bool = False,
    user_id: object = None,
    using: str | None = None,
) -> None:
    """Set the tenant (or the platform scope) of the transaction already open, for the rest of it.

    For code that learns its tenant part-way through a transaction: a web request, opened by
    `RequestScopeMiddleware` before anything is known, learns it from the session's membership or
    from an API token. `user_id`, when given, also declares the signed-in user (its own
    memberships become visible). Outside a transaction it refuses: a SET LOCAL there would end
    with the very statement that set it.
    """
    connection = transaction.get_connection(using)
    if connection.vendor != "postgresql":
        return
    if not connection.in_atomic_block:
        raise RuntimeError("scope_transaction needs an open transaction (transaction.atomic())")
    tenant = "" if organization_id is None else str(_as_uuid(organization_id))
    with connection.cursor() as cursor:
        _set_local(cursor, tenant, PLATFORM_SCOPE if platform else "")
        if user_id is not None:
            cursor.execute("SELECT set_config(%s, %s, true)", [USER_SETTING, str(int(str(user_id)))])


@contextmanager
def tenant_transaction(organization_id: object, *, using: str | None = None) -> Iterator[None]:
    """A transaction that sees and writes only this organization's rows of tenant tables."""
    with _scoped(using, str(_as_uuid(organization_id)), ""):
        yield


@contextmanager
def platform_transaction(*, using: str | None = None) -> Iterator[None]:
    """A transaction for cross-tenant platform work (admin consoles, beat tasks): sees every row."""
    with _scoped(using, "", PLATFORM_SCOPE):
        yield


# --- The application role --------------------------------------------------------------------


class AppRoleError(Exception):
    """The application role cannot be set up as asked; the message names what to change."""


def app_role_ensure(
    *,
    connection: BaseDatabaseWrapper,
    role: str = DEFAULT_APP_ROLE,
    password: str | None = None,
    bypass_rls: bool = False,
) -> list[str]:
    """Create (or bring into line) the non-owner role the application connects as. Idempotent.

    The role may log in, is not a superuser, has no BYPASSRLS (unless `bypass_rls`, for the
    workers' role), owns nothing, and gets SELECT,
    INSERT, UPDATE and DELETE on this schema's tables and USAGE on its sequences, now and (through
    default privileges of the role running this, the tables' owner) for tables migrations add
    later. Returns what it did, one line each.
    """
    if connection.vendor != "postgresql":
        raise AppRoleError("the application role needs PostgreSQL (DATABASE_URL); SQLite has no roles")
    if not _ROLE_NAME.match(role):
        raise AppRoleError(f"role {role!r} is not a plain lower-case PostgreSQL name ([a-z_][a-z0-9_]*)")
    from psycopg import sql

    done = []
    ident = sql.Identifier(role)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_schema(), current_database()")
        owner, schema, database = cursor.fetchone()
        if owner == role:
            raise AppRoleError(
                f"role {role!r} is the one running this (the tables' owner); run it with the owner's "
                "DATABASE_URL and name another role for the application"
            )
        cursor.execute("SELECT count(*) FROM pg_tables WHERE tableowner = %s", [role])
        if cursor.fetchone()[0]:
            raise AppRoleError(f"role {role!r} owns tables; the application role must own none")
        raw = cursor.connection  # psycopg's connection: composes identifiers and literals safely
        # Two processes may create the role at once (roles are cluster-wide): the loser is a no-op.
        cursor.execute(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
                "CREATE ROLE {role} LOGIN; END IF; "
                "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            )
            .format(name=sql.Literal(role), role=ident)
            .as_string(raw)
        )
        attributes = (
            f"LOGIN NOSUPERUSER {'BYPASSRLS' if bypass_rls else 'NOBYPASSRLS'} NOCREATEDB NOCREATEROLE"
        )
        # The attributes are fixed keywords chosen above, never input.
        cursor.execute(sql.SQL("ALTER ROLE {} WITH " + attributes).format(ident).as_string(raw))
        done.append(f"role {role}: {attributes}")
        if password is not None:
            # ALTER ROLE takes no bound parameters; the literal is quoted by psycopg.
            cursor.execute(
                sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(ident, sql.Literal(password)).as_string(raw)
            )
            done.append(f"role {role}: password set")
        schema_ident = sql.Identifier(schema)
        for statement in (
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), ident),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_ident, ident),
            sql.SQL("GRANT " + _TABLE_PRIVILEGES + " ON ALL TABLES IN SCHEMA {} TO {}").format(
                schema_ident, ident
            ),
            sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(schema_ident, ident),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT " + _TABLE_PRIVILEGES + " ON TABLES TO {}"
            ).format(schema_ident, ident),
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT USAGE, SELECT ON SEQUENCES TO {}").format(
                schema_ident, ident
            ),
        ):
            cursor.execute(statement.as_string(raw))
        done.append(
            f"granted {_TABLE_PRIVILEGES} on every table and USAGE on every sequence of schema {schema} "
            f"in database {database} (and on those {owner} creates later)"
        )
    return done
