"""The workload profile: the contract other parts of Tailguard read (DESIGN.md).

Definitions (exact, tested against an independent computation on the shared traces):

- percentiles are numpy's default (linear interpolation);
- `duration_s` is the last minus the first arrival;
- `mean_rps` is `num_requests / duration_s`;
- `peak_rps_60s` is the largest number of arrivals in a 60 s tumbling window (windows start at
  the first arrival) divided by 60;
- `interarrival_cv` is the population standard deviation over the mean of the gaps between
  consecutive arrivals;
- `prefix.reuse_ratio` is, with an unbounded cache, the share of all prompt tokens covered by
  each request's longest prefix of blocks already seen in earlier requests; null when the
  format carries no prefix information.

The `sketch` carries what drift detection needs later, when the raw file is long deleted:
percentile grids of the three distributions and the per-window arrival counts' moments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuning.workload.columns import RequestColumns
from tuning.workload.errors import TraceError

WINDOW_S = 60
_WINDOW_NS = WINDOW_S * 1_000_000_000
SKETCH_PERCENTILES: tuple[float, ...] = tuple(float(p) for p in range(101))


@dataclass(frozen=True)
class LengthStats:
    """Distribution of a token count over requests (all values in tokens)."""

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: int


@dataclass(frozen=True)
class ArrivalStats:
    mean_rps: float  # num_requests / duration_s
    peak_rps_60s: float  # busiest 60 s tumbling window (from the first arrival), per second
    interarrival_cv: float  # population std / mean of consecutive gaps; 1 for Poisson arrivals


@dataclass(frozen=True)
class PrefixStats:
    # share of prompt tokens an unbounded prefix cache would serve; None without prefix info
    reuse_ratio: float | None
    block_size_tokens: int | None  # tokens per prefix block (Mooncake: 512)
    unique_blocks: int | None  # distinct blocks: the unbounded cache's size


@dataclass(frozen=True)
class DistributionSketch:
    """Percentile grids (at `percentiles`) and window-count moments, for drift detection."""

    percentiles: tuple[float, ...]
    input_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    interarrival_s: tuple[float, ...]
    window_count_mean: float  # arrivals per full 60 s window
    window_count_var: float  # population variance of the same
    num_full_windows: int
    # standard error of prefix.reuse_ratio (a ratio estimator over requests); None without prefixes
    reuse_ratio_se: float | None = None


@dataclass(frozen=True)
class WorkloadProfile:
    trace_format: str  # "openai" | "mooncake" | "azure" | "burstgpt"
    # Tokenizer that produced token counts missing from the source; None when the source
    # reported every count itself.
    tokenizer: str | None
    num_requests: int  # successful requests: everything below describes these
    num_failed_requests: int  # counted separately (BurstGPT failures, logged errors)
    num_sessions: int | None  # distinct session ids, where the source has them
    duration_s: float
    input_tokens: LengthStats
    output_tokens: LengthStats
    arrival: ArrivalStats
    prefix: PrefixStats
    sketch: DistributionSketch = field(repr=False)

    def to_json_dict(self) -> dict[str, Any]:
        """The `tailguard profile --json` object (contract fields plus extras)."""
        return {
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "input_tokens": asdict(self.input_tokens),
            "output_tokens": asdict(self.output_tokens),
            "arrival": asdict(self.arrival),
            "prefix": asdict(self.prefix),
            "format": self.trace_format,
            "tokenizer": self.tokenizer,
            "num_failed_requests": self.num_failed_requests,
            "num_sessions": self.num_sessions,
            "sketch": {
                "percentiles": list(self.sketch.percentiles),
                "input_tokens": list(self.sketch.input_tokens),
                "output_tokens": list(self.sketch.output_tokens),
                "interarrival_s": list(self.sketch.interarrival_s),
                "window_count_mean": self.sketch.window_count_mean,
                "window_count_var": self.sketch.window_count_var,
                "num_full_windows": self.sketch.num_full_windows,
                "reuse_ratio_se": self.sketch.reuse_ratio_se,
            },
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> WorkloadProfile:
        """Inverse of `to_json_dict` (for profiles stored by the portal)."""
        sketch = data["sketch"]
        return cls(
            trace_format=str(data["format"]),
            tokenizer=data.get("tokenizer"),
            num_requests=int(data["num_requests"]),
            num_failed_requests=int(data.get("num_failed_requests", 0)),
            num_sessions=data.get("num_sessions"),
            duration_s=float(data["duration_s"]),
            input_tokens=LengthStats(**data["input_tokens"]),
            output_tokens=LengthStats(**data["output_tokens"]),
            arrival=ArrivalStats(**data["arrival"]),
            prefix=PrefixStats(**data["prefix"]),
            sketch=DistributionSketch(
                percentiles=tuple(sketch["percentiles"]),
                input_tokens=tuple(sketch["input_tokens"]),
                output_tokens=tuple(sketch["output_tokens"]),
                interarrival_s=tuple(sketch["interarrival_s"]),
                window_count_mean=float(sketch["window_count_mean"]),
                window_count_var=float(sketch["window_count_var"]),
                num_full_windows=int(sketch["num_full_windows"]),
                reuse_ratio_se=sketch.get("reuse_ratio_se"),
            ),
        )


def length_stats(values: np.ndarray) -> LengthStats:
    p50, p90, p95, p99 = (float(v) for v in np.percentile(values, [50, 90, 95, 99]))
    return LengthStats(
        mean=float(np.mean(values)), p50=p50, p90=p90, p95=p95, p99=p99, max=int(np.max(values))
    )


def window_counts(arrival_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 60 s tumbling windows (from the first arrival; the last may be partial) that hold
    arrivals: their indices, ascending, and their arrival counts.

    Sparse, because two requests centuries apart are a valid file: a dense count per window
    would take gigabytes for them.
    """
    window = (arrival_ns - arrival_ns[0]) // _WINDOW_NS
    starts = np.flatnonzero(np.diff(window, prepend=-1))
    return window[starts], np.diff(starts, append=window.shape[0])


