"""Drift: does new traffic still look like the traffic an endpoint was tuned for?

Each dimension gets a divergence, a threshold and a sentence. A dimension drifts only when the
change is both *material* (divergence above its threshold: a size that would change tuning
decisions) and *significant* (too large for sampling noise at these sample sizes). Requiring
both is what keeps two halves of one stationary trace quiet while a real shift is flagged.

- input/output lengths: divergence = the largest |log((1 + new) / (1 + old))| among the mean,
  the median and the 95th percentile (the numbers that size batches, memory and tail latency),
  threshold log(1.25), i.e. one of them moved by 25%; significance from a two-sample
  Kolmogorov-Smirnov statistic estimated from the two percentile grids, at alpha = 0.001.
- arrival rate: divergence = |log(new mean rps / old)|, threshold log(1.25); significance from
  a z-test on the per-minute arrival counts (their variance includes burstiness), z > 4; under
  ten minutes a side, on the totals with a CV^2-inflated Poisson variance.
- burstiness: divergence = |log(new interarrival CV / old)|, threshold log(1.5); needs at least
  500 gaps on each side.
- prefix reuse: divergence = |new reuse ratio - old|, threshold 0.10 (ten points of prompt
  tokens), significant beyond 4 standard errors of the two ratios; only where both samples
  carry prefix information and have 200 requests or more.
  Each sample's ratio starts from a cold cache, so compare samples of similar size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuning.workload.profile import WorkloadProfile

LENGTH_THRESHOLD = math.log(1.25)
RATE_THRESHOLD = math.log(1.25)
BURSTINESS_THRESHOLD = math.log(1.5)
PREFIX_THRESHOLD = 0.10
_KS_C_ALPHA = 1.95  # c(alpha) of the two-sample KS test at alpha = 0.001
_RATE_Z = 4.0
_MIN_GAPS = 200
# The sample CV of heavy-tailed gaps converges slowly: below this it is mostly noise.
_MIN_BURSTINESS_GAPS = 500
_PREFIX_Z = 4.0
_MIN_WINDOWS = 10


@dataclass(frozen=True)
class DimensionDrift:
    dimension: str  # input_tokens | output_tokens | arrival_rate | burstiness | prefix_reuse
    divergence: float | None  # None when the dimension cannot be compared
    threshold: float
    significant: bool  # beyond sampling noise for these sample sizes
    drifted: bool  # divergence > threshold and significant
    explanation: str  # one sentence a person can act on


@dataclass(frozen=True)
class DriftReport:
    drifted: bool
    summary: str  # one line: what drifted (or that nothing did)
    dimensions: tuple[DimensionDrift, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "drifted": self.drifted,
            "summary": self.summary,
            "dimensions": [asdict(d) for d in self.dimensions],
        }


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def _cdf_at(points: np.ndarray, quantiles: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The CDF a percentile grid describes, evaluated at `points` (right-continuous)."""
    right = np.searchsorted(quantiles, points, side="right")
    return np.where(right == 0, 0.0, levels[np.clip(right - 1, 0, levels.size - 1)])


def _length_drift(name: str, label: str, old: WorkloadProfile, new: WorkloadProfile) -> DimensionDrift:
    levels = np.asarray(old.sketch.percentiles) / 100.0
    q_old = np.asarray(getattr(old.sketch, name), dtype=np.float64)
    q_new = np.asarray(getattr(new.sketch, name), dtype=np.float64)
    stats_old, stats_new = getattr(old, name), getattr(new, name)
    # The statistic that moved most (relative) is both the divergence and the sentence.
    moves = {
        key: abs(math.log1p(getattr(stats_new, key)) - math.log1p(getattr(stats_old, key)))
        for key in ("mean", "p50", "p95")
    }
    key = max(moves, key=lambda k: moves[k])
    divergence = moves[key]
    points = np.union1d(q_old, q_new)
    ks = float(np.max(np.abs(_cdf_at(points, q_old, levels) - _cdf_at(points, q_new, levels))))
    n, m = old.num_requests, new.num_requests
    significant = ks > _KS_C_ALPHA * math.sqrt((n + m) / (n * m))
    drifted = significant and divergence > LENGTH_THRESHOLD
    before, after = getattr(stats_old, key), getattr(stats_new, key)
    verb = "rose" if after > before else "fell" if after < before else "stayed"
    sentence = f"{key} {label} length {verb} from {_fmt(before)} to {_fmt(after)} tokens"
    if verb == "stayed":
        sentence = f"{key} {label} length stayed at {_fmt(before)} tokens"
    if not drifted:
        sentence += " (within normal variation)"
    return DimensionDrift(
        dimension=name,
        divergence=divergence,
        threshold=LENGTH_THRESHOLD,
        significant=significant,
        drifted=drifted,
        explanation=sentence,
    )


