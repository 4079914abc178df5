"""Verify an audit export offline: `python -m compliance.verify_export audit-acme-....json`.

Needs nothing but this file and `compliance/chain.py` (no database, no Django): an auditor
recomputes every event's hash and link from the export itself. Exit status 0 when the chain is
intact, 1 with the first broken link named otherwise. An intact export proves the events were
not altered after they were chained; comparing its last hash with a later export (or with
`manage.py verify_audit` on the server) proves nothing was removed since.
"""

from __future__ import annotations

import csv
import io
import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m compliance.verify_export EXPORT.json|EXPORT.csv", file=sys.stderr)
        return 2
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
