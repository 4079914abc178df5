"""Bad input at the edges: body sizes, hostile file names, deep JSON, spreadsheet formulas.

Each refusal is a clear 4xx naming the field or the limit, and leaves nothing written; each
accepted hostile value is stored and served safely. (Traffic-upload size limits on the form and
the API are in test_traffic; these add what that leaves out.)
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance import chain
from compliance.models import AuditEvent, BAARecord, RetentionPolicy, StoredObject
from compliance.verify_export import main as verify_export
from portal.accounts import services as account_services
from portal.accounts.models import ApiToken, Organization, User
from portal.traffic.models import TrafficSample
from tests.compliance.conftest import regions  # noqa: F401 (the fixture)
from tests.compliance.helpers import two_factor_done
from tests.conftest import REPO_ROOT
from tests.factories import SMALL_TRACE

pytestmark = pytest.mark.django_db

PDF = b"%PDF-1.4 signed agreement"
FORMULA = '=HYPERLINK("http://evil.test","x")'


def _token_client(user: User, org: Organization) -> APIClient:
    client = APIClient()
    secret = account_services.api_token_create(actor=user, organization=org, name="hardening").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _person_client(user: User) -> APIClient:
    """A person's API session, fresh from the password: creating tokens needs one (a token may not)."""
    from tests.conftest import _client_for

    client = APIClient()
    client.cookies = _client_for(user).cookies
    return client


def _multipart(fields: dict[str, str], files: dict[str, tuple[bytes, bytes]]) -> tuple[bytes, str]:
    """A multipart body built by hand, so that a file name goes out byte for byte (NUL included)."""
    boundary = "tailguard-hardening-boundary"
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        )
    for name, (filename, content) in files.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="'.encode()
            + filename
            + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
            + content
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


# --- Request bodies over the limit ---------------------------------------------------------------


