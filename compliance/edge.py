"""SLA arithmetic on requests measured at the edge (pure functions, no Django).

A measuring point in front of the engine (the router, or a proxy) records every request: when it
arrived, its time to first token as the client saw it, and whether it succeeded. From those
records this module judges each measurement interval exactly, with no histogram buckets:

- **Peak-rate condition.** The agreement holds "up to the contracted peak rate": in each UTC
  minute only the first `ceil(peak_rps * 60)` arrivals are admitted to the SLA; later arrivals
  of that minute are counted as excluded, never judged.
- **Percentiles** are numpy's default (linear) percentiles of the admitted successful requests'
  TTFTs in the interval: the same number an auditor gets from the request log.
- **Availability** is the share of admitted requests that succeeded.
- **The client's own errors are not judged.** A request refused for what the client sent or
  did (a 4xx status: bad key, body too large, malformed; 499: the client left before its first
  token) says nothing about the service; it is counted apart and neither admitted nor failed.
  408 (the service too slow to read the request) and 429 (the service refusing load it
  promised) are the service's and count as failures.
- **Coverage.** Time the measuring point did not report on (no batch covers it) is a gap, never
  compliance, exactly as in `compliance.sla`.

Each criterion (p50, p95, availability) becomes a series of `sla.Measurement`s that
`sla.evaluate` judges like the engine's; the agreement's compliance is the lowest of them and
its credit the largest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from compliance import sla

# Intervals are whole minutes so that the per-minute admission nests inside them.
MIN_INTERVAL_S, MAX_INTERVAL_S = 60, 3600
MAX_PEAK_RPS = 5000.0
# What one interval may hold in memory: peak rate x interval length, admitted requests only.
MAX_ADMITTED_PER_INTERVAL = 2_000_000


# 4xx statuses that are the service's doing, not the client's.
SERVICE_4XX = frozenset({408, 429})


def outcome(status_code: int, ttft_ms: float | None) -> str:
    """How a request at the edge is judged: "ok", "failed" (the service's failure) or "client"
    (the client's own error: not judged)."""
    if 400 <= status_code < 500 and status_code not in SERVICE_4XX:
        return "client"
    return "ok" if status_code < 400 and ttft_ms is not None else "failed"


@dataclass(frozen=True)
class EdgeRecord:
    arrived_at: datetime  # when the request reached the measuring point (UTC)
    ttft_ms: float | None  # client-side time to first token; None when no token came
    ok: bool  # answered without a server error and produced its first token
    client_error: bool = False  # the client's own error (see `outcome`): not judged

    @classmethod
    def of(cls, arrived_at: datetime, ttft_ms: float | None, status_code: int) -> EdgeRecord:
        judged = outcome(status_code, ttft_ms)
        return cls(arrived_at=arrived_at, ttft_ms=ttft_ms, ok=judged == "ok", client_error=judged == "client")


@dataclass(frozen=True)
class EdgeInterval:
    start: datetime
    end: datetime
    covered: bool  # the measuring point reported on all of [start, end)
    admitted: int  # requests judged (within the peak-rate condition)
    excluded: int  # arrivals above the contracted peak rate in their minute
    failed: int  # admitted requests that did not succeed
    ttft_p50_ms: float | None  # over admitted successful requests; None when there were none
    ttft_p95_ms: float | None
    client_errors: int = 0  # the client's own errors (not judged, not admitted)

    @property
    def availability_pct(self) -> float | None:
        return 100.0 * (self.admitted - self.failed) / self.admitted if self.admitted else None


@dataclass(frozen=True)
class Criterion:
    name: str  # "ttft_p50_ms", "ttft_p95_ms" or "availability_pct"
    target: float  # ms for the TTFT percentiles, percent for availability


@dataclass(frozen=True)
class EdgeReport:
    window_start: datetime
    window_end: datetime
    reports: tuple[tuple[str, sla.WindowReport], ...]  # one per criterion, in the terms' order
    admitted: int
    excluded: int
    failed: int
    client_errors: int
    # The lowest compliance of the criteria (None when nothing was measured) and the largest credit.
    compliance_pct: float | None
    credit_pct: float
    status: str  # "breached" if any criterion breached, else "met", or "no data"


def admitted_per_minute(peak_rps: float) -> int:
    return max(1, math.ceil(peak_rps * 60 - 1e-9))


def check_terms(*, interval_s: int, peak_rps: float) -> list[str]:
    """What is wrong with these measurement terms, in sentences (empty when they are usable)."""
    problems = []
    # Whole minutes (the peak-rate admission is per minute) that divide an hour, so that every
    # calendar month is a whole number of intervals.
    if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S or interval_s % 60 or 3600 % interval_s:
        problems.append(
            f"The interval must be whole minutes that divide an hour, from {MIN_INTERVAL_S} to {MAX_INTERVAL_S} s."
        )
    if not 0 < peak_rps <= MAX_PEAK_RPS:
        problems.append(f"The contracted peak rate must be above 0 and at most {MAX_PEAK_RPS:g} req/s.")
    elif admitted_per_minute(peak_rps) * max(interval_s, 60) // 60 > MAX_ADMITTED_PER_INTERVAL:
        problems.append("The peak rate times the interval is too many requests to judge at once.")
    return problems


def _merge_spans(spans: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    merged: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted(spans):
        if hi <= lo:
            continue
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _covered(merged: Sequence[tuple[datetime, datetime]], lo: datetime, hi: datetime) -> bool:
    return any(a <= lo and hi <= b for a, b in merged)


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def intervals(
    records: Iterable[EdgeRecord],
    *,
    start: datetime,
    end: datetime,
    interval_s: int,
    peak_rps: float,
    coverage: Iterable[tuple[datetime, datetime]],
) -> list[EdgeInterval]:
    """[start, end) cut into intervals of `interval_s`, each judged from `records` (which must come
    in arrival order; those outside [start, end) are skipped). Only whole intervals are returned:
    the one still running at `end` is not judged yet."""
    problems = check_terms(interval_s=interval_s, peak_rps=peak_rps)
    if problems:
        raise ValueError(" ".join(problems))
    per_minute = admitted_per_minute(peak_rps)
    merged = _merge_spans(coverage)
    step = timedelta(seconds=interval_s)
    out: list[EdgeInterval] = []
    lo = start
    values: list[float] = []
    admitted = excluded = failed = client_errors = 0
    minute_key: int | None = None
    minute_count = 0
    last_arrival: datetime | None = None

    def close(lo: datetime, hi: datetime) -> None:
        out.append(
            EdgeInterval(
                start=lo,
                end=hi,
                covered=_covered(merged, lo, hi),
                admitted=admitted,
                excluded=excluded,
                failed=failed,
                ttft_p50_ms=_percentile(values, 50),
                ttft_p95_ms=_percentile(values, 95),
                client_errors=client_errors,
            )
        )

    for record in records:
        if last_arrival is not None and record.arrived_at < last_arrival:
            raise ValueError("edge records must come in arrival order")
        last_arrival = record.arrived_at
        if record.arrived_at < start:
            continue
        if record.arrived_at >= end:
            break
        while record.arrived_at >= lo + step:
            if lo + step <= end:
                close(lo, lo + step)
            lo += step
            values, admitted, excluded, failed, client_errors = [], 0, 0, 0, 0
        if record.client_error:
            client_errors += 1
            continue
        key = int(record.arrived_at.timestamp() // 60)
        if key != minute_key:
            minute_key, minute_count = key, 0
        minute_count += 1
        if minute_count > per_minute:
            excluded += 1
            continue
        admitted += 1
        if record.ok and record.ttft_ms is not None:
            values.append(record.ttft_ms)
        else:
            failed += 1
    while lo + step <= end:
        close(lo, lo + step)
        lo += step
        values, admitted, excluded, failed, client_errors = [], 0, 0, 0, 0
    return out


def _value(interval: EdgeInterval, criterion: str) -> float | None:
    if criterion == "availability_pct":
        availability = interval.availability_pct
        # Judged as unavailability against the allowed unavailability (sla.evaluate breaches
        # values above the target).
        return None if availability is None else 100.0 - availability
    return interval.ttft_p50_ms if criterion == "ttft_p50_ms" else interval.ttft_p95_ms


def evaluate(
    judged: Sequence[EdgeInterval],
    *,
    criteria: Sequence[Criterion],
    window_start: datetime,
    window_end: datetime,
    now: datetime,
    tiers: Sequence[sla.CreditTier],
    min_coverage_pct: float,
) -> EdgeReport:
    """The window judged on every criterion from its intervals (as `intervals` returns them)."""
    reports = []
    for criterion in criteria:
        target = 100.0 - criterion.target if criterion.name == "availability_pct" else criterion.target
        measurements = [sla.Measurement(taken_at=window_start, value_ms=None, gap=False)]
        measurements += [
            sla.Measurement(taken_at=i.end, value_ms=_value(i, criterion.name), gap=not i.covered)
            for i in judged
        ]
        interval_s = max(((i.end - i.start).total_seconds() for i in judged), default=60.0)
        reports.append(
            (
                criterion.name,
                sla.evaluate(
                    measurements,
                    target_ms=target,
                    window_start=window_start,
                    window_end=window_end,
                    now=now,
                    tiers=tiers,
                    max_interval_s=interval_s,
                    min_coverage_pct=min_coverage_pct,
                ),
            )
        )
    measured = [r.compliance_pct for _, r in reports if r.compliance_pct is not None]
    statuses = {r.status for _, r in reports}
    status = "breached" if "breached" in statuses else ("met" if "met" in statuses else "no data")
    return EdgeReport(
        window_start=window_start,
        window_end=window_end,
        reports=tuple(reports),
        admitted=sum(i.admitted for i in judged),
        excluded=sum(i.excluded for i in judged),
        failed=sum(i.failed for i in judged),
        client_errors=sum(i.client_errors for i in judged),
        compliance_pct=min(measured) if measured else None,
        credit_pct=max((r.credit_pct for _, r in reports), default=0.0),
        status=status,
    )


def burn_rate(*, breached_s: float, measured_s: float, objective_pct: float) -> float | None:
    """How fast recent breaches spend the window's error budget: the breached share of the recent
    measured time over the share the objective allows (1.0 spends it exactly by the window's end;
    14.4 over an hour spends a 30-day budget in about two days). None without measured time."""
    if measured_s <= 0:
        return None
    allowed = max(100.0 - objective_pct, 1e-9) / 100.0
    return (breached_s / measured_s) / allowed
