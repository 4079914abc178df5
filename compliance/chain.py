"""The audit trail's hash chain: canonical encoding and digests (pure functions, no Django).

Each organization has its own chain (plus one "platform" chain for events about no
organization), so an auditor who receives one organization's export can verify it alone: every
event's hash covers its own canonical fields and the previous event's hash, so editing,
removing or reordering any event breaks every later link.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# The hash a chain's first event points back to.
GENESIS_HASH = "0" * 64
PLATFORM_CHAIN = "platform"

# The fields an event's hash covers, in a fixed order (the order is part of the format).
HASHED_FIELDS = (
    "chain",
    "seq",
    "prev_hash",
    "created_at",
    "organization_id",
    "actor_id",
    "actor_label",
    "action",
    "target_type",
    "target_id",
    "request_id",
    "data",
    "before_digest",
    "after_digest",
)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, non-ASCII escaped."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def normalise(value: Any) -> Any:
    """Numbers as PostgreSQL's jsonb gives them back, so a hash survives the round trip: jsonb
    prints 1e20 as 100000000000000000000 (read back as an int) and drops the sign of -0.0."""
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("audit data cannot hold NaN or infinity")
        if value == 0:
            return 0.0
        if value.is_integer() and abs(value) >= 1e16:
            return int(value)
    return value


def digest(value: Any) -> str:
    """sha256 of a value's canonical JSON; "" for None (nothing recorded)."""
    if value is None:
        return ""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def timestamp(moment: datetime) -> str:
    """UTC with microseconds: what PostgreSQL and SQLite both store exactly."""
    if moment.tzinfo is None:
        raise ValueError("audit timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_hash(fields: Mapping[str, Any]) -> str:
    """The hash of one event from its canonical fields (see HASHED_FIELDS)."""
    payload = []
    for name in HASHED_FIELDS:
        value = fields[name]
        if name == "created_at" and isinstance(value, datetime):
            value = timestamp(value)
        elif name in {"organization_id", "actor_id"} and value is not None:
            value = str(value)
        elif name == "data":
            value = normalise(value)
        payload.append(value)
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


# Spreadsheet formula injection (OWASP, "CSV Injection"): Excel, LibreOffice and Sheets run a
# cell that starts with = + - @ tab or carriage return as a formula (`=HYPERLINK(...)` in a
# user's name). The CSV export prefixes such a cell with an apostrophe, which spreadsheets show
# as text and hide; a cell that already starts with an apostrophe gets one too, so a reader
# recovers every value exactly by dropping one leading apostrophe (the hashes still verify).
CSV_ESCAPED_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def csv_cell(value: Any) -> Any:
    """A value as the CSV export writes it (text that a spreadsheet would run is escaped)."""
    if isinstance(value, str) and value.startswith(CSV_ESCAPED_STARTS):
        return "'" + value
    return value


def csv_value(cell: str) -> str:
    """The value a CSV export's cell holds (the inverse of `csv_cell`)."""
    return cell[1:] if cell.startswith("'") else cell


def chain_key(organization_id: object | None) -> str:
    return PLATFORM_CHAIN if organization_id is None else str(organization_id)
