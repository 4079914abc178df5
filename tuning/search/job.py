"""A tuning job: validate the request, prepare the workload, then one trial at a time.

The job is a sequence of steps over persisted state, so the CLI can loop in one process and the
portal can run one trial per Celery task (a killed worker loses at most the trial in flight).
`plan_job` does the one-off preparation; `next_assignment` decides the next trial from the
history; `run_trial` (trial.py) measures it; `summarize_job` selects the winner.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serving.engine.host import fastest_dtype
from serving.loadgen.results import json_finite
from serving.perf.feedback import Pair
from tuning.search import confirm, export, gates, prior
from tuning.search.caps import Caps, caps_effect
from tuning.search.prior import SimPrior
from tuning.search.selection import Candidate, Selection, select
from tuning.search.slo import SLOParseError, SLOTarget, parse_slo
from tuning.search.space import (
    LOCAL_CPU,
    HardwareTarget,
    ModelLoadError,
    SearchSpace,
    build_space,
    gpu_target,
    model_info,
    on_this_host,
)
from tuning.search.strategies import (
    PENALTY,
    GridStrategy,
    Observation,
    Strategy,
    TPEStrategy,
    propose_batch,
)
from tuning.search.trial import TrialPlan, TrialResult, describe, run_trial
from tuning.workload.errors import TraceError
from tuning.workload.ingest import ingest_path
from tuning.workload.synth import MIN_LENGTH_SCALE, scale_lengths, synthesize, write_mooncake_jsonl

SIM_PRIORS = 2  # simulator-ranked candidates tried before TPE's own proposals
MIN_REQUESTS_FOR_P95 = 20  # fewer and a p95 is one or two requests' worth of evidence
# Bounds on what sizes work (requests synthesised per load level, engines started): a job past
# them is refused before anything runs, whatever the caller.
MAX_PEAK_RPS = 1000.0
MAX_REQUESTS_PER_LEVEL = 50_000
MAX_BUDGET_TRIALS = 100
# The search budget counts the search's live trials only. Its first trial is the competent
# baseline (vLLM's defaults with the host's fastest dtype; a re-tune measures the running
# configuration before it), so a budget of 1 measures no candidate at all and "tunes" nothing.
# Every entry point (the portal's form and API, the CLI, this library) refuses less than a
# baseline and one candidate, with this message.
MIN_BUDGET_TRIALS = 2
BUDGET_MIN_ERROR = (
    f"A search needs at least {MIN_BUDGET_TRIALS} trials: the first measures the competent baseline, "
    "so with fewer no candidate is ever tried."
)
MAX_CONFIRM_REPEATS = 10
MAX_FINALISTS = 4
# Load multiples tried beyond the target while the SLO holds (each a replay of its own).
DEFAULT_CAPACITY_STEPS = (1.5, 2.0, 3.0, 4.0)
MAX_CAPACITY_STEPS = 6
MAX_CAPACITY_MULTIPLE = 10.0
MAX_TOKENS = 1_000_000

# Phases of a job's trials, in order. The reference is captured (golden-set answers only, no
# load) and is never a candidate; the search explores; confirmation re-measures the finalists
# against the baselines in interleaved rounds; the ablation reverts the winner's knobs one at a
# time.
REFERENCE, SEARCH, CONFIRM, ABLATION = "reference", "search", "confirm", "ablation"
REFERENCE_ATTEMPTS = 2  # the reference is retried once on a fresh engine, then the job stops

# Where trials can run. GPU targets come from the hardware catalog (memory, price per
# device-hour); their engine hosts are the pools' agents, each with its own CUDA vLLM.
HARDWARE: dict[str, HardwareTarget] = {
    LOCAL_CPU.name: LOCAL_CPU,
    **{name: gpu_target(name) for name in ("h100", "h200")},
}
LOAD_FORMATS = ("dummy",)  # besides the checkpoint's weights (None)


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
    capacity_steps: tuple[float, ...] = DEFAULT_CAPACITY_STEPS
    # Caps on the replayed lengths and the engine's context. Never silent: `caps_for` derives
    # them from the sample's profile and the hardware, and every report states the share of
    # requests they clip.
    max_prompt_tokens: int | None = 1024
    max_output_tokens: int | None = 64
    max_model_len: int = 2048
    # Where the hardware cannot replay the real lengths: every prompt and output is replayed at
    # this factor of its length (MIN_LENGTH_SCALE to 1; 1: real lengths), before the caps, and
    # every report states it with the share of requests it shortened.
    length_scale: float = 1.0
    seed: int = 0
    trace_format: str = "auto"
    # The configuration serving now (a re-tuning job of the continual loop): measured first
    # after the reference, so the candidates are judged against it on the same traffic.
    incumbent: dict[str, Any] | None = None
    # USD per hour of the trials' host that cost per million tokens uses (an admin's price
    # override in the portal's catalog, or a pool's price); None: the hardware target's own
    # price; 0: not priced (a pool or machine without a price): no trial has a cost, and the
    # search and selection rank on latency alone.
    price_per_hour_usd: float | None = None
    # Confirmation: interleaved rounds re-measuring the finalists and both baselines on fresh
    # engines (0 skips it: the search's single measurements are then reported as unconfirmed).
    confirm_repeats: int = 3
    finalists: int = 2
    # A trial during which other processes kept more than this many cores busy is "contended":
    # shown, and excluded from selection and confirmation. None: record only.
    contention_cores: float | None = 0.3
    # Knobs held at vLLM's default and left out of the search (e.g. `cpu_worker_cores`, whose
    # gain is an artefact of 2-core hosts and does not carry over to servers).
    frozen_knobs: tuple[str, ...] = ()
    # "dummy": random weights from the model's config.json (vLLM's --load-format dummy): shapes,
    # memory and timings of the real model without its checkpoint; the gate then compares random
    # models, which the report says. None: the checkpoint's own weights.
    load_format: str | None = None

    @property
    def target_rps(self) -> float:
        return self.peak_rps * self.headroom

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        values = dict(data)
        values["capacity_steps"] = tuple(values.get("capacity_steps", DEFAULT_CAPACITY_STEPS))
        values["frozen_knobs"] = tuple(values.get("frozen_knobs", ()))
        return cls(**values)


@dataclass(frozen=True)
class Prepared:
    spec: JobSpec
    slo: SLOTarget
    space: SearchSpace
    plan: TrialPlan
    reference: dict[str, Any]  # the highest-precision assignment: captured first, the gate's yardstick
    defaults: dict[str, Any]  # vLLM with no flags: the naive baseline, shown beside
    competent: dict[str, Any]  # vLLM's defaults plus the host's fastest dtype: the baseline
    competent_why: str  # the evidence for the competent baseline's dtype
    caps: dict[str, Any]  # CapsEffect.to_dict(): the caps and the share of requests they clip
    golden: dict[str, Any] = field(default_factory=dict)  # the golden set's source, counts and lengths
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


def validate_budget(budget_trials: int) -> None:
    """Refuses a search budget that cannot tune (below a baseline and one candidate) or that
    would start more engines than a job may."""
    if isinstance(budget_trials, bool) or not isinstance(budget_trials, int):
        raise JobSpecError("budget_trials", "the search budget must be a whole number of live trials")
    if budget_trials < MIN_BUDGET_TRIALS:
        raise JobSpecError("budget_trials", BUDGET_MIN_ERROR)
    if budget_trials > MAX_BUDGET_TRIALS:
        raise JobSpecError(
            "budget_trials", f"the search budget must be at most {MAX_BUDGET_TRIALS} live trials"
        )


def parse_capacity_steps(text: str) -> tuple[float, ...]:
    """ "1.5, 2, 3" as the load multiples; "none" (or "0") for no capacity probe. Raises
    JobSpecError naming what is wrong."""
    words = [w for w in re.split(r"[,\s]+", text.strip().lower()) if w]
    if words in (["none"], ["0"]):
        return ()
    try:
        steps = tuple(float(w.rstrip("x")) for w in words)
    except ValueError:
        raise JobSpecError(
            "capacity_steps",
            f"load steps are multiples of the target rate such as '1.5, 2, 3' (or 'none'), not {text!r}",
        ) from None
    validate_capacity_steps(steps)
    return steps


def validate_capacity_steps(steps: Sequence[float]) -> None:
    if len(steps) > MAX_CAPACITY_STEPS:
        raise JobSpecError("capacity_steps", f"use at most {MAX_CAPACITY_STEPS} load steps beyond the target")
    if not all(
        isinstance(m, (int, float)) and math.isfinite(m) and 1.0 < m <= MAX_CAPACITY_MULTIPLE for m in steps
    ):
        raise JobSpecError(
            "capacity_steps",
            f"each load step must be a multiple of the target rate above 1 and at most {MAX_CAPACITY_MULTIPLE:g}",
        )
    if list(steps) != sorted(set(steps)):
        raise JobSpecError("capacity_steps", "load steps must rise, each once (e.g. 1.5, 2, 3)")


def validate(
    spec: JobSpec, *, allowed_regions: Sequence[str] | None = None, region: str | None = None
) -> tuple[SLOTarget, HardwareTarget]:
    """Checks everything that can be checked before any engine starts. `region`: where the trials
    will run (a pool's region); None: the hardware target's own (this machine's for local ones)."""
    try:
        slo = parse_slo(spec.slo)
    except SLOParseError as exc:
        raise JobSpecError("slo", str(exc)) from None
    validate_budget(spec.budget_trials)
    if not spec.peak_rps > 0 or not math.isfinite(spec.peak_rps):
        raise JobSpecError("peak_rps", "the peak request rate must be a positive number")
    if spec.peak_rps > MAX_PEAK_RPS:
        raise JobSpecError("peak_rps", f"the peak request rate must be at most {MAX_PEAK_RPS:g} req/s")
    if not 1.0 <= spec.headroom <= 10.0:
        raise JobSpecError("headroom", "the headroom factor must be between 1 and 10")
    if not (math.isfinite(spec.duration_s) and 5 <= spec.duration_s <= 3600):
        raise JobSpecError("duration_s", "the load per level must last 5 to 3600 seconds")
    validate_capacity_steps(spec.capacity_steps)
    top = spec.target_rps * max((1.0, *spec.capacity_steps)) * spec.duration_s
    if top > MAX_REQUESTS_PER_LEVEL:
        raise JobSpecError(
            "peak_rps",
            f"rate x headroom x the highest capacity step x duration asks for {top:,.0f} requests in one "
            f"load level; the limit is {MAX_REQUESTS_PER_LEVEL:,} (lower the rate or the duration)",
        )
    if not 1 <= spec.repeats <= 10:
        raise JobSpecError("repeats", "use 1 to 10 repeats")
    if spec.confirm_repeats != 0 and not 3 <= spec.confirm_repeats <= MAX_CONFIRM_REPEATS:
        raise JobSpecError(
            "confirm_repeats",
            f"confirmation needs 3 to {MAX_CONFIRM_REPEATS} interleaved rounds for an interval (0 skips it)",
        )
    if not 1 <= spec.finalists <= MAX_FINALISTS:
        raise JobSpecError("finalists", f"confirm 1 to {MAX_FINALISTS} finalists")
    if spec.contention_cores is not None and not (
        math.isfinite(spec.contention_cores) and spec.contention_cores > 0
    ):
        raise JobSpecError("contention_cores", "the contention threshold must be a positive number of cores")
    if spec.strategy not in {"tpe", "grid"}:
        raise JobSpecError("strategy", "choose tpe or grid")
    price = spec.price_per_hour_usd
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise JobSpecError(
            "price_per_hour_usd", "the price per hour must be a number of USD above 0, or 0 for not priced"
        )
    hardware = HARDWARE.get(spec.hardware)
    if hardware is None:
        raise JobSpecError("hardware", f"unknown hardware {spec.hardware!r}; known: {', '.join(HARDWARE)}")
    where = region or hardware.residency()
    if allowed_regions is not None and where not in allowed_regions:
        raise JobSpecError(
            "hardware",
            f"{hardware.name} runs in region {where!r}, outside the organization's allowed regions "
            f"({', '.join(allowed_regions) or 'none'})",
        )
    if spec.load_format is not None and spec.load_format not in LOAD_FORMATS:
        raise JobSpecError(
            "load_format", f"unknown load format {spec.load_format!r}; known: {', '.join(LOAD_FORMATS)}"
        )
    try:
        model = model_info(spec.model_path, require_weights=spec.load_format is None)
    except ModelLoadError as exc:
        raise JobSpecError("model_path", str(exc)) from None
    _validate_caps(spec, model.max_position_embeddings)
    return slo, on_this_host(hardware)


def _validate_caps(spec: JobSpec, model_max_len: int) -> None:
    scale = spec.length_scale
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not MIN_LENGTH_SCALE <= scale <= 1.0:
        raise JobSpecError(
            "length_scale",
            f"the length scale must be a number from {MIN_LENGTH_SCALE:g} to 1 (1: real lengths)",
        )
    for name in ("max_prompt_tokens", "max_output_tokens"):
        value = getattr(spec, name)
        if value is not None and not 1 <= value <= MAX_TOKENS:
            raise JobSpecError(name, f"use 1 to {MAX_TOKENS:,} tokens, or no cap")
    if not 16 <= spec.max_model_len <= model_max_len:
        raise JobSpecError(
            "max_model_len",
            f"the context must be 16 to {model_max_len:,} tokens (the model's max_position_embeddings)",
        )
    prompt, output = spec.max_prompt_tokens, spec.max_output_tokens
    if prompt is not None and output is not None and prompt + output > spec.max_model_len:
        raise JobSpecError(
            "max_model_len",
            f"a {spec.max_prompt_tokens:,}-token prompt and {spec.max_output_tokens:,} output tokens "
            f"do not fit a {spec.max_model_len:,}-token context",
        )


def caps_for(
    *,
    input_p99: float,
    output_p99: float,
    model_max_len: int,
    hardware: HardwareTarget,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    max_model_len: int | None = None,
    length_scale: float = 1.0,
) -> Caps:
    """The job's caps: what the caller gave, else the sample's p99 (times `length_scale`, as
    replayed) bounded by the hardware's replay limit and the model's context (the context from
    the prompt and output caps)."""
    input_p99, output_p99 = input_p99 * length_scale, output_p99 * length_scale
    out_cap = max_output_tokens or max(1, math.ceil(output_p99))
    if max_output_tokens is None and hardware.replay_output_tokens is not None:
        out_cap = min(out_cap, hardware.replay_output_tokens)
    out_cap = min(out_cap, max(1, model_max_len // 2))
    prompt_cap = max_prompt_tokens or max(1, math.ceil(input_p99))
    if max_prompt_tokens is None and hardware.replay_prompt_tokens is not None:
        prompt_cap = min(prompt_cap, hardware.replay_prompt_tokens)
    prompt_cap = min(prompt_cap, model_max_len - out_cap)
    context = max_model_len or min(model_max_len, _round_up(prompt_cap + out_cap, 256))
    return Caps(
        max_prompt_tokens=prompt_cap,
        max_output_tokens=out_cap,
        max_model_len=context,
        length_scale=length_scale,
    )


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


RANKED_FILE = "sim-ranked.json"


def _ranked_key(spec: JobSpec, sim_note: str, calibration: Sequence[Pair]) -> str:
    """What the simulator's ranking depends on: the spec, the simulator's own description (its
    efficiency fit, its host figures) and the calibration pairs."""
    data = {"spec": spec.to_dict(), "sim": sim_note, "calibration": [asdict(p) for p in calibration]}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _ranked(
    work_dir: Path, spec: JobSpec, space: SearchSpace, sim_note: str, calibration: Sequence[Pair]
) -> tuple[dict[str, Any], ...]:
    """The ranking an earlier step of this job stored, when it was made from the same inputs and
    every point is still one of the space's; else () (the caller simulates again)."""
    try:
        kept = json.loads((work_dir / RANKED_FILE).read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(kept, dict) or kept.get("key") != _ranked_key(spec, sim_note, calibration):
        return ()
    points = kept.get("points")
    values = {k.name: k.values for k in space.knobs}
    if not isinstance(points, list) or not all(
        isinstance(p, dict)
        and p.keys() == values.keys()
        and all(v in values[name] for name, v in p.items())
        and not space.violations(p)
        for p in points
    ):
        return ()
    return tuple(points)


def _keep_ranked(
    work_dir: Path,
    spec: JobSpec,
    sim_note: str,
    calibration: Sequence[Pair],
    ranked: tuple[dict[str, Any], ...],
) -> None:
    """Stores the ranking for the job's later steps: simulating the sampled candidates again on
    every step costs CPU time that grows with the trace and the space."""
    path = work_dir / RANKED_FILE
    data = {"key": _ranked_key(spec, sim_note, calibration), "points": list(ranked)}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, default=str))
        tmp.replace(path)
    except (OSError, TypeError, ValueError):
        tmp.unlink(missing_ok=True)


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
    model = model_info(spec.model_path, require_weights=spec.load_format is None)
    space = build_space(
        model=model, hardware=hardware, max_model_len=spec.max_model_len, load_format=spec.load_format
    )
    unknown = set(spec.frozen_knobs) - {k.name for k in space.knobs}
    if unknown:
        raise JobSpecError("frozen_knobs", f"no such knob on {hardware.name}: {', '.join(sorted(unknown))}")
    space = replace(space, knobs=tuple(k for k in space.knobs if k.name not in spec.frozen_knobs))
    work_dir.mkdir(parents=True, exist_ok=True)
    # The workload is synthesised once per load level (the target rate and each capacity step, the
    # same length each, so every level is sustained load, not a burst); later steps of the same
    # job, on other workers too, reuse the files.
    levels = (1.0, *spec.capacity_steps)
    files = {m: work_dir / ("workload.jsonl" if m == 1.0 else f"workload-x{m:g}.jsonl") for m in levels}
    prompts_from: str | None = None  # an OpenAI-style log: the golden set is drawn from its prompts
    why_synthesised = "the job's workload was prepared before golden sets were stored"
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
        if sample.profile.trace_format == "openai":
            prompts_from = spec.trace_path
        why_synthesised = f"the trace the job reads ({sample.profile.trace_format}) holds token counts only"
        for multiple, path in files.items():
            trace = synthesize(
                sample,
                target_rps=spec.target_rps * multiple,
                duration_s=spec.duration_s,
                rng=np.random.default_rng(spec.seed),
            )
            trace = scale_lengths(trace, spec.length_scale)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with tmp.open("wb") as out:
                write_mooncake_jsonl(trace, out)
            tmp.replace(path)
    workload = files[1.0]
    # The golden set: a stratified draw of the customer's own prompts where the sample holds
    # prompt text (kept in the work dir only); otherwise random token ids following the
    # traffic's prompt-length mix (the synthesised workload's lengths, capped as the trials cap
    # them). Fixed at the first plan and read back after, so every trial sees the same prompts.
    with workload.open() as fh:
        workload_lengths = [json.loads(line)["input_length"] for line in fh if line.strip()]
    if spec.max_prompt_tokens is not None:
        workload_lengths = [min(n, spec.max_prompt_tokens) for n in workload_lengths]
    try:
        golden, golden_about = gates.golden_for_job(
            work_dir=work_dir,
            vocab_size=model.vocab_size,
            workload_lengths=workload_lengths,
            seed=spec.seed,
            model_path=spec.model_path,
            trace_path=prompts_from,
            why_synthesised=why_synthesised,
        )
    except TraceError as exc:
        raise JobSpecError("trace", str(exc)) from None
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
        contention_cores=spec.contention_cores,
        capacity_steps=spec.capacity_steps,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_output_tokens=spec.max_output_tokens,
        seed=spec.seed,
        client_processes=hardware.client_processes,
    )
    reference = {**space.baseline(), "dtype": "float32" if hardware.device_kind == "cpu" else "bfloat16"}
    fastest = fastest_dtype(device_kind=hardware.device_kind, checkpoint_dtype=model.checkpoint_dtype)
    competent = {**space.baseline(), "dtype": fastest["dtype"]}
    if space.violations(competent):
        competent = space.baseline()
    caps = caps_effect(
        workload,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_output_tokens=spec.max_output_tokens,
        max_model_len=spec.max_model_len,
        length_scale=spec.length_scale,
    )
    sim, sim_note = prior.sim_prior(spec.model_path, spec.hardware, calibration)
    ranked: tuple[dict[str, Any], ...] = ()
    if sim is not None and spec.strategy == "tpe":
        # Ranked once per job and read back by its later steps (like the golden set).
        ranked = _ranked(work_dir, spec, space, sim_note, calibration)
        if not ranked:
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
            _keep_ranked(work_dir, spec, sim_note, calibration, ranked)
    return Prepared(
        spec=spec,
        slo=slo,
        space=space,
        plan=plan,
        reference=reference,
        defaults=space.baseline(),
        competent=competent,
        competent_why=str(fastest.get("why", "")),
        caps=caps.to_dict(),
        golden=golden_about,
        sim=sim,
        sim_note=sim_note,
        sim_ranked=ranked,
    )


@dataclass(frozen=True)
class TrialRecord:
    number: int
    assignment: dict[str, Any] = field(hash=False)
    result: dict[str, Any] = field(hash=False)  # TrialResult.to_dict() plus the phase keys

    @property
    def phase(self) -> str:
        # Results recorded before phases existed: trial 0 was the reference, the rest the search.
        return str(self.result.get("phase") or (REFERENCE if self.number == 0 else SEARCH))

    @property
    def subject(self) -> str:
        return str(self.result.get("subject") or "")

    @property
    def round(self) -> int:
        return int(self.result.get("round") or 0)


@dataclass(frozen=True)
class PlannedTrial:
    """The next trial a job runs: which configuration, in which phase, measured or not."""

    phase: str
    assignment: dict[str, Any] = field(hash=False)
    subject: str = ""  # confirmation/ablation: the subject the block belongs to
    round: int = 0
    total_rounds: int = 0

    @property
    def measure(self) -> bool:
        # The reference is captured, not measured: it is the gate's yardstick, never a candidate.
        return self.phase != REFERENCE

    def stamp(self) -> dict[str, Any]:
        """The keys stored with the trial's result that say what the trial was for."""
        return {"phase": self.phase, "subject": self.subject, "round": self.round}

    def describe(self) -> str:
        if self.phase == REFERENCE:
            return "reference capture (golden-set answers; not a candidate)"
        if self.phase == SEARCH:
            return "search"
        return f"{self.phase} round {self.round + 1} of {self.total_rounds}: {self.subject}"


class ReferenceFailedError(RuntimeError):
    """The gate's reference could not be captured: candidates cannot be judged."""


def objective(result: Mapping[str, Any], slo: SLOTarget, *, priced: bool = True) -> float | None:
    """What the strategy minimises: cost per million tokens (p95 TTFT in ms on hardware that is
    not priced), or a penalty saying how far off."""
    if result.get("status") != "ok":
        return None
    gates_ok = bool((result.get("correctness") or {}).get("passed")) and bool(
        (result.get("reliability") or {}).get("passed")
    )
    cost = result.get("cost_per_mtok_usd")
    if result.get("slo_met") and gates_ok and priced and cost is not None and cost > 0:
        return float(cost)
    p95 = result.get("ttft_p95_ms")
    if result.get("slo_met") and gates_ok and not priced and p95 is not None and math.isfinite(p95):
        return min(float(p95), PENALTY / 2)  # below every penalty, whatever the SLO's limits
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
    # The competent baseline first (every gain is measured against it), then the simulator's
    # favourite, the naive defaults and the simulator's next favourites.
    ranked = prepared.sim_ranked[:SIM_PRIORS]
    incumbent = (spec.incumbent,) if spec.incumbent else ()
    # The naive defaults only where they run something else than the competent baseline (with
    # no dtype flag vLLM runs the checkpoint's, which may be the host's fastest already).
    naive = (
        ()
        if prepared.space.key(prepared.defaults) == prepared.space.key(prepared.competent)
        else (prepared.defaults,)
    )
    return TPEStrategy(
        seed=spec.seed,
        priors=(*incumbent, prepared.competent, *ranked[:1], *naive, *ranked[1:]),
        n_startup_trials=max(2, spec.budget_trials // 4),
    )


def _usable(record: TrialRecord) -> bool:
    r = record.result
    return r.get("status") == "ok" and not r.get("contended") and r.get("ttft_p50_ms") is not None


def _gates_ok(record: TrialRecord) -> bool:
    r = record.result
    return bool((r.get("correctness") or {}).get("passed")) and bool(
        (r.get("reliability") or {}).get("passed")
    )


def finalists(prepared: Prepared, history: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """The search's best distinct candidates other than the baselines, by measured p50 TTFT:
    those that met the SLO and passed the gates, or, when none met the SLO, those that passed
    the gates."""
    search = [r for r in history if r.phase == SEARCH and _usable(r) and _gates_ok(r)]
    met = [r for r in search if r.result.get("slo_met")]
    pool = met or search
    baselines = {prepared.space.key(prepared.competent), prepared.space.key(prepared.defaults)}
    out: list[dict[str, Any]] = []
    seen = set(baselines)
    for record in sorted(pool, key=lambda r: (float(r.result["ttft_p50_ms"]), r.number)):
        key = prepared.space.key(record.assignment)
        if key not in seen:
            seen.add(key)
            out.append(dict(record.assignment))
        if len(out) >= prepared.spec.finalists:
            break
    return out


def confirmation_subjects(prepared: Prepared, history: Sequence[TrialRecord]) -> dict[str, dict[str, Any]]:
    """subject -> assignment: the competent baseline, the naive defaults (when they differ) and
    the finalists. Empty when there is nothing to confirm."""
    chosen = finalists(prepared, history)
    if not chosen or prepared.spec.confirm_repeats == 0:
        return {}
    subjects = {confirm.COMPETENT: dict(prepared.competent)}
    if prepared.space.key(prepared.defaults) != prepared.space.key(prepared.competent):
        subjects[confirm.NAIVE] = dict(prepared.defaults)
    for i, assignment in enumerate(chosen, 1):
        subjects[f"finalist-{i}"] = assignment
    return subjects


def _interleaved(subjects: Sequence[str], rounds: int) -> list[tuple[str, int]]:
    """ABC, BCA, CAB, ...: each subject takes every position in turn, so drift over the run
    (a warming machine, a neighbour starting) lands on all of them alike."""
    n = len(subjects)
    return [(subjects[(r + i) % n], r) for r in range(rounds) for i in range(n)]


def _rounds_plan(subjects: Sequence[str], rounds: int, done: Sequence[TrialRecord]) -> list[tuple[str, int]]:
    """The interleaved plan, plus one extra round for each subject with a contended block (a
    block measured while something else loaded the host is not evidence)."""
    plan = _interleaved(subjects, rounds)
    contended = sorted({r.subject for r in done if r.result.get("contended") and r.round < rounds})
    plan += [(s, rounds) for s in subjects if s in contended]
    return plan


def ablation_subjects(prepared: Prepared, winner: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """ "without KNOB" -> the winner with that knob reverted to the competent baseline's value,
    for each knob the winner changed (none when it changed only one: reverting it gives the
    baseline itself, measured already)."""
    changed = _changed(prepared, winner)
    if len(changed) < 2:
        return {}
    return {f"without {k}": {**winner, k: prepared.competent.get(k)} for k in changed}


def _changed(prepared: Prepared, assignment: Mapping[str, Any]) -> list[str]:
    """The knobs where `assignment` runs something other than the competent baseline."""
    mine, base = dict(prepared.space.key(assignment)), dict(prepared.space.key(prepared.competent))
    return [k.name for k in prepared.space.knobs if mine.get(k.name) != base.get(k.name)]


def next_trial(
    prepared: Prepared, history: Sequence[TrialRecord], *, strategy: Strategy | None = None
) -> PlannedTrial | None:
    """The job's next trial, or None when it is complete. Raises ReferenceFailedError when the
    reference could not be captured in REFERENCE_ATTEMPTS fresh engines."""
    refs = [r for r in history if r.phase == REFERENCE]
    if reference_capture(history) is None:
        if len(refs) >= REFERENCE_ATTEMPTS:
            last = refs[-1].result.get("error") or "no golden-set answers were captured"
            raise ReferenceFailedError(
                f"the reference configuration ({describe(prepared.reference)}) did not start in "
                f"{len(refs)} attempts on fresh engines: {last}"
            )
        return PlannedTrial(REFERENCE, dict(prepared.reference))
    search = [r for r in history if r.phase == SEARCH]
    if len(search) < prepared.spec.budget_trials:
        observations = [
            Observation(r.assignment, objective(r.result, prepared.slo, priced=prepared.plan.priced))
            for r in search
        ]
        proposed = (strategy or strategy_for(prepared)).propose(prepared.space, observations)
        if proposed is not None:
            return PlannedTrial(SEARCH, proposed)
    rounds = prepared.spec.confirm_repeats
    subjects = confirmation_subjects(prepared, history)
    if subjects:
        done = [r for r in history if r.phase == CONFIRM]
        taken = {(r.subject, r.round) for r in done}
        for subject, round_ in _rounds_plan(list(subjects), rounds, done):
            if (subject, round_) not in taken:
                return PlannedTrial(CONFIRM, subjects[subject], subject, round_, rounds)
        verdict = confirmation(prepared, history)
        if verdict is not None and verdict["outcome"] == "gain":
            variants = ablation_subjects(prepared, subjects[verdict["winner_subject"]])
            done = [r for r in history if r.phase == ABLATION]
            taken = {(r.subject, r.round) for r in done}
            for subject, round_ in _rounds_plan(list(variants), rounds, done):
                if (subject, round_) not in taken:
                    return PlannedTrial(ABLATION, variants[subject], subject, round_, rounds)
    return None


def next_trials(
    prepared: Prepared, history: Sequence[TrialRecord], *, slots: int = 1, strategy: Strategy | None = None
) -> list[PlannedTrial]:
    """The trials to measure at once on `slots` engine hosts: a batch of search candidates (up to
    the budget left), else the single next trial. Only the search runs in batches: the reference
    comes before everything, and confirmation and ablation are interleaved rounds compared with
    each other, which must not be spread over different hosts at once."""
    planned = next_trial(prepared, history, strategy=strategy)
    if planned is None or planned.phase != SEARCH or slots <= 1:
        return [] if planned is None else [planned]
    searched = [r for r in history if r.phase == SEARCH]
    size = min(slots, prepared.spec.budget_trials - len(searched))
    observations = [
        Observation(r.assignment, objective(r.result, prepared.slo, priced=prepared.plan.priced))
        for r in searched
    ]
    batch = propose_batch(strategy or strategy_for(prepared), prepared.space, observations, size)
    return [PlannedTrial(SEARCH, a) for a in batch] or [planned]


def next_assignment(
    prepared: Prepared, history: Sequence[TrialRecord], *, strategy: Strategy | None = None
) -> dict[str, Any] | None:
    planned = next_trial(prepared, history, strategy=strategy)
    return None if planned is None else planned.assignment


def reference_capture(history: Sequence[TrialRecord]) -> gates.Capture | None:
    for record in history:
        if record.phase == REFERENCE and record.result.get("capture"):
            return gates.Capture.from_dict(record.result["capture"])
    return None


def _blocks(records: Sequence[TrialRecord]) -> list[confirm.Block | tuple[str, str]]:
    out: list[confirm.Block | tuple[str, str]] = []
    for r in records:
        block = confirm.block_from_result(r.subject, r.round, r.number, r.result)
        if block is None:
            out.append((r.subject, f"trial {r.number}: {r.result.get('error') or 'no measurement'}"))
        else:
            out.append(block)
    return out


def confirmation(prepared: Prepared, history: Sequence[TrialRecord]) -> dict[str, Any] | None:
    """The confirmation's figures, ratios and verdict (and the ablation, once measured); None
    when the job has no confirmation (nothing to confirm, or confirmation off)."""
    subjects = confirmation_subjects(prepared, history)
    if not subjects:
        return None
    rounds = prepared.spec.confirm_repeats
    records = [r for r in history if r.phase == CONFIRM]
    plan = _rounds_plan(list(subjects), rounds, records)
    complete = {(r.subject, r.round) for r in records} >= set(plan)
    results = confirm.evaluate(_blocks(records), subjects, seed=prepared.spec.seed)
    names = [s for s in subjects if s.startswith("finalist-")]
    verdict = confirm.decide(results, names) if complete else None
    out: dict[str, Any] = {
        "complete": complete,
        "rounds": rounds,
        "blocks_planned": len(plan),
        "blocks_done": len(records),
        "competent_why": prepared.competent_why,
        "subjects": {k: v.to_dict() for k, v in results.items()},
        "outcome": verdict.outcome if verdict else "pending",
        "winner_subject": verdict.winner if verdict else None,
        "line": verdict.line if verdict else f"Confirming: {len(records)} of {len(plan)} blocks measured.",
    }
    if verdict is not None:
        winner_trials = results[verdict.winner].trials
        out["winner_trial"] = winner_trials[0] if winner_trials else None
        if verdict.outcome == "gain":
            out["ablation"] = _ablation(prepared, history, subjects[verdict.winner], results[verdict.winner])
    return out


def _ablation(
    prepared: Prepared,
    history: Sequence[TrialRecord],
    winner: Mapping[str, Any],
    winner_result: confirm.SubjectResult,
) -> dict[str, Any]:
    variants = ablation_subjects(prepared, winner)
    changed = _changed(prepared, winner)
    if not variants:
        knob = changed
        return {
            "knobs": knob,
            "note": "one knob changed: reverting it gives the competent baseline, so it carries the whole gain",
            "shares": {k: {"share_of_gain": 1.0} for k in knob},
        }
    records = [r for r in history if r.phase == ABLATION]
    measured = confirm.evaluate(
        [
            *_blocks([r for r in history if r.phase == CONFIRM and r.subject == confirm.COMPETENT]),
            *_blocks(records),
        ],
        {confirm.COMPETENT: dict(prepared.competent), **variants},
        seed=prepared.spec.seed + 1,
    )
    reverted = {name[len("without ") :]: m.vs_competent for name, m in measured.items() if m.vs_competent}
    done = len(reverted) == len(variants)
    return {
        "knobs": changed,
        "note": (
            "each changed knob reverted alone to the competent baseline's value, re-measured in "
            "interleaved rounds after the confirmation; share_of_gain is the part of the winner's "
            "p50 TTFT gain lost without it"
        ),
        "complete": done,
        "shares": confirm.ablation_shares(winner_result.vs_competent or {}, reverted) if done else {},
    }


def candidates(prepared: Prepared, history: Sequence[TrialRecord]) -> list[Candidate]:
    """The search's trials as candidates (the reference and the confirmation blocks are not)."""
    out = []
    for record in history:
        if record.phase != SEARCH:
            continue
        r = record.result
        correctness = r.get("correctness") or {}
        reliability = r.get("reliability") or {}
        ci = r.get("ttft_p95_ci_ms") or [math.nan, math.nan]
        error = r.get("error") if r.get("status") != "ok" else None
        if error is None and r.get("contended"):
            load = (r.get("foreign_load") or {}).get("foreign_cores")
            gpu_pids = (r.get("gpu_load") or {}).get("foreign_pids") or []
            error = (
                f"contended: other processes ran on the GPU while it measured (pids {gpu_pids})"
                if gpu_pids
                else f"contended: other processes kept {load} cores busy while it measured"
            )
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
                error=error,
            )
        )
    return out


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def summarize_job(
    prepared: Prepared, history: Sequence[TrialRecord], confirmed: dict[str, Any] | None = None
) -> Selection:
    """The search's selection, overruled by the confirmation's verdict once it is complete."""
    selection = select(candidates(prepared, history), priced=prepared.plan.priced)
    if confirmed is None:
        confirmed = confirmation(prepared, history)
    if confirmed is None:
        note = (
            "Unconfirmed: the search's single measurements, no interval"
            if prepared.spec.confirm_repeats == 0
            else "Nothing to confirm: no candidate beyond the baselines passed the gates"
        )
        return replace(selection, outcome="unconfirmed", summary=f"{selection.summary} ({note}.)")
    if not confirmed["complete"]:
        return replace(selection, outcome="pending", summary=confirmed["line"])
    winner = confirmed.get("winner_trial")
    reasons = dict(selection.reasons)
    if winner is not None:
        reasons[winner] = "winner after confirmation: " + confirmed["line"]
    return replace(
        selection,
        winner=winner,
        tie=False,
        outcome=confirmed["outcome"],
        summary=confirmed["line"],
        reasons=reasons,
    )


def report(prepared: Prepared, history: Sequence[TrialRecord]) -> dict[str, Any]:
    confirmed = confirmation(prepared, history)
    selection = summarize_job(prepared, history, confirmed)
    return {
        "spec": prepared.spec.to_dict(),
        "slo": str(prepared.slo),
        "target_rps": prepared.spec.target_rps,
        "space": prepared.space.to_dict(),
        "caps": prepared.caps,
        "golden_set": prepared.golden,
        "baselines": {
            "competent": prepared.competent,
            "competent_why": prepared.competent_why,
            "naive": prepared.defaults,
            "reference": prepared.reference,
        },
        "trials": [
            {
                "number": r.number,
                "phase": r.phase,
                "subject": r.subject,
                "assignment": r.assignment,
                "label": describe(r.assignment),
                "result": {k: v for k, v in r.result.items() if k != "capture"},
            }
            for r in history
        ],
        "selection": selection.to_dict(),
        "confirmation": confirmed,
        "exports": _exports(prepared, history, confirmed, selection),
        "simulator": {
            "note": prepared.sim_note,
            "calibrated_from_trials": prepared.sim.num_pairs if prepared.sim else 0,
            "prior_candidates": [describe(a) for a in prepared.sim_ranked[:SIM_PRIORS]],
            "errors": prior.prediction_errors(r.result for r in history if r.phase != REFERENCE),
        },
    }


def _exports(
    prepared: Prepared,
    history: Sequence[TrialRecord],
    confirmed: Mapping[str, Any] | None,
    selection: Selection,
) -> dict[str, Any]:
    """The configuration the job recommends, in the forms a user runs: a confirmed winner; else
    the competent baseline once confirmation found no significant gain; else (unconfirmed or
    still confirming) the search's current pick, labelled so."""
    outcome = (confirmed or {}).get("outcome")
    if outcome == "gain":
        subject = confirmed["subjects"][confirmed["winner_subject"]] if confirmed else {}
        assignment, label = subject.get("assignment") or prepared.competent, "confirmed winner"
    elif outcome == "no_significant_gain":
        assignment, label = prepared.competent, "the competent baseline (no significant gain to deploy)"
    elif selection.winner is not None:
        assignment = next(r.assignment for r in history if r.number == selection.winner)
        label = "the search's pick, not yet confirmed"
    else:
        assignment, label = prepared.competent, "the competent baseline (nothing better measured yet)"
    return export.exports(
        spec=prepared.spec.to_dict(),
        config=prepared.space.to_config(assignment),
        label=label,
        gpu=prepared.space.hardware.device_kind != "cpu",
    )


class TrialExecutor(Protocol):
    """Where a job's trials run: this machine (the default) or a pool's engine hosts."""

    def capacity(self) -> int:
        """How many trials it can measure at once now (at least 1)."""

    def run_batch(
        self,
        prepared: Prepared,
        history: Sequence[TrialRecord],
        batch: Sequence[tuple[int, PlannedTrial]],
        work_dir: Path,
    ) -> list[dict[str, Any]]:
        """Measure the (number, trial) pairs, at once where it can; their results as stored,
        in the batch's order."""


class LocalExecutor:
    """This machine: one trial after another."""

    def capacity(self) -> int:
        return 1

    def run_batch(
        self,
        prepared: Prepared,
        history: Sequence[TrialRecord],
        batch: Sequence[tuple[int, PlannedTrial]],
        work_dir: Path,
    ) -> list[dict[str, Any]]:
        return [
            execute(prepared, planned, history, work_dir / f"trial-{number}", holder=f"trial {number}")
            for number, planned in batch
        ]


def run_trials(
    prepared: Prepared,
    history: list[TrialRecord],
    work_dir: Path,
    *,
    strategy: Strategy | None = None,
    log: Callable[[str], None] | None = None,
    on_trial: Callable[[list[TrialRecord]], None] | None = None,
    executor: TrialExecutor | None = None,
) -> list[TrialRecord]:
    """Runs trials until the job is complete (the CLI and benchmarks): on this machine, or on
    `executor`'s hosts, a batch of search trials at once where it has several free.

    `on_trial` is called after each trial is recorded (to persist); `strategy` overrides the
    job's search. A batch is recorded in trial-number order whichever trial finished first, so
    the history (and every later proposal) does not depend on which host was faster.
    Raises ReferenceFailedError when the gate's reference cannot be captured.
    """
    runner = executor or LocalExecutor()
    while batch := next_trials(prepared, history, slots=runner.capacity(), strategy=strategy):
        numbered = [(len(history) + i, planned) for i, planned in enumerate(batch)]
        if log:
            for number, planned in numbered:
                change = prepared.space.change_type(planned.assignment, prepared.reference)
                log(f"trial {number} [{planned.describe()}]: {describe(planned.assignment)} [{change}]")
        results = runner.run_batch(prepared, history, numbered, work_dir)
        for (number, planned), result in zip(numbered, results, strict=True):
            history.append(TrialRecord(number=number, assignment=planned.assignment, result=result))
            if on_trial:
                on_trial(history)
            if log:
                log(f"  trial {number}: {outcome_line(result)}")
    return history


def execute(
    prepared: Prepared,
    planned: PlannedTrial,
    history: Sequence[TrialRecord],
    work_dir: Path,
    *,
    holder: str,
    on_host_wait: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run one planned trial; its result as stored (measurement, forecast and phase keys)."""
    reference = reference_capture(history)
    if planned.measure and reference is None:
        # By construction never reached (next_trial captures the reference first); a candidate is
        # never judged against itself.
        raise ReferenceFailedError("no reference capture to judge candidates against")
    result = run_trial(
        prepared.plan,
        prepared.space.to_config(planned.assignment),
        change_type=prepared.space.change_type(planned.assignment, prepared.reference),
        reference=reference,
        work_dir=work_dir,
        measure=planned.measure,
        holder=holder,
        on_host_wait=on_host_wait,
    )
    data = with_prediction(prepared, planned.assignment, result) if planned.measure else result.to_dict()
    return {**data, **planned.stamp()}


def outcome_line(result: Mapping[str, Any]) -> str:
    """One log line about a stored trial result."""
    if result.get("status") != "ok":
        return f"failed: {result.get('error')}"
    if result.get("phase") == REFERENCE:
        return "reference captured"
    load = (result.get("foreign_load") or {}).get("foreign_cores")
    return (
        f"p50 TTFT {_num(result.get('ttft_p50_ms')):,.0f} ms, p95 {_num(result.get('ttft_p95_ms')):,.0f} ms, "
        f"SLO {'met' if result.get('slo_met') else 'missed'}, "
        f"gates {'passed' if _gates_ok(TrialRecord(0, {}, dict(result))) else 'failed'}, "
        f"sustains {result.get('sustainable_multiple')}x, foreign load {load} cores"
        + _gpu_part(result.get("gpu_load"))
        + (" (CONTENDED: excluded)" if result.get("contended") else "")
    )


def _gpu_part(gpu: Mapping[str, Any] | None) -> str:
    if not gpu:
        return ""
    util = gpu.get("util_mean_pct")
    part = f", GPU {util:.0f}% busy" if util is not None else ", GPU"
    foreign = gpu.get("foreign_pids") or []
    return part + (f", foreign GPU processes {foreign}" if foreign else "")


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
