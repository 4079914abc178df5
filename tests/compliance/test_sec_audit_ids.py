"""Audit-event ids reveal nothing about other tenants (issue 27 finding 14).

The integer key counts every tenant's events together: from two of her own events' ids, Alice
could read how much Charlie's organization did in between. Wherever an event leaves the server
(the API, the CSV and JSON exports, the evidence pack, verification messages) it is named by a
random UUID instead, and the hash chains verify as before, across the migration too.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
import zipfile

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance import services, verify_export
from compliance.models import AuditEvent
from portal.accounts.models import Organization, User

pytestmark = pytest.mark.django_db


def _interleaved(alice: User, alice_org: Organization, charlie: User) -> None:
    charlie_org = Organization.objects.get(memberships__user=charlie)
    for n in range(3):
        services.audit_record(actor=alice, organization=alice_org, action="alice.step", data={"n": n})
        for m in range(5):  # Charlie's organization is busy in between
            services.audit_record(
                actor=charlie, organization=charlie_org, action="charlie.step", data={"m": m}
            )


def _assert_public(ids: list[str], events: list[AuditEvent]) -> None:
    """Every id given out is the event's random public id, never its sequential key."""
    by_public = {str(e.public_id): e for e in events}
    assert ids and all(str(uuid.UUID(i)) == i and uuid.UUID(i).version == 4 for i in ids)
    assert set(ids) <= set(by_public)
    assert not {str(e.pk) for e in events} & set(ids)


def test_the_api_and_the_exports_name_events_by_random_ids(
    alice: User, alice_org: Organization, charlie: User, alice_client: Client, regions: object
) -> None:
    _interleaved(alice, alice_org, charlie)
    mine = list(AuditEvent.objects.filter(organization=alice_org).order_by("seq"))
    steps = [e for e in mine if e.action == "alice.step"]
    # The internal keys do say Charlie was busy in between; nothing given out does.
    assert steps[1].pk - steps[0].pk == 6

    api = APIClient()
    api.force_authenticate(alice)
    listed = api.get("/api/v1/compliance/audit-events/").json()["results"]
    _assert_public([e["id"] for e in listed], mine)
    assert {e["id"]: e["seq"] for e in listed}[str(steps[1].public_id)] == steps[1].seq

    exported = json.loads(
        alice_client.get(reverse("compliance:audit_export"), {"export_format": "json"}).content
    )
    _assert_public(
        [r["id"] for r in exported["events"]], list(AuditEvent.objects.filter(organization=alice_org))
    )
    assert verify_export.first_broken(exported["events"]) is None

    body = alice_client.get(reverse("compliance:audit_export"), {"export_format": "csv"}).content.decode()
    rows = list(csv.DictReader(io.StringIO(body)))
    _assert_public([r["id"] for r in rows], list(AuditEvent.objects.filter(organization=alice_org)))

    pack = alice_client.get(reverse("sla:evidence_pack"), {"month": "2026-11"})
    assert pack.status_code == 200
    content = b"".join(pack.streaming_content) if pack.streaming else pack.content
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        chain_rows = json.loads(archive.read("audit/chain.json"))["events"]
    _assert_public([r["id"] for r in chain_rows], list(AuditEvent.objects.filter(organization=alice_org)))


def test_a_broken_link_is_named_by_the_public_id(alice: User, alice_org: Organization) -> None:
    services.audit_record(actor=alice, organization=alice_org, action="test.event", data={})
    victim = AuditEvent.objects.filter(organization=alice_org).order_by("seq").last()
    assert victim is not None
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE compliance_auditevent DISABLE TRIGGER compliance_auditevent_append_only")
        cursor.execute("UPDATE compliance_auditevent SET action = 'forged' WHERE id = %s", [victim.pk])
        cursor.execute("ALTER TABLE compliance_auditevent ENABLE TRIGGER compliance_auditevent_append_only")
    (link,) = services.audit_verify(chain_key=str(alice_org.pk))
    assert link.event_id == str(victim.public_id) and f"event id {victim.public_id}" in str(link)


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_events_ids_without_updating_a_row(
    alice: User, alice_org: Organization, charlie: User
) -> None:
    """Run on PostgreSQL with the append-only trigger on: an UPDATE of any audit row would fail."""
    _interleaved(alice, alice_org, charlie)
    count = AuditEvent.objects.count()
    executor = MigrationExecutor(connection)
    executor.migrate([("compliance", "0008_baa_countersignature")])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    # Forward to every app's latest: going back unapplied other apps' migrations that depend on
    # compliance's later ones (and theirs), which later tests on this database need.
    executor.migrate(executor.loader.graph.leaf_nodes())
    ids = list(AuditEvent.objects.values_list("public_id", flat=True))
    assert len(ids) == count and len(set(ids)) == count and all(i is not None for i in ids)
    call_command("verify_audit")  # every chain intact: the ids are not hashed
    services.audit_record(actor=alice, organization=alice_org, action="after.migration", data={})
    assert services.audit_verify() == []
