"""The simulator as the search's prior, and its predictions checked against every live trial.

Before any engine starts, the scheduler simulator (`serving.sim`) replays the job's own
target-rate workload through a sample of the search space and ranks it; the best few become the
strategy's first proposals. After each live trial the same requests are simulated with the
trial's configuration, and the prediction is stored beside the measurement.

Calibration is a pure function of a tenant's history: the base prediction (the hardware's stored
calibration) of every earlier trial, paired with what that trial measured, corrects the
step-time scale (`serving.perf.feedback`), trusting the history more as it grows. So predictions for a tenant's workload improve with every job, and recomputing them
never drifts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.catalog.hardware import Hardware, get_hardware
from serving.catalog.models import ModelSpec, UnknownModel, get_model, model_spec_from_dir
from serving.perf.feedback import (
    QUEUE_AMPLIFICATION,
    TRUSTED_SCALE,
    Pair,
    applied_scale,
    calibration_mismatch,
    correct_from_pairs,
    queue_amplification,
)
from serving.perf.model import Efficiency, nearest_measured
from serving.sim.api import LatencyTargets, rank_candidates, simulate_trace
from tuning.search.space import SearchSpace

SAMPLED_CANDIDATES = 32  # points of the space the simulator ranks before the search starts


@dataclass(frozen=True)
class SimPrior:
    model: ModelSpec
    hardware: Hardware
    base: Efficiency  # the hardware's stored calibration
    efficiency: Efficiency  # base, corrected by the tenant's earlier trials
    num_pairs: int  # how many earlier trials corrected it
    basis: str  # what the predictions rest on, in words
    # measured / predicted step time of the earlier trials where it lies beyond what a
    # correction trusts (their machine is not the calibration's): predictions rest on the
    # uncorrected calibration, and the basis says so
    mismatch: float | None = None
    scale: float = 1.0  # the step-time scale the correction applies (1.0: none)

    @property
    def source(self) -> str:
        return "calibrated" if self.base.measured else "datasheet"


def sim_prior(model_path: str, hardware: str, pairs: Sequence[Pair] = ()) -> tuple[SimPrior | None, str]:
    """The simulator set up for this model and hardware, or None and why it cannot be."""
    try:
        model = model_spec_from_dir(model_path)
    except UnknownModel as exc:
        try:
            model = get_model(model_path)
        except UnknownModel:
            return None, f"no simulator prior: {exc.args[0]}"
    try:
        hw = get_hardware(hardware)
    except KeyError as exc:
        return None, f"no simulator prior: {exc.args[0]}"
    base, basis = nearest_measured(hw)
    efficiency = base
    scale = 1.0
    mismatch = calibration_mismatch(pairs)
    if mismatch is not None:
        basis = (
            f"{basis}; NOT corrected: {len(pairs)} earlier live trial(s) of this organization ran "
            f"x{mismatch:.3g} the predicted step time, beyond the x{1 / TRUSTED_SCALE:g}-x{TRUSTED_SCALE:g} "
            f"a correction trusts: the calibration does not describe this {hw.name}; recalibrate it"
        )
    elif pairs:
        # Trust the history in proportion to its size: one trial moves the factors halfway.
        weight = len(pairs) / (len(pairs) + 1)
        efficiency = correct_from_pairs(base, pairs, weight=weight)
        scale = applied_scale(pairs, weight=weight)
        basis = f"{basis}; corrected from {len(pairs)} earlier live trial(s) of this organization"
    prior = SimPrior(
        model=model,
        hardware=hw,
        base=base,
        efficiency=efficiency,
        num_pairs=len(pairs),
        basis=basis,
        mismatch=mismatch,
        scale=scale,
    )
    return prior, basis


def _targets(slo: Any) -> LatencyTargets:
    limits: dict[str, float] = {}
    for o in slo.objectives:
        if o.metric == "ttft" and o.percentile in (50, 95):
            limits[f"ttft_p{o.percentile}_ms"] = o.limit_ms
        elif o.metric == "tpot":
            limits["tpot_mean_ms"] = o.limit_ms
    return LatencyTargets(**limits)


def predict(
    prior: SimPrior,
    space: SearchSpace,
    assignment: Mapping[str, Any],
    *,
    workload: str,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    seed: int = 0,
) -> dict[str, Any]:
    """The simulator's forecast of one trial at the target rate: calibrated and base figures."""
    from pathlib import Path

    config = space.to_config(assignment)
    out: dict[str, Any] = {"source": prior.source, "basis": prior.basis}
    result = None
    for key, efficiency in (("", prior.efficiency), ("base_", prior.base)):
        if result is None or prior.efficiency is not prior.base:  # uncorrected: one run serves both
            try:
                result = simulate_trace(
                    Path(workload),
                    model=prior.model,
                    hardware=prior.hardware,
                    config=config,
                    max_prompt_tokens=max_prompt_tokens,
                    max_output_tokens=max_output_tokens,
                    seed=seed,
                    efficiency=efficiency,
                )
            except ValueError as exc:  # e.g. does not fit: the trial will say so too
                return {**out, "error": str(exc)}
        s = result.summary
        out[f"{key}ttft_p50_ms"] = _finite(s.ttft_ms.p50)
        out[f"{key}load_free_share"] = _finite(result.attribution.mean.load_free_share())
        out[f"{key}ttft_p95_ms"] = _finite(s.ttft_ms.p95)
        out[f"{key}tpot_p50_ms"] = _finite(s.tpot_ms.p50)
        if not key:
            mean = result.attribution.mean
            # Where the predicted TTFT goes (means, ms), in the engine's own terms: outside the
            # engine loop, waiting to be scheduled, scheduled to first token (own compute and
            # others' tokens in shared steps), and preemption.
            out["ttft_split_ms"] = {
                "outside_engine": _finite(mean.overhead_ms),
                "queueing": _finite(mean.queueing_ms),
                "prefill": _finite(mean.prefill_compute_ms + mean.chunking_delay_ms),
                "preemption": _finite(mean.preemption_ms),
            }
            out["tpot_mean_ms"] = _finite(s.tpot_ms.mean)
            out["dominant_cause"] = result.attribution.dominant_cause
            out["knob"] = result.attribution.knob
    amplification = queue_amplification(out["base_ttft_p50_ms"], out["ttft_p50_ms"], prior.scale)
    if amplification is not None and amplification > QUEUE_AMPLIFICATION:
        # At saturation an error in the correction's scale multiplies in the queue
        # (`serving.perf.feedback`): the forecast says so, and keeps the corrected figures, which
        # scored better on held-out runs than withholding the correction there.
        out["saturation_sensitive"] = (
            f"at saturation: the step-time scale x{prior.scale:.3g} from earlier trials moved this "
            f"forecast's p50 TTFT {amplification:.2g} times as far as the steps alone could, so an "
            "error in that scale multiplies here"
        )
    return out


