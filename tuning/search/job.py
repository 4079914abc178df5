"""A tuning job: validate the request, prepare the workload, then one trial at a time.

The job is a sequence of steps over persisted state, so the CLI can loop in one process and the
portal can run one trial per Celery task (a killed worker loses at most the trial in flight).
`plan_job` does the one-off preparation; `next_assignment` decides the next trial from the
history; `run_trial` (trial.py) measures it; `summarize_job` selects the winner.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.loadgen.results import json_finite
from serving.perf.feedback import Pair
from tuning.search import gates, prior
from tuning.search.prior import SimPrior
from tuning.search.selection import Candidate, Selection, select
from tuning.search.slo import SLOParseError, SLOTarget, parse_slo
from tuning.search.space import (
    LOCAL_CPU,
    HardwareTarget,
    ModelLoadError,
    SearchSpace,
    build_space,
    model_info,
)
from tuning.search.strategies import PENALTY, GridStrategy, Observation, Strategy, TPEStrategy
from tuning.search.trial import TrialPlan, TrialResult, describe, run_trial
from tuning.workload.errors import TraceError
from tuning.workload.ingest import ingest_path
from tuning.workload.synth import synthesize, write_mooncake_jsonl

SIM_PRIORS = 2  # simulator-ranked candidates tried before TPE's own proposals
MIN_REQUESTS_FOR_P95 = 20  # fewer and a p95 is one or two requests' worth of evidence

HARDWARE: dict[str, HardwareTarget] = {LOCAL_CPU.name: LOCAL_CPU}


class JobSpecError(ValueError):
    """A job that must not start; `field` names what to fix."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class JobSpec:
    trace_path: str
    model_path: str
    slo: str  # e.g. "ttft_p50_ms<=600,ttft_p95_ms<=1500"
    peak_rps: float  # the customer's stated peak
    headroom: float = 1.25  # trials run at peak x headroom
    hardware: str = LOCAL_CPU.name
    budget_trials: int = 8
    strategy: str = "tpe"  # "tpe" or "grid"
    duration_s: float = 20.0  # length of the synthesised workload at the target rate
    repeats: int = 2
    capacity_steps: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0)
    max_prompt_tokens: int | None = 1024  # CPU engines: cap synthesised prompts
    max_output_tokens: int | None = 64
    max_model_len: int = 2048
    seed: int = 0
    trace_format: str = "auto"
    # The configuration serving now (a re-tuning job of the continual loop): measured first
    # after the reference, so the candidates are judged against it on the same traffic.
    incumbent: dict[str, Any] | None = None
    # USD per device-hour that cost per million tokens uses (an admin's price override in the
    # portal's catalog); None: the hardware target's own price.
    price_per_hour_usd: float | None = None

    @property
    def target_rps(self) -> float:
        return self.peak_rps * self.headroom

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        values = dict(data)
        values["capacity_steps"] = tuple(values.get("capacity_steps", (1.5, 2.0, 3.0, 4.0)))
        return cls(**values)


@dataclass(frozen=True)
class Prepared:
    spec: JobSpec
    slo: SLOTarget
    space: SearchSpace
    plan: TrialPlan
    reference: dict[str, Any]  # the highest-precision assignment: trial 0, the gate's yardstick
    defaults: dict[str, Any]  # vLLM with no flags
    sim: SimPrior | None = None  # the simulator for this model and hardware, when it can run
    sim_note: str = ""  # what the simulator's predictions rest on, or why there are none
    sim_ranked: tuple[dict[str, Any], ...] = ()  # sampled candidates, best predicted first

    def predict(self, assignment: Mapping[str, Any]) -> dict[str, Any] | None:
        """The simulator's forecast of a trial of `assignment` on this job's workload."""
        if self.sim is None:
            return None
        return prior.predict(
            self.sim,
            self.space,
            assignment,
            workload=self.plan.workload_trace,
            max_prompt_tokens=self.spec.max_prompt_tokens,
            max_output_tokens=self.spec.max_output_tokens,
            seed=self.spec.seed,
        )


