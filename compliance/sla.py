"""SLA compliance per window from metric snapshots (pure functions, no Django).

A snapshot measures the interval since the snapshot before it. Each interval is one of:
- compliant: the measured percentile is at or under the target;
- breached: it is over the target;
- idle: no request finished in it (nothing to measure, no breach);
- gap: the snapshot is a gap (the endpoint or its metrics were unavailable), the interval is
  longer than `max_interval_s` (the scraper was away), or nothing covers that time at all.
Gaps are reported as gaps, never as compliance. Intervals that cross the window's edges (a
month boundary, in UTC) are split at them.

Compliance is measured time at target over measured time. Credits follow the tiers; when the
window's coverage is below `min_coverage_pct`, gaps count against the provider (as breached
time) for the credit, so missing data never earns a provider a better answer.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

COMPLIANT, BREACHED, IDLE, GAP = "compliant", "breached", "idle", "gap"


@dataclass(frozen=True)
class Measurement:
    taken_at: datetime  # end of the interval it measures (UTC)
    value_ms: float | None  # the percentile over the interval; None when nothing finished
    gap: bool  # the snapshot itself is a gap


@dataclass(frozen=True)
class CreditTier:
    below_pct: float  # applies when compliance is under this percentage
    credit_pct: float  # share of the window's fee credited


@dataclass(frozen=True)
class Span:
    start: datetime
    end: datetime
    kind: str  # COMPLIANT, BREACHED, IDLE or GAP
    worst_ms: float | None = None  # the highest measured value in a breached span

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class WindowReport:
    window_start: datetime
    window_end: datetime
    # The end of what can be judged: the window's end or, for the current window, the last
    # snapshot (or now, when the last snapshot is older than the gap limit).
    judged_until: datetime
    compliant_s: float
    breached_s: float
    idle_s: float
    gap_s: float
    compliance_pct: float | None  # over measured time; None when nothing was measured
    compliance_pct_gaps_as_breach: float | None
    coverage_pct: float  # measured or idle time over judged time
    credit_pct: float
    credit_basis: str  # "measured" or "gaps counted as breach (coverage below minimum)"
    status: str  # "met", "breached" or "no data"
    breaches: tuple[Span, ...]
    gaps: tuple[Span, ...]


MONTH_MIN_YEAR, MONTH_MAX_YEAR = 2000, 2999


def parse_month(value: str) -> datetime:
    """`YYYY-MM` as the first moment of that UTC month; ValueError (a sentence for the user)
    for anything else, including years whose neighbouring months do not exist (0001, 9999)."""
    match = re.fullmatch(r"(\d{4})-(\d{1,2})", value.strip())
    if match is None or not 1 <= int(match.group(2)) <= 12:
        raise ValueError("Use YYYY-MM.")
    year = int(match.group(1))
    if not MONTH_MIN_YEAR <= year <= MONTH_MAX_YEAR:
        raise ValueError(f"Use a month from {MONTH_MIN_YEAR}-01 to {MONTH_MAX_YEAR}-12.")
    return datetime(year, int(match.group(2)), 1, tzinfo=UTC)


def month_window(moment: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) containing `moment`."""
    moment = moment.astimezone(UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, end


def _classify(value_ms: float | None, gap: bool, target_ms: float) -> str:
    if gap:
        return GAP
    if value_ms is None:
        return IDLE
    return BREACHED if value_ms > target_ms else COMPLIANT


def _merge(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in spans:
        if span.duration_s <= 0:
            continue
        last = merged[-1] if merged else None
        if last is not None and last.kind == span.kind and last.end == span.start:
            worst = max((v for v in (last.worst_ms, span.worst_ms) if v is not None), default=None)
            merged[-1] = Span(last.start, span.end, span.kind, worst)
        else:
            merged.append(span)
    return merged


def timeline(
    measurements: Sequence[Measurement],
    *,
    target_ms: float,
    start: datetime,
    end: datetime,
    max_interval_s: float,
) -> list[Span]:
    """Every moment of [start, end) as one kind of span, in order."""
    ordered = sorted(measurements, key=lambda m: m.taken_at)
    spans: list[Span] = []
    for previous, current in itertools.pairwise(ordered):
        length = (current.taken_at - previous.taken_at).total_seconds()
        if length <= 0:
            continue
        kind = GAP if length > max_interval_s else _classify(current.value_ms, current.gap, target_ms)
        lo, hi = max(previous.taken_at, start), min(current.taken_at, end)
        if lo < hi:
            worst = current.value_ms if kind == BREACHED else None
            spans.append(Span(lo, hi, kind, worst))
    # Whatever no interval covers is a gap.
    filled: list[Span] = []
    cursor = start
    for span in spans:
        if span.start > cursor:
            filled.append(Span(cursor, span.start, GAP))
        filled.append(span)
        cursor = max(cursor, span.end)
    if cursor < end:
        filled.append(Span(cursor, end, GAP))
    return _merge(filled)


@dataclass(frozen=True)
class Settled:
    """The judged spans of a window's beginning, [window start, until), kept to be reused."""

    until: datetime
    spans: tuple[Span, ...]


def settle(
    measurements: Sequence[Measurement],
    *,
    target_ms: float,
    window_start: datetime,
    until: datetime,
    max_interval_s: float,
) -> Settled:
    """Judge [window_start, until) once. Only measurements taken before `until` plus
    `lookaround` can change it, so once those are all stored it stays true."""
    spans = timeline(
        measurements, target_ms=target_ms, start=window_start, end=until, max_interval_s=max_interval_s
    )
    return Settled(until=until, spans=tuple(spans))


def credit_for(compliance_pct: float | None, tiers: Sequence[CreditTier]) -> float:
    """The largest credit whose threshold the compliance falls under."""
    if compliance_pct is None:
        return 0.0
    owed = [t.credit_pct for t in tiers if compliance_pct < t.below_pct]
    return max(owed, default=0.0)


def evaluate(
    measurements: Sequence[Measurement],
    *,
    target_ms: float,
    window_start: datetime,
    window_end: datetime,
    now: datetime,
    tiers: Sequence[CreditTier] = (),
    max_interval_s: float = 300.0,
    min_coverage_pct: float = 90.0,
    settled: Settled | None = None,
) -> WindowReport:
    """The window judged from `measurements` (those within `lookaround` of it). With `settled`,
    the spans of [window_start, settled.until) are taken from it, and `measurements` need only
    cover the rest (from `lookaround` before `settled.until`): the same report, for the cost of
    the part of the window that can still change."""
    judged_until = min(window_end, max(now, window_start))
    if now < window_end and measurements:
        # The interval still running is not judged yet (its snapshot has not been taken).
        last = max(m.taken_at for m in measurements)
        if last <= judged_until and (judged_until - last).total_seconds() <= max_interval_s:
            judged_until = max(last, window_start)
    if settled is not None and window_start < settled.until <= judged_until:
        # The window's beginning was judged earlier: judge only what follows it.
        tail = timeline(
            measurements,
            target_ms=target_ms,
            start=settled.until,
            end=judged_until,
            max_interval_s=max_interval_s,
        )
        spans = _merge([*settled.spans, *tail])
    else:
        spans = timeline(
            measurements,
            target_ms=target_ms,
            start=window_start,
            end=judged_until,
            max_interval_s=max_interval_s,
        )
    totals = {kind: 0.0 for kind in (COMPLIANT, BREACHED, IDLE, GAP)}
    for span in spans:
        totals[span.kind] += span.duration_s
    judged_s = (judged_until - window_start).total_seconds()
    measured_s = totals[COMPLIANT] + totals[BREACHED]
    compliance = 100.0 * totals[COMPLIANT] / measured_s if measured_s > 0 else None
    against = measured_s + totals[GAP]
    worst_case = 100.0 * totals[COMPLIANT] / against if against > 0 else None
    coverage = 100.0 * (measured_s + totals[IDLE]) / judged_s if judged_s > 0 else 0.0
    if coverage < min_coverage_pct:
        credit, basis = credit_for(worst_case, tiers), "gaps counted as breach (coverage below minimum)"
    else:
        credit, basis = credit_for(compliance, tiers), "measured"
    if compliance is None:
        status = "no data"
    elif totals[BREACHED] > 0:
        status = "breached"
    else:
        status = "met"
    return WindowReport(
        window_start=window_start,
        window_end=window_end,
        judged_until=judged_until,
        compliant_s=totals[COMPLIANT],
        breached_s=totals[BREACHED],
        idle_s=totals[IDLE],
        gap_s=totals[GAP],
        compliance_pct=compliance,
        compliance_pct_gaps_as_breach=worst_case,
        coverage_pct=coverage,
        credit_pct=credit,
        credit_basis=basis,
        status=status,
        breaches=tuple(s for s in spans if s.kind == BREACHED),
        gaps=tuple(s for s in spans if s.kind == GAP),
    )


def lookaround(max_interval_s: float) -> timedelta:
    """How far outside a window to read snapshots so its edge intervals are attributed."""
    return timedelta(seconds=max_interval_s)
