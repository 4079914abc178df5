"""SLA arithmetic at the edge: exact percentiles per interval against a request log, the
contracted peak-rate condition, coverage gaps, and the criteria combined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from compliance import edge, sla

START = datetime(2026, 11, 1, tzinfo=UTC)


def _log(rng: np.random.Generator, n: int, span_s: float) -> list[edge.EdgeRecord]:
    offsets = np.sort(rng.uniform(0, span_s, n))
    ttfts = rng.lognormal(mean=5.5, sigma=0.6, size=n)
    failed = rng.uniform(size=n) < 0.02
    return [
        edge.EdgeRecord(
            arrived_at=START + timedelta(seconds=float(o)), ttft_ms=None if f else float(t), ok=not f
        )
        for o, t, f in zip(offsets, ttfts, failed, strict=True)
    ]


def test_interval_percentiles_equal_numpy_over_the_request_log() -> None:
    rng = np.random.default_rng(23)
    log = _log(rng, 3000, 3600)
    judged = edge.intervals(
        iter(log),
        start=START,
        end=START + timedelta(hours=1),
        interval_s=300,
        peak_rps=1000,
        coverage=[(START, START + timedelta(hours=1))],
    )
    assert len(judged) == 12
    for interval in judged:
        inside = [r for r in log if interval.start <= r.arrived_at < interval.end]
        ok = [r.ttft_ms for r in inside if r.ok and r.ttft_ms is not None]
        assert interval.admitted == len(inside) and interval.excluded == 0
        assert interval.failed == len(inside) - len(ok)
        assert interval.ttft_p50_ms == float(np.percentile(ok, 50))
        assert interval.ttft_p95_ms == float(np.percentile(ok, 95))
        assert interval.covered


def test_arrivals_above_the_contracted_peak_rate_are_excluded_per_minute() -> None:
    # 1 req/s contracted = 60 admitted per minute. Minute 0 gets 90 arrivals: the first 60 are
    # fast, the 30 extra (a burst past the contract) are slow and must not be judged.
    fast = [edge.EdgeRecord(START + timedelta(seconds=i * 0.5), 100.0, True) for i in range(60)]
    burst = [edge.EdgeRecord(START + timedelta(seconds=30 + i * 0.9), 5000.0, True) for i in range(30)]
    later = [edge.EdgeRecord(START + timedelta(seconds=60 + i), 120.0, True) for i in range(10)]
    log = sorted(fast + burst + later, key=lambda r: r.arrived_at)
    (interval,) = edge.intervals(
        log,
        start=START,
        end=START + timedelta(minutes=2),
        interval_s=120,
        peak_rps=1.0,
        coverage=[(START, START + timedelta(minutes=2))],
    )
    admitted_first_minute = log[:60]
    assert interval.excluded == 30 and interval.admitted == 70
    expected = [r.ttft_ms for r in admitted_first_minute] + [120.0] * 10
    assert interval.ttft_p95_ms == float(np.percentile(expected, 95))
    assert interval.ttft_p95_ms < 5000.0


def test_the_clients_own_errors_are_counted_apart_and_never_judged() -> None:
    # What the edge proxy reports: a bad key (401), a body over the limit (413), a client that
    # left before its first token (499) say nothing about the service; a timeout reading the
    # request (408), a refusal under load (429) and a 5xx do.
    assert [edge.outcome(s, None) for s in (401, 413, 422, 499)] == ["client"] * 4
    assert [edge.outcome(s, None) for s in (408, 429, 500, 502, 504)] == ["failed"] * 5
    assert edge.outcome(200, 80.0) == "ok" and edge.outcome(200, None) == "failed"
    statuses = [200, 401, 200, 499, 429, 413, 200, 502]
    log = [
        edge.EdgeRecord.of(START + timedelta(seconds=i), 100.0 + i if s == 200 else None, s)
        for i, s in enumerate(statuses)
    ]
    # One request a minute contracted: client errors do not use up the minute's admission.
    (interval,) = edge.intervals(
        log,
        start=START,
        end=START + timedelta(minutes=1),
        interval_s=60,
        peak_rps=5 / 60,
        coverage=[(START, START + timedelta(minutes=1))],
    )
    assert interval.client_errors == 3
    assert interval.admitted == 5 and interval.excluded == 0
    assert interval.failed == 2  # the 429 and the 502
    assert interval.availability_pct == 60.0
    assert interval.ttft_p50_ms == float(np.percentile([100.0, 102.0, 106.0], 50))
    report = edge.evaluate(
        [interval],
        criteria=[edge.Criterion("availability_pct", 99.0)],
        window_start=START,
        window_end=START + timedelta(days=30),
        now=START + timedelta(minutes=1),
        tiers=[],
        min_coverage_pct=0.0,
    )
    assert report.client_errors == 3 and report.failed == 2


def test_uncovered_time_is_a_gap_and_the_worst_criterion_decides() -> None:
    hour = timedelta(hours=1)
    log = [
        edge.EdgeRecord(START + timedelta(seconds=s), 900.0 if s < 600 else 200.0, True)
        for s in range(0, 3600, 10)
    ]
    # The measuring point was silent from minute 50 to 60.
    coverage = [(START, START + timedelta(minutes=50))]
    judged = edge.intervals(
        log, start=START, end=START + hour, interval_s=300, peak_rps=10, coverage=coverage
    )
    assert [i.covered for i in judged] == [True] * 10 + [False] * 2
    report = edge.evaluate(
        judged,
        criteria=[edge.Criterion("ttft_p50_ms", 500.0), edge.Criterion("availability_pct", 99.0)],
        window_start=START,
        window_end=START + hour,
        now=START + hour,
        tiers=[sla.CreditTier(99.0, 10.0), sla.CreditTier(90.0, 25.0)],
        min_coverage_pct=90.0,
    )
    p50 = dict(report.reports)["ttft_p50_ms"]
    availability = dict(report.reports)["availability_pct"]
    assert p50.breached_s == 600 and p50.gap_s == 600 and p50.compliant_s == 2400
    assert availability.breached_s == 0 and availability.status == "met"
    # 2400 of 3000 measured seconds compliant: 80%; coverage 83% < 90%, so gaps count as breach
    # for the credit (2400/3600 = 66.7% -> the 25% tier).
    assert p50.compliance_pct == pytest.approx(80.0)
    assert report.compliance_pct == pytest.approx(80.0) and report.status == "breached"
    assert report.credit_pct == 25.0


@pytest.mark.parametrize(
    ("interval_s", "peak_rps"), [(59, 1.0), (420, 1.0), (7200, 1.0), (300, 0.0), (300, 1e9)]
)
def test_unusable_terms_are_refused_with_a_sentence(interval_s: int, peak_rps: float) -> None:
    assert edge.check_terms(interval_s=interval_s, peak_rps=peak_rps)
    with pytest.raises(ValueError, match="must be"):
        edge.intervals(
            [],
            start=START,
            end=START + timedelta(hours=1),
            interval_s=interval_s,
            peak_rps=peak_rps,
            coverage=[],
        )


def test_records_out_of_order_are_refused() -> None:
    log = [edge.EdgeRecord(START + timedelta(seconds=5), 1.0, True), edge.EdgeRecord(START, 1.0, True)]
    with pytest.raises(ValueError, match="arrival order"):
        edge.intervals(
            log, start=START, end=START + timedelta(hours=1), interval_s=300, peak_rps=1, coverage=[]
        )


def test_burn_rate() -> None:
    assert edge.burn_rate(breached_s=0, measured_s=0, objective_pct=99.5) is None
    # 10% of the last hour breached against an allowance of 0.5%: 20x.
    assert edge.burn_rate(breached_s=360, measured_s=3600, objective_pct=99.5) == pytest.approx(20.0)