def validate(
    spec: JobSpec, *, allowed_regions: Sequence[str] | None = None
) -> tuple[SLOTarget, HardwareTarget]:
    """Checks everything that can be checked before any engine starts."""
    try:
        slo = parse_slo(spec.slo)
    except SLOParseError as exc:
        raise JobSpecError("slo", str(exc)) from None
    if spec.budget_trials < 1:
        raise JobSpecError("budget_trials", "the budget must allow at least one live trial")
    if not spec.peak_rps > 0 or not math.isfinite(spec.peak_rps):
        raise JobSpecError("peak_rps", "the peak request rate must be a positive number")
    if not 1.0 <= spec.headroom <= 10.0:
        raise JobSpecError("headroom", "the headroom factor must be between 1 and 10")
    if spec.strategy not in {"tpe", "grid"}:
        raise JobSpecError("strategy", "choose tpe or grid")
    price = spec.price_per_hour_usd
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise JobSpecError("price_per_hour_usd", "the price per hour must be a number of USD, 0 or more")
    hardware = HARDWARE.get(spec.hardware)
    if hardware is None:
        raise JobSpecError("hardware", f"unknown hardware {spec.hardware!r}; known: {', '.join(HARDWARE)}")
    if allowed_regions is not None and hardware.region not in allowed_regions:
        raise JobSpecError(
            "hardware",
            f"{hardware.name} runs in region {hardware.region!r}, outside the organization's allowed regions "
            f"({', '.join(allowed_regions) or 'none'})",
        )
    try:
        model_info(spec.model_path)
    except ModelLoadError as exc:
        raise JobSpecError("model_path", str(exc)) from None
    return slo, hardware


def plan_job(
    spec: JobSpec,
    work_dir: Path,
    *,
    allowed_regions: Sequence[str] | None = None,
    calibration: Sequence[Pair] = (),
) -> Prepared:
    """Validate, profile the trace, synthesise the target-rate workload, fix the golden set.

    `calibration`: the tenant's earlier (measured, predicted) trial pairs, which correct the
    simulator that ranks candidates before the first trial and forecasts each one.
    """
    slo, hardware = validate(spec, allowed_regions=allowed_regions)
    model = model_info(spec.model_path)
    space = build_space(model=model, hardware=hardware, max_model_len=spec.max_model_len)
    work_dir.mkdir(parents=True, exist_ok=True)
    # The workload is synthesised once per load level (the target rate and each capacity step, the
    # same length each, so every level is sustained load, not a burst); later steps of the same
    # job, on other workers too, reuse the files.
    levels = (1.0, *spec.capacity_steps)
    files = {m: work_dir / ("workload.jsonl" if m == 1.0 else f"workload-x{m:g}.jsonl") for m in levels}
    if not all(f.exists() for f in files.values()):
        try:
            sample = ingest_path(spec.trace_path, trace_format=spec.trace_format, keep_blocks=True)
        except TraceError as exc:
            raise JobSpecError("trace", str(exc)) from None
        except OSError as exc:
            raise JobSpecError("trace", f"cannot read {spec.trace_path}: {exc.strerror}") from None
        if sample.profile.num_requests < MIN_REQUESTS_FOR_P95:
            raise JobSpecError(
                "trace",
                f"{sample.profile.num_requests} requests are too few to estimate a p95 (need {MIN_REQUESTS_FOR_P95})",
            )
        for multiple, path in files.items():
            trace = synthesize(
                sample,
                target_rps=spec.target_rps * multiple,
                duration_s=spec.duration_s,
                rng=np.random.default_rng(spec.seed),
            )
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with tmp.open("wb") as out:
                write_mooncake_jsonl(trace, out)
            tmp.replace(path)
    workload = files[1.0]
    golden = gates.GoldenSet.make(vocab_size=model.vocab_size, rng=np.random.default_rng(spec.seed + 1))
    plan = TrialPlan(
        model_path=spec.model_path,
        workload_trace=str(workload),
        capacity_traces=tuple((m, str(f)) for m, f in files.items() if m != 1.0),
        target_rps=spec.target_rps,
        slo=slo,
        price_per_hour_usd=(
            hardware.price_per_hour_usd if spec.price_per_hour_usd is None else spec.price_per_hour_usd
        ),
        golden=golden,
        repeats=spec.repeats,
        capacity_steps=spec.capacity_steps,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_output_tokens=spec.max_output_tokens,
        seed=spec.seed,
    )
    reference = {**space.baseline(), "dtype": "float32" if hardware.device_kind == "cpu" else "bfloat16"}
    sim, sim_note = prior.sim_prior(spec.model_path, spec.hardware, calibration)
    ranked: tuple[dict[str, Any], ...] = ()
    if sim is not None and spec.strategy == "tpe":
        ranked = tuple(
            prior.rank(
                sim,
                space,
                slo,
                workload=str(workload),
                max_prompt_tokens=spec.max_prompt_tokens,
                max_output_tokens=spec.max_output_tokens,
                seed=spec.seed,
            )
        )
    return Prepared(
        spec=spec,
        slo=slo,
        space=space,
        plan=plan,
        reference=reference,
        defaults=space.baseline(),
        sim=sim,
        sim_note=sim_note,
        sim_ranked=ranked,
    )


