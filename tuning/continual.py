"""The continual loop's decisions: has the live traffic drifted from what the endpoint was tuned
for, is its SLO eroding, what traffic to re-tune on, and did a new configuration win.

Live traffic is known only through the engine's metrics (scraped into windows): request counts,
prompt and output length histograms, prefix-cache lookups and hits, TTFT percentiles. The
tuned-for workload is known exactly (the job's synthesised requests). Both are put through the
same lens, the engine's own length buckets, and turned into `WorkloadProfile`s, so the traffic
issue's drift report (`tuning.workload.drift`) judges them: a dimension drifts only when the
change is material and beyond sampling noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.metrics import Histogram
from tuning.workload.drift import DriftReport, drift_report
from tuning.workload.profile import (
    SKETCH_PERCENTILES,
    WINDOW_S,
    ArrivalStats,
    DistributionSketch,
    LengthStats,
    PrefixStats,
    WorkloadProfile,
)

BLOCK_TOKENS = 512  # prefix block size of the Mooncake JSONL the loop writes (the reader's default)
EROSION_SHARE = 0.8  # p95 TTFT above this share of its target, and rising, is erosion
EROSION_WINDOWS = 4  # recent windows the erosion check looks at


@dataclass(frozen=True)
class LiveWindow:
    """One scrape interval of an endpoint's engine."""

    interval_s: float
    num_requests: float  # finished in the interval
    prompt_tokens: Histogram  # the interval's request prompt lengths
    output_tokens: Histogram
    prefix_queries_tokens: float
    prefix_hits_tokens: float
    ttft_p95_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "num_requests": self.num_requests,
            "prompt_tokens": _hist_dict(self.prompt_tokens),
            "output_tokens": _hist_dict(self.output_tokens),
            "prefix_queries_tokens": self.prefix_queries_tokens,
            "prefix_hits_tokens": self.prefix_hits_tokens,
            "ttft_p95_ms": self.ttft_p95_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LiveWindow:
        return cls(
            interval_s=float(data["interval_s"]),
            num_requests=float(data["num_requests"]),
            prompt_tokens=_hist_from(data.get("prompt_tokens")),
            output_tokens=_hist_from(data.get("output_tokens")),
            prefix_queries_tokens=float(data.get("prefix_queries_tokens") or 0.0),
            prefix_hits_tokens=float(data.get("prefix_hits_tokens") or 0.0),
            ttft_p95_ms=data.get("ttft_p95_ms"),
        )


def _hist_dict(h: Histogram) -> dict[str, Any]:
    return {
        "bounds": [b if math.isfinite(b) else "+Inf" for b in h.bounds],
        "cumulative_counts": list(h.cumulative_counts),
        "sum": h.sum,
        "count": h.count,
    }


def _hist_from(data: Any) -> Histogram:
    if not data or not data.get("bounds"):
        return Histogram.empty()
    return Histogram(
        bounds=tuple(math.inf if b == "+Inf" else float(b) for b in data["bounds"]),
        cumulative_counts=tuple(float(c) for c in data["cumulative_counts"]),
        sum=float(data["sum"]),
        count=float(data["count"]),
    )


def _add(a: Histogram, b: Histogram) -> Histogram:
    if not a.bounds:
        return b
    if not b.bounds:
        return a
    if a.bounds != b.bounds:
        raise ValueError("histograms have different buckets")
    return Histogram(
        bounds=a.bounds,
        cumulative_counts=tuple(x + y for x, y in zip(a.cumulative_counts, b.cumulative_counts, strict=True)),
        sum=a.sum + b.sum,
        count=a.count + b.count,
    )


def bucketed(values: np.ndarray, bounds: Sequence[float]) -> Histogram:
    """`values` counted into cumulative buckets with upper bounds `bounds` (like Prometheus)."""
    v = np.asarray(values, dtype=np.float64)
    cumulative = tuple(float(np.count_nonzero(v <= b)) for b in bounds)
    return Histogram(
        bounds=tuple(bounds), cumulative_counts=cumulative, sum=float(v.sum()), count=float(v.size)
    )


def _grid(h: Histogram) -> tuple[float, ...]:
    return tuple(h.quantile(p / 100.0) for p in SKETCH_PERCENTILES)


def _length_stats(h: Histogram) -> LengthStats:
    top = next((b for b, c in zip(h.bounds, h.cumulative_counts, strict=True) if c >= h.count), 0.0)
    return LengthStats(
        mean=h.mean,
        p50=h.quantile(0.5),
        p90=h.quantile(0.9),
        p95=h.quantile(0.95),
        p99=h.quantile(0.99),
        max=int(top) if math.isfinite(top) else int(h.quantile(1.0)),
    )


