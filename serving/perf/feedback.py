"""Feed live measurements back into the calibration.

Every live trial of a tuning job is also simulated; `correct_efficiency` takes those
(measured, predicted) summary pairs and returns corrected factors: the engine's step times,
compute-bound and bandwidth-bound alike, scaled by the ratio of measured to predicted that mean
TPOT (decode steps are what TPOT is made of) and p50 TTFT agree on (`step_ratio`). Each call is
one damped step (`weight`), so a noisy trial cannot swing the model, and repeated jobs on a
tenant's traffic converge on it.

The per-request overhead is left as calibrated. An earlier version also moved it by the p50 TTFT
gap that remained under the scale, on trials predicted mostly free of load: replayed as one
tenant's sequence of jobs (`benchmarks/sim_accuracy.py`, `calibration_convergence`), that shift
carried one trace's prefill error into another's: a gap of hundreds of milliseconds on Mooncake's
long prompts, a constant per request, tripled the predicted TTFT of Azure's short ones. Without it
the replay converges as fast where the calibration is far off (another host) and does less harm
where it is right (the calibration's own host).

A scale is only trusted within a band (`TRUSTED_SCALE`): trials whose steps (`engine_ratio`) run
more than that many times slower or faster than predicted come from a machine the calibration
does not describe, not from drift, and one scale cannot carry them over. Replayed as one tenant's jobs,
the AVX2 host of 2026-12-05 (uncorrected TPOT error 0.90: its decode steps about ten times the
prediction) went from a p50 TTFT error of 0.88 uncorrected to 4.1 after one corrected job
(`benchmarks/results/sim_accuracy.json` as committed in ac8c44b, `kept_runs`).
Outside the band the factors are returned unchanged, with `how` saying so, and
`calibration_mismatch` gives the ratio for the caller to report (recalibrate that hardware).

Near saturation a forecast is far more sensitive to the scale: without load, TTFT is fixed costs
plus engine steps, so scaling step times by s moves it by at most s, while a queue amplifies
the move. `queue_amplification` measures that on the forecast itself (how many times the
scale's own log move the corrected TTFT made), and a forecast beyond `QUEUE_AMPLIFICATION` is
labelled saturation-sensitive; the correction still applies to it. Withholding it there was
tried and measured (`benchmarks/sim_accuracy.py`, `_guarded` beside each gain): it helped on the
run that suggested it (2026-12-06 00:19, where every job past the knee got worse with the
correction), made no significant difference on the next (01:52), and on the fourteen kept runs of
other hosts and days, which had no part in the idea, it took most of the correction's gain away (`calibration_gain_kept_runs` 1.57
corrected everywhere, 1.05 withheld at saturation; `benchmarks/results/sim_accuracy_guard_rescore.json`):
where a tenant's engine really is slower, its queue really does grow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.loadgen.results import ReplaySummary
from serving.perf.model import Efficiency

TRUSTED_SCALE = 2.0  # the widest step-time scale (either way) a correction applies
# A corrected forecast that moved more than this many times the step scale's own log move rests
# on queueing, where an error in the scale multiplies: it is labelled saturation-sensitive.
QUEUE_AMPLIFICATION = 2.0


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
    ratio = engine_ratio(pairs)
    if ratio is None:
        return efficiency
    base_how = efficiency.how.split("; corrected from")[0].split("; not corrected:")[0]
    if calibration_mismatch(pairs) is not None:
        return dataclasses.replace(
            efficiency,
            how=f"{base_how}; not corrected: {len(pairs)} live trial(s) ran x{ratio:.3g} the predicted "
            f"step time, beyond the x{1 / TRUSTED_SCALE:g}-x{TRUSTED_SCALE:g} a correction trusts "
            "(another machine: recalibrate it)",
        )
    scale = _damped(ratio, weight)
    return dataclasses.replace(
        efficiency.scaled(compute=scale, step=scale, why="live trials"),
        how=f"{base_how}; corrected from {len(pairs)} live trial(s) (step x{scale:.3f})",
    )


def tpot_ratio(pairs: Sequence[Pair]) -> float | None:
    """The median of measured over predicted mean TPOT, over the pairs that have both."""
    ratios = [
        p.measured_tpot_ms / p.predicted_tpot_ms
        for p in pairs
        if _ok(p.measured_tpot_ms) and _ok(p.predicted_tpot_ms) and p.predicted_tpot_ms > 0
    ]
    return float(np.median(ratios)) if ratios else None


def step_ratio(pairs: Sequence[Pair]) -> float | None:
    """The engine's step-time ratio the pairs agree on: per pair, the smaller (in log terms) of
    its TPOT and p50 TTFT ratios where both point the same way, else 1; their median. An engine
    slower by r shows at least r in both (queueing only adds to TTFT); a TPOT that a loaded host
    streams slowly while TTFT comes out as predicted or faster is the streaming path, not the
    steps, and scaling every step by it slowed the simulated engine where the live one was not
    slow (the held-out run of 2026-12-05 21:00: `calibration_gain` 0.268). None without a pair
    that has both."""
    shares = []
    for p in pairs:
        if not all(
            _ok(v) and v > 0
            for v in (
                p.measured_tpot_ms,
                p.predicted_tpot_ms,
                p.measured_ttft_p50_ms,
                p.predicted_ttft_p50_ms,
            )
        ):
            continue
        tpot = math.log(p.measured_tpot_ms / p.predicted_tpot_ms)
        ttft = math.log(p.measured_ttft_p50_ms / p.predicted_ttft_p50_ms)
        shares.append(math.copysign(min(abs(tpot), abs(ttft)), tpot) if tpot * ttft > 0 else 0.0)
    return float(np.exp(np.median(shares))) if shares else None


def engine_ratio(pairs: Sequence[Pair]) -> float | None:
    """The step-time ratio a correction would apply: `step_ratio`, or the TPOT ratio alone where
    no pair has a TTFT."""
    agreed = step_ratio(pairs)
    return agreed if agreed is not None else tpot_ratio(pairs)


def applied_scale(pairs: Sequence[Pair], *, weight: float) -> float:
    """The step-time scale a correction of `weight` applies: `engine_ratio` damped (1.0 with no
    ratio, or one beyond the trusted band)."""
    ratio = engine_ratio(pairs)
    if ratio is None or calibration_mismatch(pairs) is not None:
        return 1.0
    return _damped(ratio, weight)


def _damped(ratio: float, weight: float) -> float:
    return float(np.exp(weight * np.log(ratio)))


def queue_amplification(base_ms: float | None, corrected_ms: float | None, scale: float) -> float | None:
    """How many times the step scale's own log move the corrected forecast moved (|log(corrected
    / base)| / |log scale|), or None where either figure or the scale cannot say. Above 1 the
    move is not the steps alone: queueing amplified it."""
    if base_ms is None or corrected_ms is None or not (base_ms > 0 and corrected_ms > 0):
        return None
    if not (math.isfinite(base_ms) and math.isfinite(corrected_ms)):
        return None
    if not (scale > 0 and math.isfinite(scale)) or abs(math.log(scale)) < 1e-3:
        return None
    return abs(math.log(corrected_ms / base_ms)) / abs(math.log(scale))


def calibration_mismatch(pairs: Sequence[Pair]) -> float | None:
    """`engine_ratio` where it lies outside the band a correction trusts (`TRUSTED_SCALE`), else
    None: judged on the same ratio the correction would apply, so a loaded host's slow stream
    alone never reads as another machine."""
    ratio = engine_ratio(pairs)
    if ratio is None or 1 / TRUSTED_SCALE <= ratio <= TRUSTED_SCALE:
        return None
    return ratio


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)
