"""Feed live measurements back into the calibration.

Every live trial of a tuning job is also simulated; `correct_efficiency` takes those
(measured, predicted) summary pairs and returns corrected factors: engine step times are scaled
by the median ratio of measured to predicted mean TPOT (decode steps are what TPOT is made of),
and the per-request overhead is moved by the gap that remains in p50 TTFT once that scale is
applied, from the trials the simulator predicted mostly free of load (`UNLOADED_SHARE`): the one
constant that minimises their relative TTFT error (the median of the gaps weighted by 1 /
measured TTFT). A constant per request is what an unloaded trial's gap measures; a loaded
trial's gap is mostly queueing that the scale does not carry linearly (seconds of it near the
knee), and a median taken from such trials moved every prediction by seconds
(`benchmarks/sim_accuracy.py`'s calibration replay found it); with no unloaded trial, only the
scale is corrected. Each call is one damped step
(`weight`), so a noisy trial cannot swing the model, and repeated jobs on a tenant's traffic
converge on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.loadgen.results import ReplaySummary
from serving.perf.model import Efficiency


@dataclass(frozen=True)
class Pair:
    """One live measurement and the simulator's prediction of the same requests (milliseconds)."""

    measured_tpot_ms: float
    measured_ttft_p50_ms: float
    predicted_tpot_ms: float
    predicted_ttft_p50_ms: float
    # Of the predicted mean TTFT, the share that does not depend on load (the fixed overhead and
    # the request's own prefill compute; the rest is queueing, chunking and preemption). Only
    # trials mostly free of load (>= UNLOADED_SHARE) can show a per-request constant.
    predicted_load_free_share: float = 1.0


UNLOADED_SHARE = 0.5


def correct_efficiency(
    efficiency: Efficiency,
    pairs: Sequence[tuple[ReplaySummary, ReplaySummary]],
    *,
    weight: float = 0.5,
) -> Efficiency:
    """Corrected factors from (measured, predicted) replay summaries of the same requests."""
    return correct_from_pairs(
        efficiency,
        [Pair(live.tpot_ms.mean, live.ttft_ms.p50, sim.tpot_ms.mean, sim.ttft_ms.p50) for live, sim in pairs],
        weight=weight,
    )


def correct_from_pairs(efficiency: Efficiency, pairs: Sequence[Pair], *, weight: float = 0.5) -> Efficiency:
    """Corrected factors from (measured, predicted) figures; see the module's docstring."""
    if not 0 < weight <= 1:
        raise ValueError("weight must be in (0, 1]")
    ratios = [
        p.measured_tpot_ms / p.predicted_tpot_ms
        for p in pairs
        if _ok(p.measured_tpot_ms) and _ok(p.predicted_tpot_ms) and p.predicted_tpot_ms > 0
    ]
    if not ratios:
        return efficiency
    scale = float(np.exp(weight * np.log(np.median(ratios))))
    usable = [
        p
        for p in pairs
        if _ok(p.measured_ttft_p50_ms)
        and _ok(p.predicted_ttft_p50_ms)
        and p.measured_ttft_p50_ms > 0
        and p.predicted_load_free_share >= UNLOADED_SHARE
    ]
    gaps = [p.measured_ttft_p50_ms - p.predicted_ttft_p50_ms * scale for p in usable]
    shift = weight * weighted_median(gaps, [1.0 / p.measured_ttft_p50_ms for p in usable]) if gaps else 0.0
    return dataclasses.replace(
        efficiency.scaled(compute=scale, step=scale, why="live trials"),
        request_overhead_ms=max(0.0, efficiency.request_overhead_ms + shift),
        how=f"{efficiency.how.split('; corrected from')[0]}; corrected from {len(pairs)} live trial(s) "
        f"(step x{scale:.3f}, request {shift:+.1f} ms)",
    )


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value c minimising sum(w * |v - c|): the lower weighted median (the midpoint where
    the weight splits exactly in two)."""
    if not values or len(values) != len(weights):
        raise ValueError("weighted_median needs as many weights as values, at least one")
    order = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in order)
    seen = 0.0
    for i, (value, w) in enumerate(order):
        seen += w
        if math.isclose(seen, total / 2) and i + 1 < len(order):
            return (value + order[i + 1][0]) / 2.0
        if seen > total / 2:
            return value
    return order[-1][0]


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)
