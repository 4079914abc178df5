"""The compliance evidence pack: one zip per organization and month that the offline verifier
accepts (every file matches the manifest, the audit chain inside is intact), with the SLA
reports and credits, member changes and BAA records; a tampered or padded pack is refused; the
pack's creation is itself in the audit trail; only owners and admins may download it."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance import verify_export
from compliance.models import AuditEvent
from portal.accounts import services as account_services
from portal.accounts.models import Organization, User
from portal.sla import services as sla_services
from portal.sla.models import SLAAgreement
from tests.factories import CREDIT_TIERS, deployed_endpoint

pytestmark = pytest.mark.django_db


def _pack(client: Client, month: str) -> bytes:
    response = client.get(reverse("sla:evidence_pack"), {"month": month})
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"] == "application/zip"
    return b"".join(response.streaming_content) if response.streaming else response.content


def _rezip(body: bytes, change: Any) -> bytes:
    files = {}
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        for name in archive.namelist():
            files[name] = archive.read(name)
    change(files)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_the_pack_verifies_offline_and_carries_sla_members_and_baa(
    tmp_path: Path, alice: User, alice_org: Organization, alice_client: Client, capsys: Any
) -> None:
    provider = User.objects.create_user(
        email="p@tailguard.test", password="x" * 12, staff_role="platform_admin"
    )
    endpoint = deployed_endpoint(alice_org, alice, port=59301, peak_rps=4.0, config={})
    terms = sla_services.sla_terms_derive(endpoint=endpoint) | {
        "credit_tiers": CREDIT_TIERS,
        "monthly_fee_cents": 1000,
    }
    agreement = sla_services.sla_agreement_propose(actor=provider, endpoint=endpoint, terms=terms)
    sla_services.sla_agreement_sign(actor=alice, agreement=agreement)
    SLAAgreement.objects.filter(pk=agreement.pk).update(in_force_from=datetime(2026, 9, 1, tzinfo=UTC))
    sla_services.sla_periods_close(now=datetime(2026, 10, 2, tzinfo=UTC))
    account_services.invitation_create(
        actor=alice, organization=alice_org, email="dana@acme.test", role="member"
    )

    september = _pack(alice_client, "2026-09")
    path = tmp_path / "evidence-2026-09.zip"
    path.write_bytes(september)
    assert verify_export.main([str(path)]) == 0
    assert "intact: every file matches the manifest" in capsys.readouterr().out
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("MANIFEST.json"))
        assert set(manifest["files"]) == {
            "audit/chain.json",
            "audit/verification.json",
            "audit/member_changes.json",
            "baa/records.json",
            "residency/policy.json",
            "residency/objects.json",
            "sla/agreements.json",
            "sla/periods.json",
            "sla/credits.json",
        }
        (period,) = json.loads(archive.read("sla/periods.json"))["periods"]
        # No edge data at all in September: every second a gap, counted against the provider.
        assert period["result"]["edge"]["criteria"]["ttft_p50_ms"]["gap_s"] == 30 * 86400
        assert period["credit_pct"] == 25.0 and period["credit_cents"] == 250
        (credit,) = json.loads(archive.read("sla/credits.json"))["credits"]
        assert credit["amount_cents"] == 250
        (signed,) = json.loads(archive.read("sla/agreements.json"))["agreements"]
        assert (
            signed["provider_signed_by"] == "p@tailguard.test"
            and signed["customer_signed_by"] == "alice@acme.test"
        )
        assert json.loads(archive.read("audit/verification.json"))["server_verification"] == "intact"
    # The pack's creation is chained, with the manifest's hash.
    event = AuditEvent.objects.filter(action="compliance.evidence_pack").get()
    with zipfile.ZipFile(path) as archive:
        assert event.data["manifest_sha256"] == hashlib.sha256(archive.read("MANIFEST.json")).hexdigest()
    # This month's pack has this month's member changes.
    this_month = _pack(alice_client, timezone.now().strftime("%Y-%m"))
    with zipfile.ZipFile(io.BytesIO(this_month)) as archive:
        actions = [e["action"] for e in json.loads(archive.read("audit/member_changes.json"))["events"]]
    assert "organization.create" in actions and "invitation.create" in actions


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda f: f.update({"sla/credits.json": b'{"credits": []}'}), "sla/credits.json: does not match"),
        (lambda f: f.update({"notes.txt": b"added later"}), "notes.txt: in the pack but not in the manifest"),
        (lambda f: f.pop("baa/records.json"), "baa/records.json: listed in the manifest but missing"),
    ],
)
def test_a_tampered_pack_is_refused(
    tmp_path: Path, alice_client: Client, capsys: Any, change: Any, says: str
) -> None:
    path = tmp_path / "pack.zip"
    path.write_bytes(_rezip(_pack(alice_client, "2026-09"), change))
    assert verify_export.main([str(path)]) == 1
    assert says in capsys.readouterr().out


def test_only_owners_and_admins_download_the_pack(bob_client: Client, alice_client: Client) -> None:
    assert bob_client.get(reverse("sla:evidence_pack"), {"month": "2026-09"}).status_code == 403
    assert alice_client.get(reverse("sla:evidence_pack"), {"month": "0001-01"}).status_code == 400
    assert not AuditEvent.objects.filter(action="compliance.evidence_pack").exists()
