"""Feed live measurements back into the calibration.

Every live trial of a tuning job is also simulated; `correct_efficiency` takes those
(measured, predicted) summary pairs and returns corrected factors: the engine's step times,
compute-bound and bandwidth-bound alike, scaled by the median ratio of measured to predicted
mean TPOT (decode steps are what TPOT is made of). Each call is one damped step (`weight`), so a
noisy trial cannot swing the model, and repeated jobs on a tenant's traffic converge on it.

The per-request overhead is left as calibrated. An earlier version also moved it by the p50 TTFT
gap that remained under the scale, on trials predicted mostly free of load: replayed as one
tenant's sequence of jobs (`benchmarks/sim_accuracy.py`, `calibration_convergence`), that shift
carried one trace's prefill error into another's: a gap of hundreds of milliseconds on Mooncake's
long prompts, a constant per request, tripled the predicted TTFT of Azure's short ones. Without it
the replay converges as fast where the calibration is far off (another host) and does less harm
where it is right (the calibration's own host).
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
    return dataclasses.replace(
        efficiency.scaled(compute=scale, step=scale, why="live trials"),
        how=f"{efficiency.how.split('; corrected from')[0]}; corrected from {len(pairs)} live trial(s) "
        f"(step x{scale:.3f})",
    )


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)