def compute_profile(
    columns: RequestColumns,
    *,
    trace_format: str,
    tokenizer: str | None,
    num_failed_requests: int,
    num_sessions: int | None,
    reuse_ratio: float | None,
    block_size_tokens: int | None,
    unique_blocks: int | None,
) -> WorkloadProfile:
    """The profile of `columns`; `reuse_ratio` and the prefix fields come from the tracker."""
    arrival_ns = columns.arrival_ns
    n = columns.num_requests
    if n == 0:
        extra = f" ({num_failed_requests:,} failed requests only)" if num_failed_requests else ""
        raise TraceError(None, f"the file holds no requests{extra}")
    duration_ns = int(arrival_ns[-1] - arrival_ns[0])
    if n < 2 or duration_ns <= 0:
        raise TraceError(None, "a profile needs at least two requests at different times")
    duration_s = duration_ns / 1e9
    gaps_s = np.diff(arrival_ns).astype(np.float64) / 1e9
    gap_mean = float(np.mean(gaps_s))
    index, counts = window_counts(arrival_ns)
    # Moments over every full window, the empty ones included (as zeros).
    num_full = duration_ns // _WINDOW_NS
    in_full = counts[index < num_full].astype(np.float64)
    full_mean = float(in_full.sum()) / num_full if num_full else float(n)
    full_var = (
        (float(np.sum((in_full - full_mean) ** 2)) + (num_full - in_full.size) * full_mean**2) / num_full
        if num_full
        else 0.0
    )
    grid = np.asarray(SKETCH_PERCENTILES)
    reuse_ratio_se = None
    if (
        reuse_ratio is not None
        and columns.prefix_hit_tokens is not None
        and columns.prefix_tokens is not None
    ):
        total = float(columns.prefix_tokens.sum())
        residual = columns.prefix_hit_tokens - reuse_ratio * columns.prefix_tokens
        reuse_ratio_se = float(np.sqrt(np.sum(residual * residual))) / total if total else None
    return WorkloadProfile(
        trace_format=trace_format,
        tokenizer=tokenizer,
        num_requests=n,
        num_failed_requests=num_failed_requests,
        num_sessions=num_sessions,
        duration_s=duration_s,
        input_tokens=length_stats(columns.input_tokens),
        output_tokens=length_stats(columns.output_tokens),
        arrival=ArrivalStats(
            mean_rps=n / duration_s,
            peak_rps_60s=float(counts.max()) / WINDOW_S,
            interarrival_cv=float(np.std(gaps_s)) / gap_mean,
        ),
        prefix=PrefixStats(
            reuse_ratio=reuse_ratio, block_size_tokens=block_size_tokens, unique_blocks=unique_blocks
        ),
        sketch=DistributionSketch(
            percentiles=SKETCH_PERCENTILES,
            input_tokens=tuple(float(v) for v in np.percentile(columns.input_tokens, grid)),
            output_tokens=tuple(float(v) for v in np.percentile(columns.output_tokens, grid)),
            interarrival_s=tuple(float(v) for v in np.percentile(gaps_s, grid)),
            window_count_mean=full_mean,
            window_count_var=full_var,
            num_full_windows=int(num_full),
            reuse_ratio_se=reuse_ratio_se,
        ),
    )
