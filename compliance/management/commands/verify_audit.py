"""`manage.py verify_audit [--chain KEY]`: recompute the audit hash chains and name the first
broken link of each broken chain. Exits non-zero when any chain is broken."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from compliance.models import AuditEvent
from compliance.services import audit_verify


class Command(BaseCommand):
    help = "Verify the audit trail's hash chains; names the first broken link."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chain", help="one chain: an organization id, or 'platform'")

    def handle(self, *args: Any, **options: Any) -> None:
        broken = audit_verify(chain_key=options.get("chain"))
        if broken:
            for link in broken:
                self.stderr.write(f"BROKEN {link}")
            raise CommandError(f"audit trail broken: first broken link in {broken[0]}")
        total = AuditEvent.objects.count() if options.get("chain") is None else None
        suffix = f" ({total} events)" if total is not None else ""
        self.stdout.write(f"audit trail intact{suffix}")
