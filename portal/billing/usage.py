"""Pure arithmetic of metered usage: UTC hour slices, billable units and idempotency keys.

No database and no Stripe here, so the rules that decide money are easy to test exactly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
_MS_PER_MINUTE = 60_000
_DIMENSION = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# Stripe's limit on a meter event identifier; the Idempotency-Key header allows more.
MAX_KEY_LENGTH = 100


@dataclass(frozen=True)
class HourSlice:
    hour: datetime  # start of the UTC hour
    started_at: datetime
    ended_at: datetime
    duration_ms: int


def hour_floor(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("naive datetime: usage times must carry a timezone")
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_ceil(moment: datetime) -> datetime:
    floor = hour_floor(moment)
    return floor if floor == moment.astimezone(UTC) else floor + HOUR


def month_start(moment: datetime) -> datetime:
    return hour_floor(moment).replace(day=1, hour=0)


def next_month(start: datetime) -> datetime:
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def split_by_hour(started_at: datetime, ended_at: datetime) -> list[HourSlice]:
    """The interval cut at UTC hour boundaries (and therefore at day and month boundaries)."""
    if started_at.tzinfo is None or ended_at.tzinfo is None:
        raise ValueError("naive datetime: usage times must carry a timezone")
    if ended_at < started_at:
        raise ValueError("usage ends before it starts")
    start = started_at.astimezone(UTC)
    end = ended_at.astimezone(UTC)
    slices: list[HourSlice] = []
    hour = hour_floor(start)
    while hour < end:
        lo, hi = max(start, hour), min(end, hour + HOUR)
        slices.append(HourSlice(hour, lo, hi, (hi - lo) // timedelta(milliseconds=1)))
        hour += HOUR
    return slices


def billable_minutes(duration_ms: int) -> int:
    """Whole minutes billed for one hourly bucket: rounded to the nearest minute, halves up.

    Rounding once per bucket (not per record) keeps many short trials from each rounding up.
    """
    return (duration_ms + _MS_PER_MINUTE // 2) // _MS_PER_MINUTE


def normalize_dimension(value: str) -> str:
    """A hardware type as used in meter names and keys: lowercase, [a-z0-9_-], at most 32."""
    cleaned = (value or "").strip().lower()
    if not _DIMENSION.match(cleaned):
        raise ValueError(
            f"hardware type {value!r} must be 1-32 characters of a-z, 0-9, '_' or '-', starting with a letter or digit"
        )
    return cleaned


def idempotency_key(
    *, organization_id: object, meter: str, dimension: str, hour: datetime, sequence: int
) -> str:
    """The key of one report, derived from the business event it bills (never random).

    The same (organization, meter, hardware, hour, sequence) always gives the same key, so a
    retried or duplicated send is recognised by Stripe and billed once.
    """
    org = str(organization_id).replace("-", "")
    key = f"tg:{org}:{meter}:{dimension or '-'}:{hour_floor(hour):%Y%m%dT%H}"
    if sequence:
        key += f":{sequence}"
    if len(key) > MAX_KEY_LENGTH:
        key = "tg:" + hashlib.sha256(key.encode()).hexdigest()
    return key


MONTH_MIN_YEAR, MONTH_MAX_YEAR = 2000, 2999


def parse_month(value: str) -> datetime:
    """`YYYY-MM` as the first moment of that UTC month."""
    match = re.fullmatch(r"(\d{4})-(\d{2})", value.strip())
    if match is None or not 1 <= int(match.group(2)) <= 12:
        raise ValueError(f"month {value!r} is not of the form YYYY-MM")
    # Pages link the month before and after: 0001-01 and 9999-12 had none (a 500).
    if not MONTH_MIN_YEAR <= int(match.group(1)) <= MONTH_MAX_YEAR:
        raise ValueError(
            f"month {value!r} is out of range: use a month from {MONTH_MIN_YEAR} to {MONTH_MAX_YEAR}"
        )
    return datetime(int(match.group(1)), int(match.group(2)), 1, tzinfo=UTC)


def previous_month(start: datetime) -> datetime:
    return (
        start.replace(year=start.year - 1, month=12)
        if start.month == 1
        else start.replace(month=start.month - 1)
    )
