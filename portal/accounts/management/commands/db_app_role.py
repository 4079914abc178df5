"""`manage.py db_app_role [--worker] [--role NAME] [--password-env VAR] [--database ALIAS]`: create
(or bring into line) the PostgreSQL role the web processes connect as, so that row-level security
binds them; with `--worker`, the Celery workers' role (BYPASSRLS: their tasks are platform work).
Neither owns a table, so neither can alter, truncate or switch the policies off.

Run it with the tables' owner's DATABASE_URL, after `migrate`; it is idempotent. The password is
read from an environment variable, never from the command line (which `ps` shows).
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from portal.accounts import rls


class Command(BaseCommand):
    help = "Create or update the non-owner PostgreSQL role the application connects as (row-level security)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--role", help=f"default {rls.DEFAULT_APP_ROLE} ({rls.DEFAULT_WORKER_ROLE} with --worker)"
        )
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            help="environment variable holding the role's password (unset: the password is left as it is)",
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="database alias (default: default)")
        parser.add_argument(
            "--worker",
            action="store_true",
            help=(
                f"the Celery workers' role instead (default name {rls.DEFAULT_WORKER_ROLE}): it bypasses "
                "row-level security for platform work, and owns nothing either"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = None
        if options["password_env"]:
            password = os.environ.get(options["password_env"])
            if not password:
                raise CommandError(
                    f"--password-env: environment variable {options['password_env']} is empty or unset"
                )
        try:
            worker = bool(options["worker"])
            role = options["role"] or (rls.DEFAULT_WORKER_ROLE if worker else rls.DEFAULT_APP_ROLE)
            done = rls.app_role_ensure(
                connection=connections[options["database"]], role=role, password=password, bypass_rls=worker
            )
        except rls.AppRoleError as exc:
            raise CommandError(str(exc)) from None
        for line in done:
            self.stdout.write(line)
