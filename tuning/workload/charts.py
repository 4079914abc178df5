"""Chart data for the profile page: small, JSON-ready series, no per-request rows.

The portal turns these into Plotly figures; nothing here knows about Plotly. Sizes are bounded
(at most ~720 time bins, ~40 histogram bins, ~24 curve points) whatever the trace length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuning.workload.columns import RequestColumns, ReuseCurve
from tuning.workload.profile import WINDOW_S, window_counts

_NICE_BINS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
_MAX_TIME_BINS = 720
_HIST_BINS = 40
# Assumed service speed for the concurrency estimate (a trace has arrivals, not completions):
# a mid-size model on one modern GPU. Stated in the chart so the page can say "assuming ...".
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
DEFAULT_DECODE_S_PER_TOKEN = 0.02


@dataclass(frozen=True)
class Histogram:
    bin_edges: tuple[float, ...]  # len(counts) + 1 edges; the last bin includes its right edge
    counts: tuple[int, ...]


@dataclass(frozen=True)
class ArrivalRateSeries:
    bin_s: float  # width of each time bin
    bin_start_s: tuple[float, ...]  # seconds since the first arrival
    rate_rps: tuple[float, ...]  # arrivals in the bin / bin_s
    peak_window_start_s: float  # the profile's busiest 60 s window (to mark on the chart)
    peak_window_end_s: float
    peak_rps_60s: float


@dataclass(frozen=True)
class InterarrivalDistribution:
    num_zero_gaps: int  # arrivals at the same instant as the previous one (no place on a log axis)
    positive_gaps_s: Histogram  # log-spaced bins


@dataclass(frozen=True)
class ConcurrencySeries:
    """Requests in flight over time, estimated from arrivals and lengths with an assumed speed."""

    bin_s: float
    bin_start_s: tuple[float, ...]
    max_in_flight: tuple[int, ...]  # the largest number in flight during each bin
    prefill_tokens_per_s: float  # assumption: service time = input/prefill + output*decode
    decode_s_per_token: float


@dataclass(frozen=True)
class ChartData:
    arrival_rate: ArrivalRateSeries
    input_tokens: Histogram
    output_tokens: Histogram
    interarrival: InterarrivalDistribution
    reuse_curve: ReuseCurve | None  # None when the format has no prefix information
    concurrency: ConcurrencySeries

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def _time_bin_s(duration_s: float) -> float:
    for width in _NICE_BINS_S:
        if duration_s / width <= _MAX_TIME_BINS:
            return float(width)
    return float(np.ceil(duration_s / _MAX_TIME_BINS / 86400) * 86400)


def _length_histogram(values: np.ndarray) -> Histogram:
    top = int(values.max()) if values.size else 0
    edges = np.unique(np.concatenate([[0.0, 1.0], np.geomspace(1, top + 1, _HIST_BINS).round()]))
    counts, _ = np.histogram(values, bins=edges)
    return Histogram(bin_edges=tuple(float(e) for e in edges), counts=tuple(int(c) for c in counts))


def _gap_distribution(arrival_ns: np.ndarray) -> InterarrivalDistribution:
    gaps_s = np.diff(arrival_ns).astype(np.float64) / 1e9
    positive = gaps_s[gaps_s > 0]
    if positive.size:
        low, high = float(positive.min()), float(positive.max())
        edges = np.geomspace(low, high, _HIST_BINS + 1) if high > low else np.array([low, low * 2])
        counts, _ = np.histogram(positive, bins=edges)
    else:
        edges, counts = np.zeros(0), np.zeros(0, dtype=np.int64)
    return InterarrivalDistribution(
        num_zero_gaps=int(gaps_s.size - positive.size),
        positive_gaps_s=Histogram(
            bin_edges=tuple(float(e) for e in edges), counts=tuple(int(c) for c in counts)
        ),
    )


def _concurrency(
    arrival_s: np.ndarray,
    columns: RequestColumns,
    bin_s: float,
    num_bins: int,
    prefill_tokens_per_s: float,
    decode_s_per_token: float,
) -> ConcurrencySeries:
    service_s = columns.input_tokens / prefill_tokens_per_s + columns.output_tokens * decode_s_per_token
    ends = np.sort(arrival_s + service_s)
    # in flight just after each arrival: arrivals so far minus completions so far
    after_arrival = np.arange(1, arrival_s.size + 1) - np.searchsorted(ends, arrival_s, side="right")
    bin_of = np.minimum((arrival_s // bin_s).astype(np.int64), num_bins - 1)
    peak = np.zeros(num_bins, dtype=np.int64)
    np.maximum.at(peak, bin_of, after_arrival)
    starts = np.arange(num_bins) * bin_s
    at_start = np.searchsorted(arrival_s, starts, side="right") - np.searchsorted(ends, starts, side="right")
    peak = np.maximum(peak, at_start)
    return ConcurrencySeries(
        bin_s=bin_s,
        bin_start_s=tuple(float(s) for s in starts),
        max_in_flight=tuple(int(v) for v in peak),
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_s_per_token=decode_s_per_token,
    )


def compute_charts(
    columns: RequestColumns,
    reuse_curve: ReuseCurve | None,
    *,
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
    decode_s_per_token: float = DEFAULT_DECODE_S_PER_TOKEN,
) -> ChartData:
    arrival_s = columns.arrival_s
    duration_s = float(arrival_s[-1]) if arrival_s.size else 0.0
    bin_s = _time_bin_s(duration_s)
    num_bins = int(duration_s // bin_s) + 1
    per_bin = np.bincount(np.minimum((arrival_s // bin_s).astype(np.int64), num_bins - 1), minlength=num_bins)
    index, counts = window_counts(columns.arrival_ns)
    top = int(np.argmax(counts))
    busiest = int(index[top])
    return ChartData(
        arrival_rate=ArrivalRateSeries(
            bin_s=bin_s,
            bin_start_s=tuple(float(i * bin_s) for i in range(num_bins)),
            rate_rps=tuple(float(c) / bin_s for c in per_bin),
            peak_window_start_s=float(busiest * WINDOW_S),
            peak_window_end_s=float((busiest + 1) * WINDOW_S),
            peak_rps_60s=float(counts[top]) / WINDOW_S,
        ),
        input_tokens=_length_histogram(columns.input_tokens),
        output_tokens=_length_histogram(columns.output_tokens),
        interarrival=_gap_distribution(columns.arrival_ns),
        reuse_curve=reuse_curve,
        concurrency=_concurrency(
            arrival_s, columns, bin_s, num_bins, prefill_tokens_per_s, decode_s_per_token
        ),
    )
