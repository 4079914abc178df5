"""Verify an audit export offline: `python -m compliance.verify_export audit-acme-....json`, or a
whole evidence pack: `python -m compliance.verify_export evidence-acme-2026-11.zip`.

Needs nothing but this file and `compliance/chain.py` (no database, no Django): an auditor
recomputes every event's hash and link from the export itself. Exit status 0 when the chain is
intact, 1 with the first broken link named otherwise. An intact export proves the events were
not altered after they were chained; comparing its last hash with a later export (or with
`manage.py verify_audit` on the server) proves nothing was removed since.

For a pack, every file must match the SHA-256 and size in its MANIFEST.json, no file may be
missing or added, and the audit chain inside it must be intact.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from compliance import chain


def _rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return list(json.loads(text)["events"])
    rows = []
    for cells in csv.DictReader(io.StringIO(text)):
        row = {name: chain.csv_value(cell) for name, cell in cells.items()}
        rows.append({**row, "seq": int(row["seq"]), "data": json.loads(row["data"] or "{}")})
    return rows


def first_broken(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """None when every event links to the one before and matches its hash."""
    previous, expected_seq = chain.GENESIS_HASH, None
    for row in rows:
        fields = dict(row)
        fields["seq"] = int(fields["seq"])
        for name in ("actor_id", "organization_id"):
            fields[name] = fields.get(name) or None
        if expected_seq is not None and fields["seq"] != expected_seq:
            return f"position {expected_seq}: event missing (next found is position {fields['seq']})"
        if fields["prev_hash"] != previous:
            return f"position {fields['seq']} (event id {fields.get('id')}): previous-hash does not match"
        if chain.event_hash(fields) != fields["hash"]:
            return f"position {fields['seq']} (event id {fields.get('id')}): content does not match its hash"
        previous, expected_seq = fields["hash"], fields["seq"] + 1
    return None


# A pack is a few files of JSON; refuse archives that would expand past this.
_PACK_MAX_BYTES = 512 * 1024 * 1024


def pack_problems(path: Path) -> tuple[list[str], int]:
    """What is wrong with an evidence pack (empty when it verifies), and its audit event count."""
    problems: list[str] = []
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        return [f"not a readable zip file: {exc}"], 0
    with archive:
        infos = {info.filename: info for info in archive.infolist()}
        if sum(info.file_size for info in infos.values()) > _PACK_MAX_BYTES:
            return ["the pack expands to more than 512 MiB; not an evidence pack"], 0
        if "MANIFEST.json" not in infos:
            return ["MANIFEST.json is missing"], 0
        try:
            manifest = json.loads(archive.read("MANIFEST.json"))
            listed = dict(manifest["files"])
        except (ValueError, KeyError, TypeError) as exc:
            return [f"MANIFEST.json is not a manifest: {exc}"], 0
        for name in sorted(set(infos) - set(listed) - {"MANIFEST.json"}):
            problems.append(f"{name}: in the pack but not in the manifest")
        for name, expected in sorted(listed.items()):
            if name not in infos:
                problems.append(f"{name}: listed in the manifest but missing")
                continue
            body = archive.read(name)
            if hashlib.sha256(body).hexdigest() != expected.get("sha256") or len(body) != expected.get(
                "bytes"
            ):
                problems.append(f"{name}: does not match its SHA-256 in the manifest")
        events = 0
        if "audit/chain.json" in infos:
            rows = list(json.loads(archive.read("audit/chain.json"))["events"])
            events = len(rows)
            broken = first_broken(rows)
            if broken:
                problems.append(f"audit/chain.json: {broken}")
        else:
            problems.append("audit/chain.json is missing")
    return problems, events


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m compliance.verify_export EXPORT.json|EXPORT.csv", file=sys.stderr)
        return 2
    if args[0].endswith(".zip"):
        problems, events = pack_problems(Path(args[0]))
        for problem in problems:
            print(f"BROKEN: {problem}")
        if problems:
            return 1
        print(f"intact: every file matches the manifest; audit chain of {events} events intact")
        return 0
    rows = _rows(Path(args[0]))
    broken = first_broken(rows)
    if broken:
        print(f"BROKEN: {broken}")
        return 1
    last = rows[-1]["hash"] if rows else chain.GENESIS_HASH
    print(f"intact: {len(rows)} events, last hash {last}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