@dataclass(frozen=True)
class TrialRecord:
    number: int
    assignment: dict[str, Any] = field(hash=False)
    result: dict[str, Any] = field(hash=False)  # TrialResult.to_dict()


def objective(result: Mapping[str, Any], slo: SLOTarget) -> float | None:
    """What the strategy minimises: cost per million tokens, or a penalty saying how far off."""
    if result.get("status") != "ok":
        return None
    gates_ok = bool((result.get("correctness") or {}).get("passed")) and bool(
        (result.get("reliability") or {}).get("passed")
    )
    if result.get("slo_met") and gates_ok and result.get("cost_per_mtok_usd") is not None:
        return float(result["cost_per_mtok_usd"])
    overshoot = 0.0
    for o in slo.objectives:
        value = result.get(f"{o.metric}_p{o.percentile}_ms") if o.metric == "ttft" else None
        if value is not None:
            overshoot += max(0.0, float(value) / o.limit_ms - 1.0)
    return PENALTY * (1.0 + overshoot + (0 if gates_ok else 1))


def strategy_for(prepared: Prepared) -> Strategy:
    spec = prepared.spec
    if spec.strategy == "grid":
        return GridStrategy()
    # The simulator's favourite first, then the defaults (what the customer would otherwise run),
    # then the simulator's next favourites.
    ranked = prepared.sim_ranked[:SIM_PRIORS]
    incumbent = (spec.incumbent,) if spec.incumbent else ()
    return TPEStrategy(
        seed=spec.seed,
        priors=(*incumbent, *ranked[:1], prepared.defaults, *ranked[1:]),
        n_startup_trials=max(2, spec.budget_trials // 4),
    )


def next_assignment(
    prepared: Prepared, history: Sequence[TrialRecord], *, strategy: Strategy | None = None
) -> dict[str, Any] | None:
    """Trial 0 is the reference; then the strategy, until the budget is spent."""
    if len(history) >= prepared.spec.budget_trials:
        return None
    if not history:
        return dict(prepared.reference)
    observations = [Observation(r.assignment, objective(r.result, prepared.slo)) for r in history]
    return (strategy or strategy_for(prepared)).propose(prepared.space, observations)


def reference_capture(history: Sequence[TrialRecord]) -> gates.Capture | None:
    for record in history:
        if record.number == 0 and record.result.get("capture"):
            return gates.Capture.from_dict(record.result["capture"])
    return None


def candidates(prepared: Prepared, history: Sequence[TrialRecord]) -> list[Candidate]:
    out = []
    for record in history:
        r = record.result
        correctness = r.get("correctness") or {}
        reliability = r.get("reliability") or {}
        ci = r.get("ttft_p95_ci_ms") or [math.nan, math.nan]
        out.append(
            Candidate(
                trial=record.number,
                label=describe(record.assignment),
                num_changed_knobs=len(prepared.space.changed_knobs(record.assignment)),
                slo_met=bool(r.get("slo_met")),
                slo_violations=tuple(r.get("slo_violations") or ()),
                gates_passed=bool(correctness.get("passed")) and bool(reliability.get("passed")),
                gate_reasons=tuple(correctness.get("reasons") or ())
                + tuple(reliability.get("reasons") or ()),
                cost_per_mtok_usd=r.get("cost_per_mtok_usd"),
                ttft_p50_ms=_num(r.get("ttft_p50_ms")),
                ttft_p95_ms=_num(r.get("ttft_p95_ms")),
                ttft_p95_ci_ms=(_num(ci[0]), _num(ci[1])),
                error=r.get("error") if r.get("status") != "ok" else None,
            )
        )
    return out


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def summarize_job(prepared: Prepared, history: Sequence[TrialRecord]) -> Selection:
    return select(candidates(prepared, history))


def report(prepared: Prepared, history: Sequence[TrialRecord]) -> dict[str, Any]:
    selection = summarize_job(prepared, history)
    return {
        "spec": prepared.spec.to_dict(),
        "slo": str(prepared.slo),
        "target_rps": prepared.spec.target_rps,
        "space": prepared.space.to_dict(),
        "trials": [
            {
                "number": r.number,
                "assignment": r.assignment,
                "label": describe(r.assignment),
                "result": {k: v for k, v in r.result.items() if k != "capture"},
            }
            for r in history
        ],
        "selection": selection.to_dict(),
        "simulator": {
            "note": prepared.sim_note,
            "calibrated_from_trials": prepared.sim.num_pairs if prepared.sim else 0,
            "prior_candidates": [describe(a) for a in prepared.sim_ranked[:SIM_PRIORS]],
            "errors": prior.prediction_errors(r.result for r in history),
        },
    }


def run_trials(
    prepared: Prepared,
    history: list[TrialRecord],
    work_dir: Path,
    *,
    strategy: Strategy | None = None,
    log: Callable[[str], None] | None = None,
    on_trial: Callable[[list[TrialRecord]], None] | None = None,
) -> list[TrialRecord]:
    """Runs trials in this process until the budget is spent (the CLI and benchmarks).

    `on_trial` is called after each trial (to persist); `strategy` overrides the job's.
    """
    while (assignment := next_assignment(prepared, history, strategy=strategy)) is not None:
        number = len(history)
        reference = prepared.reference if number else assignment
        change = prepared.space.change_type(assignment, reference)
        if log:
            log(f"trial {number}: {describe(assignment)} [{change}]")
        result = run_trial(
            prepared.plan,
            prepared.space.to_config(assignment),
            change_type=change,
            reference=reference_capture(history),
            work_dir=work_dir / f"trial-{number}",
        )
        history.append(
            TrialRecord(
                number=number, assignment=assignment, result=with_prediction(prepared, assignment, result)
            )
        )
        if on_trial:
            on_trial(history)
        if log:
            outcome = "ok" if result.status == "ok" else f"failed: {result.error}"
            log(
                f"  p50 TTFT {result.ttft_p50_ms:,.0f} ms, p95 {result.ttft_p95_ms:,.0f} ms, "
                f"SLO {'met' if result.slo_met else 'missed'}, gates {'passed' if result.gates_passed else 'failed'}, "
                f"sustains {result.sustainable_multiple}x ({outcome})"
            )
    return history


def with_prediction(prepared: Prepared, assignment: Mapping[str, Any], result: TrialResult) -> dict[str, Any]:
    """The trial's result as stored: its measurement, and the simulator's forecast of it."""
    data = result.to_dict()
    predicted = prepared.predict(assignment)
    if predicted is not None:
        data["predicted"] = json_finite(predicted)
    return data


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