def test_oversized_json_and_form_bodies_are_413_naming_the_limit(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    api = _person_client(alice)
    tokens = ApiToken.objects.count()
    padding = "a" * 5000
    # Django refuses the body while DRF reads it; that was Django's HTML 400 page, in an API.
    response = api.post("/api/v1/tokens/", {"name": "big", "padding": padding}, format="json")
    assert response.status_code == 413, response.content
    assert response.json() == {
        "detail": "The request body is larger than the limit of 4,096 bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)."
    }
    # Form-encoded and multipart non-file fields: the same limit, the same answer.
    for fmt in ("multipart", None):
        if fmt is None:
            response = api.post(
                "/api/v1/tokens/",
                f"name=big&padding={padding}",
                content_type="application/x-www-form-urlencoded",
            )
        else:
            response = api.post("/api/v1/tokens/", {"name": "big", "padding": padding}, format=fmt)
        assert response.status_code == 413, response.content
        assert "4,096 bytes" in response.json()["detail"]
    # An upload's non-file fields count too.
    response = api.post(
        "/api/v1/traffic-samples/",
        {"name": "n" * 5000, "file": SimpleUploadedFile("t.jsonl", SMALL_TRACE)},
        format="multipart",
    )
    assert response.status_code == 413
    before = RetentionPolicy.objects.filter(organization=alice_org).count()
    response = api.put(
        "/api/v1/compliance/retention/", {"sample_retention_days": 30, "x": padding}, format="json"
    )
    assert response.status_code == 413
    assert ApiToken.objects.count() == tokens
    assert not TrafficSample.objects.exists()
    assert RetentionPolicy.objects.filter(organization=alice_org).count() == before
    # Just under the limit is accepted: a limit, not a refusal of large-ish bodies.
    response = api.post("/api/v1/tokens/", {"name": "fits", "padding": "a" * 3900}, format="json")
    assert response.status_code == 201
    # The HTML form keeps Django's own refusal (a 400 page), and writes nothing either.
    from tests.conftest import _client_for

    page = _client_for(alice)
    response = page.post(reverse("accounts:api_tokens"), {"name": "big", "padding": padding})
    assert response.status_code == 400
    assert ApiToken.objects.count() == tokens + 1


def test_deeply_nested_json_is_a_400_not_a_500(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    api = _person_client(alice)
    body = '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"  # 200 KB, under the body limit
    response = api.post("/api/v1/tokens/", body, content_type="application/json")
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["detail"]
    bad_bodies = (
        "{not json",
        '{"name": 1e999999}',
        '{"name": "\\ud800"}',
        '{"name": "a\\u0000b"}',
        "\x00",
        '"x"',
    )
    for bad in bad_bodies:
        response = api.post("/api/v1/tokens/", bad, content_type="application/json")
        assert response.status_code == 400, (bad, response.content)
        assert response["Content-Type"] == "application/json"
    assert not ApiToken.objects.exists()


@pytest.mark.usefixtures("regions")
def test_a_too_large_baa_document_is_refused_not_dropped(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    """The upload handler drops a file over the limit; the document is optional, so the BAA used
    to be recorded without it. Now the API (400) and the form (413) name the field."""
    settings.TRAFFIC_UPLOAD_MAX_BYTES = 1000
    fields = {
        "counterparty": "Acme Health",
        "version": "v1",
        "signed_on": "2026-01-02",
        "effective_on": "2026-01-05",
    }
    document = b"%PDF-1.4 " + b"x" * 2000
    api = _token_client(alice, alice_org)
    response = api.post(
        "/api/v1/compliance/baas/",
        {**fields, "document": SimpleUploadedFile("baa.pdf", document)},
        format="multipart",
    )
    assert response.status_code == 400, response.content
    assert response.json() == {"document": ["The file is larger than the limit of 1,000 bytes."]}
    page = Client()
    page.force_login(alice)
    two_factor_done(page, alice)
    response = page.post(
        reverse("compliance:baa_create"), {**fields, "document": SimpleUploadedFile("baa.pdf", document)}
    )
    assert response.status_code == 413
    assert b"larger than the limit of 1,000 bytes" in response.content
    assert not BAARecord.objects.exists()
    assert not StoredObject.objects.exists()
    # Under the limit, the same request records the BAA with its document.
    response = api.post(
        "/api/v1/compliance/baas/",
        {**fields, "document": SimpleUploadedFile("baa.pdf", PDF)},
        format="multipart",
    )
    assert response.status_code == 201
    assert BAARecord.objects.get().document is not None


# --- Hostile file names --------------------------------------------------------------------------

HOSTILE_NAMES = [
    b"../../etc/passwd",
    b"/etc/passwd",
    b"..\\..\\windows\\win.ini",
    b"trace\x00.jsonl",
    b"..",
    b"%2e%2e%2fetc%2fpasswd",
    b"\xe2\x80\xaelmth.jsonl",  # right-to-left override
    b"n" * 900 + b".jsonl",  # Django keeps 255 characters
    b"n" * 5000 + b".jsonl",  # past the multipart header limit: refused whole
]


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.usefixtures("regions")
@pytest.mark.parametrize("filename", HOSTILE_NAMES, ids=lambda n: repr(n[:24]))
def test_hostile_upload_names_are_never_used_as_paths(  # type: ignore[no-untyped-def]
    alice, alice_org, settings, tmp_path, filename: bytes, django_capture_on_commit_callbacks
) -> None:
    api = _token_client(alice, alice_org)
    page = Client()
    page.force_login(alice)
    before = _files_under(tmp_path)
    body, content_type = _multipart(
        {"name": "hostile", "trace_format": "auto"}, {"file": (filename, SMALL_TRACE)}
    )
    with django_capture_on_commit_callbacks(execute=True):
        by_api = api.generic("POST", "/api/v1/traffic-samples/", body, content_type=content_type)
        by_form = page.generic("POST", reverse("traffic:list"), body, content_type=content_type)
    samples = list(TrafficSample.objects.all())
    if filename == b"..":
        # Nothing is left of the name once Django drops the path: the file is missing, by name.
        assert by_api.status_code == 400 and by_api.json() == {"file": ["No file was submitted."]}
        assert by_form.status_code == 400 and b'data-field="file"' in by_form.content
        assert samples == []
    elif len(filename) > 1024:
        # Django refuses a part whose headers exceed 1 KiB before reading it.
        assert by_api.status_code == 400
        assert by_api.json() == {
            "detail": "Multipart form parse error - Request max total header size exceeded."
        }
        assert by_form.status_code == 400
        assert samples == []
    else:
        assert by_api.status_code == 201, by_api.content
        assert by_form.status_code == 302, by_form.content[-500:]
        assert len(samples) == 2
        for sample in samples:
            sample.refresh_from_db()
            assert sample.status == TrafficSample.Status.READY, sample.error
            assert sample.profile["num_requests"] == 24
    # Whatever was written is inside the test's own folders, under names the server chose.
    storage = Path(settings.COMPLIANCE_STORAGE_DIR).resolve()
    for path in _files_under(tmp_path) - before:
        resolved = path.resolve()
        assert resolved.is_relative_to(tmp_path.resolve()), path
        assert "passwd" not in path.name and "win.ini" not in path.name, path
        if resolved.is_relative_to(storage):
            assert re.fullmatch(r"[A-Za-z0-9_./-]+", str(resolved.relative_to(storage))), path
    for obj in StoredObject.objects.all():
        assert re.fullmatch(r"[A-Za-z0-9_/-]+", obj.key), obj.key
        assert (storage / obj.region / obj.key).resolve().is_relative_to(storage)
    assert not (tmp_path / "etc").exists()


@pytest.mark.usefixtures("regions")
def test_hostile_baa_document_name_and_version_download_safely(alice, alice_org, settings) -> None:  # type: ignore[no-untyped-def]
    api = _token_client(alice, alice_org)
    body, content_type = _multipart(
        {
            "counterparty": "Acme Health",
            "version": '../../etc/passwd"\r\nX-Injected: 1',
            "signed_on": "2026-01-02",
            "effective_on": "2026-01-05",
        },
        {"document": (b"../../../../tmp/evil.pdf\x00.sh", PDF)},
    )
    response = api.generic("POST", "/api/v1/compliance/baas/", body, content_type=content_type)
    assert response.status_code == 201, response.content
    record = BAARecord.objects.get()
    assert record.version.startswith("../../etc/passwd")  # stored as given: it is only text
    # The document is stored under a key the server chose, inside the storage folder.
    storage = Path(settings.COMPLIANCE_STORAGE_DIR).resolve()
    assert re.fullmatch(r"[A-Za-z0-9_/-]+", record.document.key)
    assert (storage / record.document.region / record.document.key).resolve().is_relative_to(storage)
    assert (storage / record.document.region / record.document.key).is_file()
    page = Client()
    page.force_login(alice)
    two_factor_done(page, alice)
    # The version goes into the download's file name: Django keeps only its last path part and
    # percent-encodes the rest (RFC 6266), so no path and no header can be smuggled in.
    download = page.get(reverse("compliance:baa_document", args=[record.id]))
    assert download.status_code == 200
    disposition = download["Content-Disposition"]
    assert disposition == "attachment; filename*=utf-8''passwd%22%0D%0AX-Injected%3A%201.pdf"
    assert "X-Injected" not in download.headers
    assert b"".join(download.streaming_content) == PDF


# --- Spreadsheet formulas in CSV exports ---------------------------------------------------------

# Every place that writes CSV or serves text/csv, and the test that covers it. A new CSV export
# fails here by name until it neutralises formulas and is added.
CSV_WRITERS = {
    "compliance/services/export.py": "audit_export (the audit trail, API and page): this module",
    "portal/api/compliance.py": "serves audit_export's CSV",
    "compliance/views.py": "serves audit_export's CSV",
    "compliance/verify_export.py": "reads the CSV back (the offline verifier)",
}


def test_every_csv_export_is_known() -> None:
    found = subprocess.run(
        [
            "grep",
            "-rlE",
            r"text/csv|csv\.(writer|DictWriter)|import csv",
            "--include=*.py",
            "portal",
            "compliance",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert set(found) == set(CSV_WRITERS), "CSV code not covered by the formula-injection test"


def _signup(email: str, org_name: str) -> tuple[User, Organization]:
    user = account_services.user_signup(
        email=email, password="correct-horse-battery-staple", full_name=FORMULA
    )
    return user, account_services.organization_create(actor=user, name=org_name)


@pytest.mark.usefixtures("regions")
def test_csv_audit_export_neutralises_formulas_and_still_verifies(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # An email address may legally start with = + - (and carry | ' !): the audit trail's actor.
    user, org = _signup("=cmd|'/ccalc'!a0@evil.test", FORMULA)
    api = _token_client(user, org)
    response = api.post(
        "/api/v1/traffic-samples/",
        {"name": FORMULA, "file": SimpleUploadedFile("t.jsonl", SMALL_TRACE)},
        format="multipart",
        HTTP_X_REQUEST_ID="-2-3-cmd-request",
    )
    assert response.status_code == 201, response.content
    page = Client()
    page.force_login(user)
    exports = {
        "api": api.get("/api/v1/compliance/audit-export/", {"export_format": "csv"}),
        "page": page.get(reverse("compliance:audit_export"), {"export_format": "csv"}),
    }
    for where, export in exports.items():
        assert export.status_code == 200, where
        assert export["Content-Type"].startswith("text/csv")
        text = export.content.decode()
        rows = list(csv.reader(io.StringIO(text)))
        header, cells = rows[0], [cell for row in rows[1:] for cell in row]
        # No cell a spreadsheet would run: each starts with an escaping apostrophe or is inert.
        dangerous = [c for c in cells if c[:1] in {"=", "+", "-", "@", "\t", "\r"}]
        assert dangerous == [], (where, dangerous)
        labels = {row[header.index("actor_label")] for row in rows[1:]}
        assert "'=cmd|'/ccalc'!a0@evil.test" in labels
        assert "'-2-3-cmd-request" in {row[header.index("request_id")] for row in rows[1:]}
        # The names are inside the JSON `data` column, which starts with "{".
        assert any(FORMULA in json.loads(row[header.index("data")]).values() for row in rows[1:])
        # The auditor's verifier reads the escaped cells back exactly: the chain still checks out.
        path = tmp_path / f"export-{where}.csv"
        path.write_bytes(export.content)
        assert verify_export([str(path)]) == 0
    # The JSON export is not a spreadsheet format: values are exactly as recorded.
    body = api.get("/api/v1/compliance/audit-export/", {"export_format": "json"}).json()
    assert {e["actor_label"] for e in body["events"]} >= {"=cmd|'/ccalc'!a0@evil.test"}
    assert AuditEvent.objects.filter(organization=org, action="audit.export").count() == 3


def test_csv_cell_encoding_round_trips() -> None:
    values: list[Any] = ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "'quoted", "''", "plain", "", 7, None]
    for value in values:
        cell = chain.csv_cell(value)
        if isinstance(value, str):
            assert chain.csv_value(cell) == value
            assert cell[:1] not in {"=", "+", "-", "@", "\t", "\r"}
        else:
            assert cell == value


# --- Nested bodies -------------------------------------------------------------------------------


def test_sla_terms_with_nested_tiers_take_json_only(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    """Found by the API fuzz: a multipart `credit_tiers` part was read as absent, and the terms
    were saved without the tiers the client sent (even invalid ones). JSON only now."""
    from portal.endpoints.models import Endpoint, SLATerms

    endpoint = Endpoint.objects.create(
        organization=alice_org,
        name="hardening-endpoint",
        served_model=alice_org.served_models.create(name="m", path="/models/m"),
        config={},
        port=59873,
        api_key_prefix="hardkey1",
        api_key_hash="2" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=alice,
    )
    api = _token_client(alice, alice_org)
    url = f"/api/v1/compliance/endpoints/{endpoint.pk}/sla/"
    tiers = json.dumps([{"below_pct": -1, "credit_pct": 10}])
    response = api.put(url, {"target_ms": 800, "credit_tiers": tiers}, format="multipart")
    assert response.status_code == 415
    assert not SLATerms.objects.exists()
    response = api.put(url, {"target_ms": 800, "credit_tiers": json.loads(tiers)}, format="json")
    assert response.status_code == 400 and "below_pct" in json.dumps(response.json())
    assert not SLATerms.objects.exists()
    # Well-formed tiers are then refused for what they are (the provider's terms), not lost.
    response = api.put(
        url, {"target_ms": 800, "credit_tiers": [{"below_pct": 99, "credit_pct": 10}]}, format="json"
    )
    assert response.status_code == 403 and "provider's terms" in response.json()["detail"]
    assert not SLATerms.objects.exists()
    response = api.put(url, {"target_ms": 800}, format="json")
    assert response.status_code == 200 and response.json()["terms"]["credit_tiers"] == []
