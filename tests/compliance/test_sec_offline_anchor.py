"""The offline verifier checks an export against the external anchors (issue 27 finding 11).

Someone who can write the database can hand an auditor an export that is cut short (the newest
events deleted) or rewritten and re-hashed from an event on: the chain in the file verifies by
itself. The auditor reads the anchors from the object store directly (here: the S3-compatible
server, as `aws s3 cp --recursive` would) and gives them to `python -m compliance.verify_export
--anchor`, which then names both forgeries, in a fresh interpreter without Django or database.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from compliance import anchor, chain, services, verify_export
from compliance.pack import evidence_pack
from portal.accounts.models import Organization, User
from tests.compliance.conftest import moto_server, regions, s3_regions  # noqa: F401 (fixtures)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db


def _events(user: User, org: Organization, count: int) -> None:
    for n in range(count):
        services.audit_record(actor=user, organization=org, action="test.event", data={"n": n})


def _download_anchors(settings: Any, key: str, out: Path) -> Path:
    """The auditor's own copy of the chain's anchors, read from the bucket, not from the portal."""
    import boto3

    client = boto3.client(
        "s3",
        region_name=settings.COMPLIANCE_S3_REGION_NAMES["us"],
        endpoint_url=settings.COMPLIANCE_S3_ENDPOINT_URL,
    )
    bucket = settings.COMPLIANCE_S3_BUCKETS["us"]
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{anchor.PREFIX}/{key}/")["Contents"]
    for item in listed:
        target = out / item["Key"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
    return out / anchor.PREFIX / key


def _offline(*args: str) -> subprocess.CompletedProcess[str]:
    """The verifier in a fresh interpreter: no settings, no database."""
    return subprocess.run(
        [sys.executable, "-m", "compliance.verify_export", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )


def _rehash(rows: list[dict[str, Any]], from_index: int) -> None:
    previous = rows[from_index - 1]["hash"] if from_index else chain.GENESIS_HASH
    for row in rows[from_index:]:
        row["prev_hash"] = previous
        fields = {
            **row,
            "actor_id": row["actor_id"] or None,
            "organization_id": row["organization_id"] or None,
        }
        row["hash"] = chain.event_hash(fields)
        previous = row["hash"]


def _anchored_export(
    settings: Any, alice: User, org: Organization, tmp_path: Path
) -> tuple[dict[str, Any], Path]:
    """An intact JSON export of a chain anchored twice (after 2 and after 4 test events)."""
    _events(alice, org, 2)
    anchor.audit_anchor_write()
    _events(alice, org, 2)
    anchor.audit_anchor_write()
    _name, body = services.audit_export(actor=alice, organization=org, fmt="json")
    anchors = _download_anchors(settings, str(org.pk), tmp_path / "store")
    assert len(list(anchors.glob("*.json"))) == 2
    return json.loads(body), anchors


def test_a_chain_cut_short_is_caught_offline_by_the_anchor(
    s3_regions: Any,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
    tmp_path: Path,
) -> None:
    exported, anchors = _anchored_export(s3_regions, alice, alice_org, tmp_path)
    intact = tmp_path / "intact.json"
    intact.write_text(json.dumps(exported))
    ok = _offline(str(intact), "--anchor", str(anchors))
    assert ok.returncode == 0 and "agrees with the newest of 2 external anchor(s)" in ok.stdout

    # The newest event (the audit.export itself) and the last test event removed, and the
    # export's own statement of its anchor with them: the file alone still verifies.
    cut = {**exported, "events": exported["events"][:-2], "anchor": None}
    short = tmp_path / "short.json"
    short.write_text(json.dumps(cut))
    alone = _offline(str(short))
    assert alone.returncode == 0 and "not checked against an external anchor" in alone.stdout
    caught = _offline(str(short), "--anchor", str(anchors))
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "events were removed" in caught.stdout
    # Cut back to before even the older anchor is caught the same way; the older anchor alone
    # (the newer one lost) would not catch a cut after its position.
    older = min(anchors.glob("*.json"))
    cut_after_older = tmp_path / "after_older.json"
    position = json.loads(older.read_text())["seq"]
    cut_after_older.write_text(
        json.dumps({**cut, "events": [e for e in cut["events"] if e["seq"] <= position]})
    )
    assert verify_export.main([str(cut_after_older), "--anchor", str(older)]) == 0
    assert verify_export.main([str(cut_after_older), "--anchor", str(anchors)]) == 1

    # The CSV export, cut short the same way, against one anchor file.
    _name, body = services.audit_export(actor=alice, organization=alice_org, fmt="csv")
    lines = body.decode().splitlines(keepends=True)
    (tmp_path / "short.csv").write_text("".join(lines[:-3]))
    newest = max(anchors.glob("*.json"))
    assert verify_export.main([str(tmp_path / "short.csv")]) == 0
    assert verify_export.main([str(tmp_path / "short.csv"), "--anchor", str(newest)]) == 1


def test_a_rewritten_and_rehashed_chain_is_caught_offline_by_the_anchor(
    s3_regions: Any,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
    tmp_path: Path,
    capsys: Any,
) -> None:
    exported, anchors = _anchored_export(s3_regions, alice, alice_org, tmp_path)
    rows = exported["events"]
    victim = next(i for i, row in enumerate(rows) if row["action"] == "test.event")
    rows[victim]["action"] = "nothing.happened"
    _rehash(rows, victim)
    assert verify_export.first_broken(rows) is None  # re-hashed: the chain alone verifies
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({**exported, "anchor": None}))
    caught = _offline(str(forged), "--anchor", str(anchors))
    assert caught.returncode == 1 and "the chain was rewritten" in caught.stdout
    # Kept, the export's own anchor statement catches it too (it is still the server's word).
    forged.write_text(json.dumps(exported))
    assert verify_export.main([str(forged)]) == 1
    assert "rewritten" in capsys.readouterr().out

    # Rewritten in the CSV too (each cell as the export escapes it).
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    for row in rows:
        cells = {**row, "data": chain.canonical_json(row["data"])}
        writer.writerow({k: chain.csv_cell(v) for k, v in cells.items()})
    (tmp_path / "forged.csv").write_text(buffer.getvalue())
    assert verify_export.main([str(tmp_path / "forged.csv")]) == 0
    assert verify_export.main([str(tmp_path / "forged.csv"), "--anchor", str(anchors)]) == 1


def test_an_evidence_pack_is_checked_against_the_anchors(
    s3_regions: Any,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
    tmp_path: Path,
) -> None:
    _events(alice, alice_org, 3)
    anchor.audit_anchor_write()
    now = timezone.now()
    _name, body = evidence_pack(
        actor=alice, organization=alice_org, period_start=now - timedelta(days=30), period_end=now
    )
    anchors = _download_anchors(s3_regions, str(alice_org.pk), tmp_path / "store")
    (tmp_path / "pack.zip").write_bytes(body)
    assert verify_export.main([str(tmp_path / "pack.zip"), "--anchor", str(anchors)]) == 0

    # Cut short inside the pack, with its manifest recomputed: every hash matches again.
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    chain_json = json.loads(files["audit/chain.json"])
    chain_json["events"] = chain_json["events"][:-2]
    chain_json["anchor"] = None
    files["audit/chain.json"] = json.dumps(chain_json).encode()
    manifest = json.loads(files["MANIFEST.json"])
    manifest["files"]["audit/chain.json"] = {
        "sha256": hashlib.sha256(files["audit/chain.json"]).hexdigest(),
        "bytes": len(files["audit/chain.json"]),
    }
    files["MANIFEST.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(tmp_path / "cut.zip", "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    assert verify_export.pack_problems(tmp_path / "cut.zip")[0] == []
    problems, _ = verify_export.pack_problems(tmp_path / "cut.zip", verify_export.read_anchors([anchors]))
    assert len(problems) == 1 and "events were removed" in problems[0]


def test_anchors_of_another_chain_or_not_anchors_at_all_are_refused(
    s3_regions: Any,  # noqa: F811 (the fixture imported above)
    alice: User,
    alice_org: Organization,
    charlie: User,
    tmp_path: Path,
    capsys: Any,
) -> None:
    charlie_org = Organization.objects.get(memberships__user=charlie)
    _events(alice, alice_org, 1)
    anchor.audit_anchor_write()
    _name, body = services.audit_export(actor=alice, organization=alice_org, fmt="json")
    (tmp_path / "export.json").write_bytes(body)
    theirs = _download_anchors(s3_regions, str(charlie_org.pk), tmp_path / "store")
    assert verify_export.main([str(tmp_path / "export.json"), "--anchor", str(theirs)]) == 1
    assert f"no anchor of chain {alice_org.pk}" in capsys.readouterr().out
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert verify_export.main([str(tmp_path / "export.json"), "--anchor", str(tmp_path / "junk.json")]) == 2
    assert "not an audit anchor" in capsys.readouterr().err
