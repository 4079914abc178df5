"""The audit trail: hash chain, append-only in the database, tamper detection, export, request ids."""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.urls import reverse
from rest_framework.test import APIClient

from compliance import chain, services
from compliance.models import AuditChainHead, AuditEvent
from portal.accounts import services as account_services
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _disable_trigger() -> None:
    """Only inside this test's transaction (ALTER TABLE is transactional in PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE compliance_auditevent DISABLE TRIGGER compliance_auditevent_append_only")


def _chain(org) -> list[AuditEvent]:  # type: ignore[no-untyped-def]
    return list(AuditEvent.objects.filter(chain=str(org.pk)).order_by("seq"))


def test_events_form_one_chain_per_organization(alice, alice_org, charlie) -> None:  # type: ignore[no-untyped-def]
    for n in range(3):
        services.audit_record(
            actor=alice, organization=alice_org, action="test.event", data={"n": n, "x": 0.1}
        )
    events = _chain(alice_org)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].prev_hash == chain.GENESIS_HASH
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    # Charlie's organization has its own chain; the signups are on the platform chain.
    charlie_org = charlie.memberships.get().organization
    assert [e.action for e in _chain(charlie_org)] == ["organization.create"]
    assert AuditEvent.objects.filter(chain=chain.PLATFORM_CHAIN, action="user.signup").count() == 2
    head = AuditChainHead.objects.get(chain=str(alice_org.pk))
    assert (head.seq, head.hash) == (events[-1].seq, events[-1].hash)
    assert services.audit_verify() == []


def test_the_database_refuses_update_and_delete_of_audit_rows(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("the append-only trigger is PostgreSQL's (SQLite relies on the chain alone)")
    event = _chain(alice_org)[0]
    for statement in (
        "UPDATE compliance_auditevent SET action = 'forged' WHERE id = %s",
        "DELETE FROM compliance_auditevent WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement, [event.id])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(id=event.id).update(action="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(id=event.id).delete()
    event.refresh_from_db()
    assert event.action == "organization.create"


def test_verify_audit_names_the_first_edited_event(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    for n in range(4):
        services.audit_record(actor=alice, organization=alice_org, action="test.event", data={"n": n})
    call_command("verify_audit")  # intact: no error
    events = _chain(alice_org)
    victim = events[2]
    _disable_trigger()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE compliance_auditevent SET data = %s WHERE id = %s", [json.dumps({"n": 99}), victim.id]
        )
    broken = services.audit_verify()
    assert len(broken) == 1
    assert (broken[0].chain, broken[0].seq, broken[0].event_id) == (
        str(alice_org.pk),
        victim.seq,
        str(victim.public_id),
    )
    assert "edited" in broken[0].reason
    err = io.StringIO()
    with pytest.raises(CommandError, match=f"event id {victim.public_id}"):
        call_command("verify_audit", stderr=err)
    assert f"position {victim.seq}" in err.getvalue()


def test_verify_audit_detects_removed_and_rewritten_events(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    for n in range(3):
        services.audit_record(actor=alice, organization=alice_org, action="test.event", data={"n": n})
    events = _chain(alice_org)
    _disable_trigger()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM compliance_auditevent WHERE id = %s", [events[1].id])
    (link,) = services.audit_verify(chain_key=str(alice_org.pk))
    assert link.seq == events[1].seq and "missing" in link.reason

    # Removing the tail is caught by the chain head.
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM compliance_auditevent WHERE chain = %s AND seq >= %s", [str(alice_org.pk), 2]
        )
    (link,) = services.audit_verify(chain_key=str(alice_org.pk))
    assert "head" in link.reason


def test_a_forger_who_rehashes_one_event_still_breaks_the_next_link(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    for n in range(3):
        services.audit_record(actor=alice, organization=alice_org, action="test.event", data={"n": n})
    events = _chain(alice_org)
    victim = events[1]
    victim.action = "forged"
    new_hash = chain.event_hash({name: getattr(victim, name) for name in chain.HASHED_FIELDS})
    _disable_trigger()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE compliance_auditevent SET action = 'forged', hash = %s WHERE id = %s",
            [new_hash, victim.id],
        )
    (link,) = services.audit_verify()
    assert link.event_id == str(events[2].public_id) and "previous-hash" in link.reason


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_never_fork_a_chain(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(15):
                with transaction.atomic():
                    services.audit_record(
                        actor=None, organization=alice_org, action="test.concurrent", data={"w": n, "i": i}
                    )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    events = _chain(alice_org)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len([e for e in events if e.action == "test.concurrent"]) == 60
    assert services.audit_verify() == []


def test_hashes_survive_the_database_round_trip_of_awkward_numbers(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    services.audit_record(
        actor=alice,
        organization=alice_org,
        action="test.numbers",
        data={"big": 1e20, "tiny": 1e-7, "neg_zero": -0.0, "x": [3.0, 0.1, 2**70], "u": "caf\u00e9"},
    )
    assert services.audit_verify() == []
    with pytest.raises(ValueError, match="NaN"):
        services.audit_record(actor=alice, organization=alice_org, action="x", data={"v": float("nan")})


def test_audit_data_never_takes_text(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    count = AuditEvent.objects.count()
    with pytest.raises(ValueError, match="text fields"):
        services.audit_record(actor=alice, organization=alice_org, action="x", data={"prompt": "my symptoms"})
    with pytest.raises(ValueError, match="longer than"):
        services.audit_record(actor=alice, organization=alice_org, action="x", data={"note": "a" * 600})
    assert AuditEvent.objects.count() == count


def test_before_and_after_are_recorded_as_digests(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    event = services.audit_record(
        actor=alice,
        organization=alice_org,
        action="x",
        before={"regions": ["us"]},
        after={"regions": ["us", "eu"]},
    )
    assert event.before_digest == chain.digest({"regions": ["us"]})
    assert event.after_digest == chain.digest({"regions": ["us", "eu"]})
    assert "eu" not in json.dumps(event.data)


def test_request_id_is_recorded_and_echoed(alice_client, alice_org) -> None:  # type: ignore[no-untyped-def]
    response = alice_client.post(
        reverse("accounts:api_tokens"), {"name": "ci"}, HTTP_X_REQUEST_ID="req-0123456789abcdef"
    )
    assert response["X-Request-ID"] == "req-0123456789abcdef"
    event = AuditEvent.objects.get(action="api_token.create")
    assert event.request_id == "req-0123456789abcdef"
    # A malformed id is replaced, never stored.
    response = alice_client.get(reverse("accounts:dashboard"), HTTP_X_REQUEST_ID="bad id\n")
    assert response["X-Request-ID"] != "bad id\n" and len(response["X-Request-ID"]) == 32


def test_deleting_a_user_keeps_their_events(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    signup = AuditEvent.objects.get(action="user.signup", actor_label=alice.email)
    bystander = account_services.user_signup(email="dave@acme.test", password=PASSWORD)
    bystander.delete()
    assert AuditEvent.objects.filter(action="user.signup", actor_label="dave@acme.test").exists()
    assert services.audit_verify() == []
    signup.refresh_from_db()


# --- Export -----------------------------------------------------------------------------------


def _verify_export(rows: list[dict]) -> None:  # type: ignore[type-arg]
    """What an auditor does with the export, with nothing but the documented format."""
    previous = chain.GENESIS_HASH
    for row in rows:
        fields = {**row, "data": row["data"] if isinstance(row["data"], dict) else json.loads(row["data"])}
        fields["seq"] = int(fields["seq"])
        fields["actor_id"] = fields["actor_id"] or None
        assert fields["prev_hash"] == previous
        assert chain.event_hash(fields) == fields["hash"]
        previous = fields["hash"]


def test_export_json_and_csv_verify_offline(alice, alice_org, alice_client, regions) -> None:  # type: ignore[no-untyped-def]
    services.audit_record(
        actor=alice, organization=alice_org, action="test.event", data={"n": 1.5, "ok": True}
    )
    response = alice_client.get(reverse("compliance:audit_export"), {"export_format": "json"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert body["organization"] == str(alice_org.pk)
    assert [r["action"] for r in body["events"]][:2] == ["organization.create", "test.event"]
    _verify_export(body["events"])

    api = APIClient()
    api.force_authenticate(alice)
    response = api.get("/api/v1/compliance/audit-export/", {"export_format": "csv"})
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    # The first export is itself recorded, so this one has one event more.
    assert rows[-1]["action"] == "audit.export"
    _verify_export(rows)
    assert all(r["organization_id"] == str(alice_org.pk) for r in rows)


def test_export_is_tenant_scoped_and_needs_admin(
    alice, alice_org, bob, bob_client, charlie, charlie_client, regions
) -> None:  # type: ignore[no-untyped-def]
    services.audit_record(actor=alice, organization=alice_org, action="alice.secret", data={})
    body = json.loads(charlie_client.get(reverse("compliance:audit_export")).content)
    assert {r["action"] for r in body["events"]} >= {"organization.create"}
    assert "alice.secret" not in {r["action"] for r in body["events"]}
    assert all(r["organization_id"] != str(alice_org.pk) for r in body["events"])

    api = APIClient()
    api.force_authenticate(charlie)
    listed = api.get("/api/v1/compliance/audit-events/").json()["results"]
    assert "alice.secret" not in {e["action"] for e in listed}

    count = AuditEvent.objects.count()
    assert bob_client.get(reverse("compliance:audit_export")).status_code == 403
    api.force_authenticate(bob)
    assert api.get("/api/v1/compliance/audit-export/").status_code == 403
    assert AuditEvent.objects.count() == count


def test_export_outside_the_allowed_regions_is_refused(alice, alice_org, alice_client, regions) -> None:  # type: ignore[no-untyped-def]
    count = AuditEvent.objects.count()
    response = alice_client.get(reverse("compliance:audit_export"), {"region": "eu"})
    assert response.status_code == 400
    assert "data-residency rule" in response.content.decode()
    api = APIClient()
    api.force_authenticate(alice)
    response = api.get("/api/v1/compliance/audit-export/", {"region": "eu"})
    assert response.status_code == 400
    assert "data-residency rule" in json.dumps(response.json())
    assert AuditEvent.objects.count() == count


def test_the_daily_verification_task_reports_broken_chains(alice, alice_org, caplog) -> None:  # type: ignore[no-untyped-def]
    from compliance import tasks

    assert tasks.audit_verify.apply().get() == 0
    event = _chain(alice_org)[0]
    _disable_trigger()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE compliance_auditevent SET actor_label = 'mallory' WHERE id = %s", [event.id])
    assert tasks.audit_verify.apply().get() == 1
    assert f"event id {event.public_id}" in caplog.text


def test_audit_rows_are_read_only_in_the_admin(alice) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    from portal.accounts.models import User

    staff = User.objects.create_superuser(email="ops@tailguard.test", password=PASSWORD)
    client = Client()
    client.force_login(staff)
    event = AuditEvent.objects.filter(action="user.signup").first()
    assert client.get("/admin/compliance/auditevent/").status_code == 200
    response = client.post(f"/admin/compliance/auditevent/{event.id}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert AuditEvent.objects.filter(id=event.id).exists()


def test_an_auditor_verifies_an_export_offline(alice, alice_org, alice_client, regions, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    services.audit_record(actor=alice, organization=alice_org, action="test.event", data={"n": 1})
    for fmt in ("json", "csv"):
        body = alice_client.get(reverse("compliance:audit_export"), {"export_format": fmt}).content
        path = tmp_path / f"export.{fmt}"
        path.write_bytes(body)
        # Outside Django entirely: a fresh interpreter with no settings.
        result = subprocess.run(
            [sys.executable, "-m", "compliance.verify_export", str(path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith("intact:")
    tampered = json.loads((tmp_path / "export.json").read_text())
    tampered["events"][1]["action"] = "nothing.happened"
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    from compliance import verify_export

    assert verify_export.main([str(tmp_path / "tampered.json")]) == 1
    del tampered["events"][0]  # removing an event breaks the link of the one after it
    assert "previous-hash" in (verify_export.first_broken(tampered["events"]) or "")