def _profile(
    prompt: Histogram,
    output: Histogram,
    *,
    num_requests: int,
    duration_s: float,
    window_counts: np.ndarray,
    interarrival_cv: float,
    reuse_ratio: float | None,
    source: str,
) -> WorkloadProfile:
    rate = num_requests / duration_s if duration_s > 0 else math.nan
    full = window_counts.astype(np.float64)
    se = (
        math.sqrt(reuse_ratio * (1 - reuse_ratio) / max(num_requests, 1)) if reuse_ratio is not None else None
    )
    return WorkloadProfile(
        trace_format=source,
        tokenizer=None,
        num_requests=num_requests,
        num_failed_requests=0,
        num_sessions=None,
        duration_s=duration_s,
        input_tokens=_length_stats(prompt),
        output_tokens=_length_stats(output),
        arrival=ArrivalStats(
            mean_rps=rate,
            peak_rps_60s=float(full.max() / WINDOW_S) if full.size else rate,
            interarrival_cv=interarrival_cv,
        ),
        prefix=PrefixStats(reuse_ratio=reuse_ratio, block_size_tokens=None, unique_blocks=None),
        sketch=DistributionSketch(
            percentiles=SKETCH_PERCENTILES,
            input_tokens=_grid(prompt),
            output_tokens=_grid(output),
            # Gaps are not observable from metrics: an exponential grid at the mean rate, and the
            # burstiness dimension is left uncompared (CV NaN).
            interarrival_s=tuple(
                -math.log(max(1e-12, 1 - p / 100.0)) / rate if rate > 0 else math.nan
                for p in SKETCH_PERCENTILES
            ),
            window_count_mean=float(full.mean()) if full.size else math.nan,
            window_count_var=float(full.var()) if full.size else math.nan,
            num_full_windows=int(full.size),
            reuse_ratio_se=se,
        ),
    )


def live_profile(windows: Sequence[LiveWindow]) -> WorkloadProfile | None:
    """The live traffic over `windows` as a profile (None when no request finished)."""
    prompt, output = Histogram.empty(), Histogram.empty()
    for w in windows:
        prompt, output = _add(prompt, w.prompt_tokens), _add(output, w.output_tokens)
    num = round(sum(w.num_requests for w in windows))
    if num <= 0 or prompt.count <= 0:
        return None
    duration = sum(w.interval_s for w in windows)
    # Scrape intervals summed into full 60 s windows (the traffic issue's window).
    counts, acc, span = [], 0.0, 0.0
    for w in windows:
        acc, span = acc + w.num_requests, span + w.interval_s
        if span >= WINDOW_S:
            counts.append(acc * WINDOW_S / span)
            acc, span = 0.0, 0.0
    queries = sum(w.prefix_queries_tokens for w in windows)
    hits = sum(w.prefix_hits_tokens for w in windows)
    return _profile(
        prompt,
        output,
        num_requests=num,
        duration_s=duration,
        window_counts=np.asarray(counts),
        interarrival_cv=math.nan,
        reuse_ratio=hits / queries if queries > 0 else None,
        source="live",
    )


def tuned_for_profile(
    workload: Path,
    *,
    prompt_bounds: Sequence[float],
    output_bounds: Sequence[float],
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    prefix_hit_rate: float | None,
) -> WorkloadProfile:
    """The workload a configuration was tuned on, through the same lens as live traffic.

    Lengths are capped as the trials capped them and bucketed with the live histograms' bounds;
    prefix reuse is what the winning trial's engine measured (the same quantity live metrics
    report).
    """
    rows = [json.loads(line) for line in workload.read_text().splitlines() if line.strip()]
    arrival_s = np.array([r["timestamp"] for r in rows], dtype=np.float64) / 1000.0
    prompts = np.array([r["input_length"] for r in rows], dtype=np.float64)
    outputs = np.array([r["output_length"] for r in rows], dtype=np.float64)
    if max_prompt_tokens:
        prompts = np.minimum(prompts, max_prompt_tokens)
    if max_output_tokens:
        outputs = np.minimum(outputs, max_output_tokens)
    duration = float(arrival_s[-1] - arrival_s[0]) if len(rows) > 1 else 0.0
    gaps = np.diff(arrival_s)
    edges = np.arange(0.0, duration + 1e-9, WINDOW_S)
    counts = np.histogram(arrival_s - arrival_s[0], bins=edges)[0] if edges.size > 1 else np.zeros(0)
    return _profile(
        bucketed(prompts, prompt_bounds),
        bucketed(outputs, output_bounds),
        num_requests=len(rows),
        duration_s=max(duration, 1e-9),
        window_counts=counts,
        interarrival_cv=float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else math.nan,
        reuse_ratio=prefix_hit_rate,
        source="tuned-for",
    )


