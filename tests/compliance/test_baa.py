"""BAA records: what they unlock (PHI uploads, retained prompt text), tenancy and roles."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from compliance import selectors, services
from compliance.models import AuditEvent, BAARecord, RetentionPolicy, StoredObject
from portal.accounts.models import User
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.compliance.helpers import two_factor_done

pytestmark = pytest.mark.django_db
PDF = b"%PDF-1.4 signed business associate agreement"


def _api(user):  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def _provider() -> User:
    user, _ = User.objects.get_or_create(
        email="pat@tailguard.test", defaults={"staff_role": User.StaffRole.PLATFORM_ADMIN, "is_staff": True}
    )
    return user


def _baa(alice, org, *, countersigned: bool = True, **overrides):  # type: ignore[no-untyped-def]
    """A BAA the customer recorded and (unless told otherwise) the provider countersigned with
    the same dates."""
    today = timezone.now().date()
    values = {
        "counterparty": "Tailguard Inc.",
        "version": "2026-01",
        "signed_on": today - timedelta(days=10),
        "effective_on": today - timedelta(days=5),
        "ends_on": None,
    }
    values.update(overrides)
    record = services.baa_record_create(actor=alice, organization=org, **values)
    if countersigned:
        record = services.baa_countersign(
            actor=_provider(), baa=record, effective_on=record.effective_on, ends_on=record.ends_on
        )
    return record


def test_without_a_baa_phi_uploads_are_refused_and_say_why(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    before = (TrafficSample.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count())
    with pytest.raises(ValidationError) as info:
        traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="calls",
            upload=SimpleUploadedFile("calls.jsonl", b'{"timestamp": 1}\n'),
            contains_phi=True,
        )
    message = info.value.message_dict["contains_phi"][0]
    assert "BAA rule" in message and "no effective business associate agreement" in message
    assert (TrafficSample.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count()) == before
    assert not regions.COMPLIANCE_STORAGE_DIR.exists()


def test_with_an_effective_baa_phi_uploads_are_accepted(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    _baa(alice, alice_org)
    sample = traffic_services.traffic_sample_create(
        actor=alice,
        organization=alice_org,
        name="calls",
        upload=SimpleUploadedFile(
            "calls.jsonl", b'{"timestamp": 1, "input_length": 5, "output_length": 2}\n'
        ),
        contains_phi=True,
    )
    assert StoredObject.objects.get(owner_id=str(sample.id)).contains_phi


def test_expired_or_future_baas_are_not_effective(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    today = timezone.now().date()
    _baa(
        alice,
        alice_org,
        version="old",
        signed_on=today - timedelta(days=400),
        effective_on=today - timedelta(days=300),
        ends_on=today - timedelta(days=1),
    )
    _baa(
        alice,
        alice_org,
        version="next",
        signed_on=today,
        effective_on=today + timedelta(days=3),
    )
    assert selectors.baa_effective(organization=alice_org) is None
    with pytest.raises(ValidationError, match="BAA rule"):
        services.retention_policy_set(
            actor=alice, organization=alice_org, sample_retention_days=30, retain_prompt_text=True
        )
    assert not RetentionPolicy.objects.exists()
    assert selectors.baa_effective(organization=alice_org, on=today + timedelta(days=3)).version == "next"


def test_retaining_prompt_text_needs_a_baa_and_keeps_the_raw_upload(
    alice, alice_org, regions, shared_traces
) -> None:  # type: ignore[no-untyped-def]
    _baa(alice, alice_org)
    services.retention_policy_set(
        actor=alice, organization=alice_org, sample_retention_days=7, retain_prompt_text=True
    )
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="kept",
            upload=SimpleUploadedFile("m.jsonl", (shared_traces / "mooncake_synthetic.jsonl").read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY
    assert StoredObject.objects.filter(owner_id=str(sample.id)).exists()
    # Without retention the raw upload is gone once read.
    services.retention_policy_set(actor=alice, organization=alice_org, sample_retention_days=7)
    with TestCase.captureOnCommitCallbacks(execute=True):
        other = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="not kept",
            upload=SimpleUploadedFile("m.jsonl", (shared_traces / "mooncake_synthetic.jsonl").read_bytes()),
        )
    assert not StoredObject.objects.filter(owner_id=str(other.id)).exists()


def test_baa_via_api_with_its_document(alice, alice_org, alice_client, regions) -> None:  # type: ignore[no-untyped-def]
    response = _api(alice).post(
        "/api/v1/compliance/baas/",
        {
            "counterparty": "Tailguard Inc.",
            "version": "v3",
            "signed_on": "2026-01-02",
            "effective_on": "2026-01-05",
            "document": SimpleUploadedFile("baa.pdf", PDF, content_type="application/pdf"),
        },
        format="multipart",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["recorded_by"] == "alice@acme.test" and body["document_region"] == "us"
    record = BAARecord.objects.get()
    on_disk = (regions.COMPLIANCE_STORAGE_DIR / "us" / record.document.key).read_bytes()
    assert PDF not in on_disk
    two_factor_done(alice_client, alice)  # an owner under a BAA verifies a second factor
    download = alice_client.get(reverse("compliance:baa_document", args=[record.id]))
    assert download.status_code == 200 and b"".join(download.streaming_content) == PDF
    assert AuditEvent.objects.filter(action="baa.record", organization=alice_org).exists()

    response = _api(alice).post(
        "/api/v1/compliance/baas/",
        {"counterparty": "X", "version": "v", "signed_on": "2026-02-01", "effective_on": "2026-01-01"},
        format="json",
    )
    assert response.status_code == 400 and "before it was signed" in json.dumps(response.json())


def test_a_baa_document_must_be_a_pdf_within_the_size_limit(
    alice, alice_org, alice_client, regions, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    fields = {
        "counterparty": "Tailguard Inc.",
        "version": "v1",
        "signed_on": "2026-01-02",
        "effective_on": "2026-01-05",
    }
    # A page's form: a clear error on the document field, nothing recorded or stored.
    for body, says in (
        (b"PK\x03\x04 a zip renamed to .pdf", "not a PDF"),
        (b"", "empty"),
        (b"%PDF-1.7 " + b"x" * 200, "at most 0 MB"),
    ):
        monkeypatch.setattr(services.baa, "BAA_DOCUMENT_MAX_BYTES", 100)
        response = alice_client.post(
            reverse("compliance:baa_create"),
            {**fields, "document": SimpleUploadedFile("baa.pdf", body, content_type="application/pdf")},
        )
        assert response.status_code == 400, body
        assert says in " ".join(response.context["baa_form"].errors["document"]), body
    # The API refuses the same way.
    response = _api(alice).post(
        "/api/v1/compliance/baas/",
        {**fields, "document": SimpleUploadedFile("baa.pdf", b"<html>not a pdf</html>")},
        format="multipart",
    )
    assert response.status_code == 400 and "not a PDF" in json.dumps(response.json())
    assert not BAARecord.objects.exists() and not StoredObject.objects.exists()
    # A real PDF header (readers allow a few bytes before it) under the limit is recorded.
    monkeypatch.setattr(services.baa, "BAA_DOCUMENT_MAX_BYTES", 10_000)
    response = alice_client.post(
        reverse("compliance:baa_create"), {**fields, "document": SimpleUploadedFile("baa.pdf", b"\n" + PDF)}
    )
    assert response.status_code == 302
    assert BAARecord.objects.get().document is not None


def test_baa_tenancy_and_roles(alice, alice_org, bob, bob_client, charlie, charlie_client, regions) -> None:  # type: ignore[no-untyped-def]
    record = services.baa_record_create(
        actor=alice,
        organization=alice_org,
        counterparty="Tailguard Inc.",
        version="BAA-ACME-2026",
        signed_on=date(2026, 1, 1),
        effective_on=date(2026, 1, 1),
        document=SimpleUploadedFile("baa.pdf", PDF),
    )
    # Charlie: 404 on Alice's BAA, its document, and nothing of hers in his list.
    assert _api(charlie).get(f"/api/v1/compliance/baas/{record.id}/").status_code == 404
    assert charlie_client.get(reverse("compliance:baa_document", args=[record.id])).status_code == 404
    assert _api(charlie).get("/api/v1/compliance/baas/").json()["results"] == []
    assert record.version not in charlie_client.get(reverse("compliance:overview")).content.decode()
    # Bob (viewer): reads, but cannot record or download the signed document.
    assert _api(bob).get(f"/api/v1/compliance/baas/{record.id}/").status_code == 200
    before = (BAARecord.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count())
    response = _api(bob).post(
        "/api/v1/compliance/baas/",
        {"counterparty": "X", "version": "v2", "signed_on": "2026-01-01", "effective_on": "2026-01-01"},
        format="json",
    )
    assert response.status_code == 403
    response = bob_client.post(
        reverse("compliance:baa_create"),
        {"counterparty": "X", "version": "v2", "signed_on": "2026-01-01", "effective_on": "2026-01-01"},
    )
    assert response.status_code == 403
    assert bob_client.get(reverse("compliance:baa_document", args=[record.id])).status_code == 403
    assert (BAARecord.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count()) == before


def test_compliance_page_explains_the_missing_baa(alice_client, regions) -> None:  # type: ignore[no-untyped-def]
    page = alice_client.get(reverse("compliance:overview")).content.decode()
    assert "No BAA is in effect" in page and "home region only" in page


def test_the_page_offers_only_what_the_role_may_do(alice_client, bob_client, regions) -> None:  # type: ignore[no-untyped-def]
    owner = alice_client.get(reverse("compliance:overview")).content.decode()
    viewer = bob_client.get(reverse("compliance:overview")).content.decode()
    for marker in ("Record BAA", "Save residency", "Delete everything", "export_format=json"):
        assert marker in owner
        assert marker not in viewer
    assert "Data residency" in viewer and "Audit trail" in viewer


def _phi_upload(alice, org):  # type: ignore[no-untyped-def]
    return traffic_services.traffic_sample_create(
        actor=alice,
        organization=org,
        name="calls",
        upload=SimpleUploadedFile(
            "calls.jsonl", b'{"timestamp": 1, "input_length": 5, "output_length": 2}\n'
        ),
        contains_phi=True,
    )


def test_a_baa_only_the_customer_signed_unlocks_nothing_until_the_provider_countersigns(
    alice, alice_org, alice_client, regions
) -> None:  # type: ignore[no-untyped-def]
    today = timezone.now().date()
    record = _baa(alice, alice_org, countersigned=False)
    assert selectors.baa_effective(organization=alice_org) is None
    with pytest.raises(ValidationError, match="provider has countersigned"):
        _phi_upload(alice, alice_org)
    two_factor_done(alice_client, alice)  # recording the BAA made the owner's second factor due
    assert (
        "awaiting the provider's countersignature"
        in alice_client.get(reverse("compliance:overview")).content.decode()
    )
    # The provider countersigns in the console, setting the dates the agreement runs.
    provider_client = Client()
    provider_client.force_login(_provider())
    console = provider_client.get(reverse("compliance:console")).content.decode()
    assert 'id="baa-awaiting"' in console and "2026-01" in console
    response = provider_client.post(
        reverse("compliance:baa_countersign"),
        {
            "baa": str(record.id),
            "effective_on": today.isoformat(),
            "ends_on": (today + timedelta(days=365)).isoformat(),
        },
    )
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.countersigned_by == _provider() and record.effective_on == today
    assert selectors.baa_effective(organization=alice_org) == record
    assert StoredObject.objects.get(owner_id=str(_phi_upload(alice, alice_org).id)).contains_phi
    event = AuditEvent.objects.get(action="baa.countersign")
    assert (
        event.organization_id == alice_org.pk
        and event.data["ends_on"] == (today + timedelta(days=365)).isoformat()
    )
    # Countersigned once: a second countersignature is refused with a sentence.
    with pytest.raises(ValidationError, match="already countersigned"):
        services.baa_countersign(actor=_provider(), baa=record, effective_on=today)


def test_a_customer_cannot_countersign_its_own_baa(
    alice, alice_org, alice_client, bob_client, charlie_client, regions
) -> None:  # type: ignore[no-untyped-def]
    record = _baa(alice, alice_org, countersigned=False)
    two_factor_done(alice_client, alice)
    form = {"baa": str(record.id), "effective_on": record.effective_on.isoformat()}
    # Alice (owner) is refused, and the attempt is in her organization's audit trail.
    assert alice_client.post(reverse("compliance:baa_countersign"), form).status_code == 403
    refused = AuditEvent.objects.get(action="baa.refused.countersign")
    assert refused.actor_id == alice.pk and refused.organization_id == alice_org.pk
    # Bob (viewer) and Charlie (another organization) do not even learn that it exists.
    assert bob_client.post(reverse("compliance:baa_countersign"), form).status_code == 404
    assert charlie_client.post(reverse("compliance:baa_countersign"), form).status_code == 404
    assert charlie_client.get(reverse("compliance:console")).status_code == 404
    record.refresh_from_db()
    assert record.countersigned_at is None and selectors.baa_effective(organization=alice_org) is None
    # Dates the provider sets are checked like the customer's.
    with pytest.raises(ValidationError, match="before the customer signed"):
        services.baa_countersign(
            actor=_provider(), baa=record, effective_on=record.signed_on - timedelta(days=1)
        )
