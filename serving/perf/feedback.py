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

import numpy as np

from serving.loadgen.results import ReplaySummary
from serving.perf.model import Efficiency


def correct_efficiency(
    efficiency: Efficiency,
    pairs: Sequence[tuple[ReplaySummary, ReplaySummary]],
    *,
    weight: float = 0.5,
) -> Efficiency:
    """Corrected factors from (measured, predicted) replay summaries of the same requests."""
    if not 0 < weight <= 1:
        raise ValueError("weight must be in (0, 1]")
    ratios = [
        live.tpot_ms.mean / sim.tpot_ms.mean
        for live, sim in pairs
        if _ok(live.tpot_ms.mean) and _ok(sim.tpot_ms.mean) and sim.tpot_ms.mean > 0
    ]
    if not ratios:
        return efficiency
    scale = float(np.exp(weight * np.log(np.median(ratios))))
    gaps = [
        live.ttft_ms.p50 - sim.ttft_ms.p50 * scale
        for live, sim in pairs
        if _ok(live.ttft_ms.p50) and _ok(sim.ttft_ms.p50)
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
        how=f"{efficiency.how}; corrected from {len(pairs)} live trial(s) (step x{scale:.3f}, "
        f"request {shift:+.1f} ms)",
    )


def _ok(value: float) -> bool:
    return not math.isnan(value)