def detect_drift(tuned_for: WorkloadProfile, live: WorkloadProfile) -> DriftReport:
    return drift_report(tuned_for, live)


def slo_erosion(p95_ms: Sequence[float | None], target_ms: float) -> str | None:
    """Why the recent p95 TTFTs (oldest first) say the SLO is eroding, or None.

    Eroding: the median of the last windows is above `EROSION_SHARE` of the target and they
    rise; or the last two both break the target.
    """
    values = [float(v) for v in p95_ms if v is not None and math.isfinite(v)][-EROSION_WINDOWS:]
    if len(values) < 2:
        return None
    if all(v > target_ms for v in values[-2:]):
        return f"p95 TTFT {values[-2]:,.0f} and {values[-1]:,.0f} ms: over the {target_ms:,.0f} ms target twice in a row"
    if len(values) >= 3 and float(np.median(values)) > EROSION_SHARE * target_ms:
        slope = float(np.polyfit(np.arange(len(values)), values, 1)[0])
        if slope > 0:
            return (
                f"p95 TTFT rising toward the {target_ms:,.0f} ms target (median {np.median(values):,.0f} ms "
                f"over the last {len(values)} windows, +{slope:,.0f} ms per window)"
            )
    return None


def synthesize_live(
    windows: Sequence[LiveWindow], *, duration_s: float, rng: np.random.Generator, out: Path
) -> int:
    """Write a Mooncake JSONL of live-like traffic (rate, lengths, prefix reuse); returns requests.

    Lengths are drawn from the live histograms (each bucket's share, and the histogram's mean:
    see `_draw`; the open top bucket at its lower bound); arrivals are Poisson at the live rate; prompts share leading 512-token
    blocks from a small pool so that the share of reused prompt tokens matches the live
    prefix-cache hit rate.
    """
    prompt, output = Histogram.empty(), Histogram.empty()
    for w in windows:
        prompt, output = _add(prompt, w.prompt_tokens), _add(output, w.output_tokens)
    seconds = sum(w.interval_s for w in windows)
    finished = sum(w.num_requests for w in windows)
    if prompt.count <= 0 or seconds <= 0:
        raise ValueError("no live requests in the window: nothing to synthesise")
    rate = finished / seconds
    n = max(2, round(rate * duration_s))
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    arrival = (arrival - arrival[0]) * (duration_s / max(arrival[-1] - arrival[0], 1e-9))
    prompts = np.maximum(1, _draw(prompt, n, rng)).astype(np.int64)
    outputs = np.maximum(1, _draw(output, n, rng)).astype(np.int64)
    queries = sum(w.prefix_queries_tokens for w in windows)
    hit = sum(w.prefix_hits_tokens for w in windows) / queries if queries > 0 else 0.0
    full_blocks = prompts // BLOCK_TOKENS
    # Probability that each full block is part of a shared chain, so shared tokens / all ~ hit.
    share = min(1.0, hit * prompts.sum() / max(1, BLOCK_TOKENS * full_blocks.sum()))
    pool = 4
    next_id = 1_000_000
    with out.open("w") as stream:
        for i in range(n):
            blocks = int(-(-prompts[i] // BLOCK_TOKENS))
            shared = int(rng.binomial(int(full_blocks[i]), share)) if full_blocks[i] else 0
            chain = int(rng.integers(0, pool))
            ids = [chain * 10_000 + b for b in range(shared)]
            ids += list(range(next_id, next_id + blocks - shared))
            next_id += blocks - shared
            stream.write(
                json.dumps(
                    {
                        "timestamp": round(float(arrival[i]) * 1000),
                        "input_length": int(prompts[i]),
                        "output_length": int(outputs[i]),
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return n


def _draw(h: Histogram, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` values with the histogram's bucket shares and, as nearly as the buckets allow, its mean.

    Buckets are wide (vLLM's 1-2-5 series: a prompt counted in (1000, 2000] can be anywhere in
    it), and traffic is rarely spread evenly inside them: capped prompts pile up at the cap, so a
    uniform draw inside each bucket made live-like traffic a quarter shorter than the live traffic
    it copied, and near saturation far lighter. Each value stays in its bucket; its position
    inside is bent towards the bucket's top or bottom (u ** a, one `a` for all) until the draws'
    mean matches the histogram's exact one (its sum over its count).
    """
    counts = np.diff(np.concatenate([[0.0], np.asarray(h.cumulative_counts)]))
    probs = np.clip(counts, 0, None)
    probs = probs / probs.sum()
    which = rng.choice(len(probs), size=n, p=probs)
    lower = np.concatenate([[0.0], np.asarray(h.bounds[:-1])])[which]
    upper = np.asarray(h.bounds, dtype=np.float64)[which]
    width = np.where(np.isfinite(upper), np.maximum(upper - lower, 1.0), 0.0)
    u = rng.uniform(size=n)

    def values(log_a: float) -> np.ndarray:
        return np.asarray(lower + width * u ** math.exp(log_a))

    target = h.sum / h.count if h.count > 0 else math.nan
    log_a = 0.0
    if math.isfinite(target):
        lo, hi = -4.0, 4.0  # a from 1/55 (near each top) to 55 (near each bottom)
        for _ in range(40):  # the mean falls as a grows: bisect on log a
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if values(mid).mean() > target else (lo, mid)
        log_a = (lo + hi) / 2
    return np.round(values(log_a))


@dataclass(frozen=True)
class CanaryVerdict:
    promote: bool
    reason: str
    candidate_ttft_p50_ms: float | None
    incumbent_ttft_p50_ms: float | None


MIN_GAIN = 0.10  # the candidate's p50 TTFT must be at least 10% lower than the incumbent's


def canary(candidate: Mapping[str, Any] | None, incumbent: Mapping[str, Any] | None) -> CanaryVerdict:
    """Whether the re-tuning job's winner beats the running configuration on the new traffic.

    Both are trial results of the same job (same traffic, same target rate, measured one after
    the other on the same machine). The candidate must pass its gates and meet the SLO, and beat
    the incumbent's p50 TTFT by `MIN_GAIN` with no worse p95, or meet the SLO where the
    incumbent does not.
    """

    def num(r: Mapping[str, Any] | None, key: str) -> float | None:
        v = (r or {}).get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    c50, i50 = num(candidate, "ttft_p50_ms"), num(incumbent, "ttft_p50_ms")
    if candidate is None:
        return CanaryVerdict(False, "the re-tuning job found no configuration meeting the SLO", None, i50)
    if incumbent is None or incumbent.get("status") != "ok":
        return CanaryVerdict(False, "the running configuration was not measured on the new traffic", c50, i50)
    gates_ok = bool((candidate.get("correctness") or {}).get("passed")) and bool(
        (candidate.get("reliability") or {}).get("passed")
    )
    if not gates_ok:
        return CanaryVerdict(False, "the candidate failed its correctness or reliability gate", c50, i50)
    if not candidate.get("slo_met"):
        return CanaryVerdict(False, "the candidate does not meet the SLO on the new traffic", c50, i50)
    if not incumbent.get("slo_met"):
        return CanaryVerdict(
            True,
            "the candidate meets the SLO on the new traffic; the running configuration does not",
            c50,
            i50,
        )
    if c50 is None or i50 is None:
        return CanaryVerdict(False, "no TTFT to compare", c50, i50)
    c95, i95 = num(candidate, "ttft_p95_ms"), num(incumbent, "ttft_p95_ms")
    if c50 <= (1 - MIN_GAIN) * i50 and (c95 is None or i95 is None or c95 <= i95):
        return CanaryVerdict(
            True, f"p50 TTFT {c50:,.0f} ms vs {i50:,.0f} ms for the running configuration", c50, i50
        )
    return CanaryVerdict(
        False,
        f"not better by more than the noise: p50 TTFT {c50:,.0f} ms vs {i50:,.0f} ms "
        f"(needs {MIN_GAIN:.0%} lower and no worse p95)",
        c50,
        i50,
    )


def regressed(
    before_p95: Sequence[float | None], after_p95: Sequence[float | None], *, margin: float = 0.2
) -> bool:
    """Whether live p95 TTFT after a promotion is worse than before by more than `margin`."""
    b = [v for v in before_p95 if v is not None and math.isfinite(v)]
    a = [v for v in after_p95 if v is not None and math.isfinite(v)]
    if not a or not b:
        return False
    return float(np.median(a)) > (1 + margin) * float(np.median(b))
