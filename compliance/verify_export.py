"""Verify an audit export offline: `python -m compliance.verify_export audit-acme-....json`, or a
whole evidence pack: `python -m compliance.verify_export evidence-acme-2026-11.zip`.

Needs nothing but this file and `compliance/chain.py` (no database, no Django): an auditor
recomputes every event's hash and link from the export itself. Exit status 0 when the chain is
intact, 1 with the first broken link named otherwise.

An intact chain alone proves the events were not altered one by one; it cannot tell a chain
cut short (the newest events deleted) or rewritten and re-hashed from the event on, which
someone who can write the database can produce. The external anchors tell (compliance.anchor):
the server writes each chain's head to the object store of the organization's region (under
S3 Object Lock where the bucket has it). Give the verifier the anchors read from the store
yourself, not from the portal, e.g. `aws s3 cp --recursive s3://BUCKET/audit-anchors/ORG_ID/
anchors/`, and name them: `--anchor anchors/` (a folder, searched for the chain's anchors) or
`--anchor FILE.json` (repeatable). The export must then hold the event at the newest anchor's
position with the anchored hash; events after it are covered by the next anchoring. Without
`--anchor`, the anchor a JSON export carries is checked, but that is the server's own statement
and the verifier says so.

For a pack, every file must match the SHA-256 and size in its MANIFEST.json, no file may be
missing or added, and the audit chain inside it must be intact (and agree with the anchors).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
import zipfile
from collections.abc import Iterable, Mapping, Sequence
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


# An anchor object is a few hundred bytes (compliance.anchor.MAX_ANCHOR_BYTES).
_ANCHOR_MAX_BYTES = 4096


def read_anchors(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The anchors in the files named and (recursively) in the folders named. Raises ValueError
    naming a file that is not an anchor."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(p for p in path.rglob("*.json") if p.is_file()) if path.is_dir() else [path])
    anchors = []
    for file in files:
        try:
            if file.stat().st_size > _ANCHOR_MAX_BYTES:
                raise ValueError("too large")
            data = json.loads(file.read_text(encoding="utf-8"))
            anchors.append(
                {
                    "chain": str(data["chain"]),
                    "seq": int(data["seq"]),
                    "hash": str(data["hash"]),
                    "anchored_at": str(data.get("anchored_at", "")),
                    "source": str(file),
                }
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{file}: not an audit anchor ({exc})") from None
    return anchors


def export_chain(rows: Sequence[Mapping[str, Any]], declared: str | None = None) -> str | None:
    """The chain an export holds: the one it declares, else its events' (None when empty)."""
    if declared:
        return declared
    return str(rows[0]["chain"]) if rows else None


def anchor_problem(
    rows: Sequence[Mapping[str, Any]], anchors: list[dict[str, Any]], chain_key: str | None
) -> str | None:
    """The export's chain against the newest of `anchors` for its chain: None when it holds the
    anchored event with the anchored hash. A cut-short chain and a re-hashed one are named."""
    mine = [a for a in anchors if a["chain"] == chain_key]
    if not mine:
        chains = sorted({a["chain"] for a in anchors})
        return f"no anchor of chain {chain_key} among those given (they are of {', '.join(chains) or 'none'})"
    newest = max(mine, key=lambda a: a["seq"])
    by_seq = {int(row["seq"]): str(row["hash"]) for row in rows}
    last = max(by_seq, default=0)
    where = f"position {newest['seq']} (external anchor of {newest['anchored_at'] or 'unknown date'})"
    if newest["seq"] not in by_seq:
        return (
            f"{where}: the anchored chain reaches position {newest['seq']}, but this export ends at "
            f"position {last}: events were removed"
        )
    if by_seq[newest["seq"]] != newest["hash"]:
        return f"{where}: the event there does not have the anchored hash: the chain was rewritten"
    return None


# A pack is a few files of JSON; refuse archives that would expand past this.
_PACK_MAX_BYTES = 512 * 1024 * 1024


def pack_problems(path: Path, anchors: list[dict[str, Any]] | None = None) -> tuple[list[str], int]:
    """What is wrong with an evidence pack (empty when it verifies), and its audit event count.
    With `anchors`, the pack's chain must agree with the newest of them."""
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
            exported = json.loads(archive.read("audit/chain.json"))
            rows = list(exported["events"])
            events = len(rows)
            broken = first_broken(rows)
            if broken:
                problems.append(f"audit/chain.json: {broken}")
            else:
                # The anchors given, else the one the pack states (the server's word).
                stated = exported.get("anchor")
                given = anchors
                if given is None and isinstance(stated, dict):
                    given = [{**stated, "chain": str(exported.get("chain") or "")}]
                problem = (
                    None
                    if given is None
                    else anchor_problem(rows, given, export_chain(rows, exported.get("chain")))
                )
                if problem:
                    problems.append(f"audit/chain.json: {problem}")
        else:
            problems.append("audit/chain.json is missing")
    return problems, events


def _embedded_anchor(path: Path) -> dict[str, Any] | None:
    """The anchor a JSON export carries (the server's statement), or None."""
    if path.suffix != ".json":
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    embedded = data.get("anchor")
    if not isinstance(embedded, dict):
        return None
    return {**embedded, "chain": str(data.get("chain") or ""), "source": "the export itself"}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m compliance.verify_export", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("export", type=Path, help="EXPORT.json, EXPORT.csv or PACK.zip")
    parser.add_argument(
        "--anchor",
        type=Path,
        action="append",
        default=None,
        help="an anchor file read from the object store, or a folder of them (repeatable)",
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # a usage error: argparse has said what is wrong
        return int(exc.code or 0)
    anchors: list[dict[str, Any]] | None = None
    if args.anchor:
        try:
            anchors = read_anchors(args.anchor)
        except ValueError as exc:
            print(f"usage: {exc}", file=sys.stderr)
            return 2
    path: Path = args.export
    if path.suffix == ".zip":
        problems, events = pack_problems(path, anchors)
        for problem in problems:
            print(f"BROKEN: {problem}")
        if problems:
            return 1
        print(f"intact: every file matches the manifest; audit chain of {events} events intact")
        print(_anchor_note(anchors))
        return 0
    rows = _rows(path)
    broken = first_broken(rows)
    if broken is None:
        declared = (
            json.loads(path.read_text(encoding="utf-8")).get("chain") if path.suffix == ".json" else None
        )
        given = anchors
        if given is None and (embedded := _embedded_anchor(path)) is not None:
            given = [embedded]
        if given is not None:
            broken = anchor_problem(rows, given, export_chain(rows, declared))
    if broken:
        print(f"BROKEN: {broken}")
        return 1
    last = rows[-1]["hash"] if rows else chain.GENESIS_HASH
    print(f"intact: {len(rows)} events, last hash {last}")
    print(_anchor_note(anchors, embedded=anchors is None and _embedded_anchor(path) is not None))
    return 0


def _anchor_note(anchors: list[dict[str, Any]] | None, *, embedded: bool = False) -> str:
    if anchors is not None:
        return f"agrees with the newest of {len(anchors)} external anchor(s) given"
    if embedded:
        return (
            "agrees with the anchor the export states (the server's word): pass --anchor with the "
            "anchors read from the object store to detect a chain cut short or re-hashed"
        )
    return (
        "not checked against an external anchor: pass --anchor with the anchors read from the "
        "object store to detect a chain cut short or re-hashed"
    )


if __name__ == "__main__":
    raise SystemExit(main())