def rank(
    prior: SimPrior,
    space: SearchSpace,
    slo: Any,
    *,
    workload: str,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    seed: int = 0,
    samples: int = SAMPLED_CANDIDATES,
) -> list[dict[str, Any]]:
    """Sampled points of the space, best predicted first (valid, simulable ones only)."""
    from pathlib import Path

    rng = random.Random(seed)
    points: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for _ in range(samples * 4):
        if len(points) >= samples:
            break
        point = {k.name: rng.choice(k.values) for k in space.knobs}
        key = tuple(repr(point[k.name]) for k in space.knobs)
        if key in seen or space.violations(point):
            continue
        seen.add(key)
        points.append(point)
    scores = rank_candidates(
        Path(workload),
        [(prior.hardware, space.to_config(p)) for p in points],
        model=prior.model,
        targets=_targets(slo),
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        seed=seed,
        efficiency=prior.efficiency,
    )
    by_config = {repr(space.to_config(p)): p for p in points}
    return [by_config[repr(s.config)] for s in scores if s.error is None and repr(s.config) in by_config]


def pairs_from_results(results: Iterable[Mapping[str, Any]]) -> list[Pair]:
    """(measured, base-predicted) pairs of finished trials that carry a prediction."""
    out = []
    for r in results:
        p = r.get("predicted") or {}
        if r.get("status") != "ok" or "base_ttft_p50_ms" not in p:
            continue
        pair = Pair(
            measured_tpot_ms=_num(r.get("tpot_p50_ms")),
            measured_ttft_p50_ms=_num(r.get("ttft_p50_ms")),
            predicted_tpot_ms=_num(p.get("base_tpot_p50_ms")),
            predicted_ttft_p50_ms=_num(p.get("base_ttft_p50_ms")),
        )
        if all(math.isfinite(v) for v in (pair.measured_tpot_ms, pair.predicted_tpot_ms)):
            out.append(pair)
    return out


def prediction_errors(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Absolute percentage error of the calibrated predictions, per trial and on average."""
    rows = []
    for r in results:
        p = r.get("predicted") or {}
        if r.get("status") != "ok" or "ttft_p50_ms" not in p:
            continue
        row = {}
        for metric in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms"):
            measured, predicted = _num(r.get(metric)), _num(p.get(metric))
            if math.isfinite(measured) and math.isfinite(predicted) and measured > 0:
                row[metric] = abs(predicted - measured) / measured
        rows.append(row)
    summary = {
        f"{metric}_mape": (sum(v) / len(v)) if (v := [r[metric] for r in rows if metric in r]) else None
        for metric in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms")
    }
    return {"num_trials": len(rows), **summary}


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