def _rate_drift(old: WorkloadProfile, new: WorkloadProfile) -> DimensionDrift:
    r_old, r_new = old.arrival.mean_rps, new.arrival.mean_rps
    divergence = abs(math.log(r_new / r_old))
    s_old, s_new = old.sketch, new.sketch
    if min(s_old.num_full_windows, s_new.num_full_windows) >= _MIN_WINDOWS:
        noise = math.sqrt(
            s_old.window_count_var / s_old.num_full_windows + s_new.window_count_var / s_new.num_full_windows
        )
        z = abs(s_new.window_count_mean - s_old.window_count_mean) / max(noise, 1e-9)
    else:
        # Too few minutes to measure their spread: counting noise of a renewal process, whose
        # count variance is about CV^2 times its mean (bursty traffic is noisier than Poisson).
        cv_old, cv_new = max(old.arrival.interarrival_cv, 1.0), max(new.arrival.interarrival_cv, 1.0)
        noise = math.sqrt(cv_old**2 * r_old / old.duration_s + cv_new**2 * r_new / new.duration_s)
        z = abs(r_new - r_old) / max(noise, 1e-12)
    significant = z > _RATE_Z
    drifted = significant and divergence > RATE_THRESHOLD
    verb = "rose" if r_new > r_old else "fell"
    sentence = (
        f"mean arrival rate {verb} from {_fmt(r_old)} to {_fmt(r_new)} requests/s "
        f"(busiest minute {_fmt(old.arrival.peak_rps_60s)} -> {_fmt(new.arrival.peak_rps_60s)} requests/s)"
    )
    if not drifted:
        sentence += " (within normal variation)"
    return DimensionDrift(
        dimension="arrival_rate",
        divergence=divergence,
        threshold=RATE_THRESHOLD,
        significant=significant,
        drifted=drifted,
        explanation=sentence,
    )


def _burstiness_drift(old: WorkloadProfile, new: WorkloadProfile) -> DimensionDrift:
    cv_old, cv_new = old.arrival.interarrival_cv, new.arrival.interarrival_cv
    enough = min(old.num_requests, new.num_requests) - 1 >= _MIN_BURSTINESS_GAPS
    if cv_old <= 0 or cv_new <= 0:
        divergence = 0.0 if cv_old == cv_new else math.inf
    else:
        divergence = abs(math.log(cv_new / cv_old))
    drifted = enough and divergence > BURSTINESS_THRESHOLD
    verb = "rose" if cv_new > cv_old else "fell"
    kind = "burstier" if cv_new > cv_old else "smoother"
    sentence = f"inter-arrival CV {verb} from {cv_old:.2f} to {cv_new:.2f} ({kind} traffic)"
    if not enough:
        sentence = f"burstiness not compared: fewer than {_MIN_BURSTINESS_GAPS} arrivals on one side"
    elif not drifted:
        sentence += " (within normal variation)"
    return DimensionDrift(
        dimension="burstiness",
        divergence=divergence if math.isfinite(divergence) else None,
        threshold=BURSTINESS_THRESHOLD,
        significant=enough,
        drifted=drifted,
        explanation=sentence,
    )


def _prefix_drift(old: WorkloadProfile, new: WorkloadProfile) -> DimensionDrift:
    a, b = old.prefix.reuse_ratio, new.prefix.reuse_ratio
    if a is None or b is None:
        return DimensionDrift(
            dimension="prefix_reuse",
            divergence=None,
            threshold=PREFIX_THRESHOLD,
            significant=False,
            drifted=False,
            explanation="prefix reuse not compared: a sample has no prefix information",
        )
    divergence = abs(b - a)
    enough = min(old.num_requests, new.num_requests) >= _MIN_GAPS
    se_old, se_new = old.sketch.reuse_ratio_se, new.sketch.reuse_ratio_se
    if se_old is not None and se_new is not None:
        enough = enough and divergence > _PREFIX_Z * math.hypot(se_old, se_new)
    drifted = enough and divergence > PREFIX_THRESHOLD
    verb = "rose" if b > a else "fell"
    sentence = f"prefix reuse {verb} from {a:.0%} to {b:.0%} of prompt tokens"
    if min(old.num_requests, new.num_requests) < _MIN_GAPS:
        sentence = f"prefix reuse not compared: fewer than {_MIN_GAPS} requests on one side"
    elif not drifted:
        sentence += " (within normal variation)"
    return DimensionDrift(
        dimension="prefix_reuse",
        divergence=divergence,
        threshold=PREFIX_THRESHOLD,
        significant=enough,
        drifted=drifted,
        explanation=sentence,
    )


def drift_report(old: WorkloadProfile, new: WorkloadProfile) -> DriftReport:
    """Compare the profile an endpoint was tuned for (`old`) with current traffic (`new`)."""
    dimensions = (
        _length_drift("input_tokens", "input", old, new),
        _length_drift("output_tokens", "output", old, new),
        _rate_drift(old, new),
        _burstiness_drift(old, new),
        _prefix_drift(old, new),
    )
    drifted = [d for d in dimensions if d.drifted]
    if drifted:
        # the largest relative excess over its threshold leads the summary
        drifted.sort(key=lambda d: -(d.divergence or 0.0) / d.threshold)
        summary = "; ".join(d.explanation for d in drifted)
    else:
        summary = "no drift: " + dimensions[0].explanation.replace(" (within normal variation)", "")
    return DriftReport(drifted=bool(drifted), summary=summary, dimensions=dimensions)
