"""Feed live measurements back into the calibration.

Every live trial of a tuning job is also simulated; `correct_efficiency` takes those
(measured, predicted) summary pairs and returns corrected factors: engine step times are scaled
by the median ratio of measured to predicted mean TPOT (decode steps are what TPOT is made of),
and the per-request overhead is moved by the median gap that remains in p50 TTFT once that
scale is applied. Each call is one damped step (`weight`), so a noisy trial cannot swing the
model, and repeated jobs on a tenant's traffic converge on it.
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
    gaps = [
        p.measured_ttft_p50_ms - p.predicted_ttft_p50_ms * scale
        for p in pairs
        if _ok(p.measured_ttft_p50_ms) and _ok(p.predicted_ttft_p50_ms)
    ]
    shift = weight * float(np.median(gaps)) if gaps else 0.0
    return dataclasses.replace(
        efficiency,
        gemm_efficiency=efficiency.gemm_efficiency / scale,
        attention_efficiency=efficiency.attention_efficiency / scale,
        memory_efficiency=efficiency.memory_efficiency / scale,
        step_overhead_ms=efficiency.step_overhead_ms * scale,
        seq_overhead_ms=efficiency.seq_overhead_ms * scale,
        token_overhead_ms=efficiency.token_overhead_ms * scale,
        request_overhead_ms=max(0.0, efficiency.request_overhead_ms + shift),
        how=f"{efficiency.how.split('; corrected from')[0]}; corrected from {len(pairs)} live trial(s) "
        f"(step x{scale:.3f}, request {shift:+.1f} ms)",
    )


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)
