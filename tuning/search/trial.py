"""One live trial: start the engine with a candidate, gate it, replay the traffic, measure, stop.

The engine is stopped whatever happens (the launcher's process group and watchdog make sure of
it even when this process is killed).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.config import EngineConfig
from serving.engine.host import ForeignLoadMeter, GpuMeter, HostBusyError, hold_host
from serving.engine.launcher import EngineLaunchError, EngineProcess, start_engine
from serving.engine.watchdog import start_ticks
from serving.loadgen.api import replay_generated, replay_trace
from serving.loadgen.results import ReplayResult, json_finite
from serving.metrics import scrape, snapshot_delta
from tuning.search import gates
from tuning.search.slo import SLOTarget

MAX_WARMUP_REQUESTS = 10_000
WARMUP_SEED_OFFSET = 1_000_003  # the warm-up's prompts are never a measured repeat's


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial needs besides the configuration; the same for every trial of a job."""

    model_path: str
    workload_trace: str  # the customer's traffic synthesised at the target rate (Mooncake JSONL)
    target_rps: float
    slo: SLOTarget
    price_per_hour_usd: float  # 0: not priced (no cost per token is computed)
    golden: gates.GoldenSet
    repeats: int = 2  # replays at the target rate (noise estimate)
    capacity_steps: tuple[float, ...] = (1.5, 2.0)  # further load multiples tried while the SLO holds
    # (multiple, trace) pairs: the traffic synthesised at each capacity step for the same length;
    # a step without one compresses the target-rate trace instead (a burst, not sustained load).
    capacity_traces: tuple[tuple[float, str], ...] = ()
    max_requests: int | None = None
    max_prompt_tokens: int | None = None  # cap on synthesised prompt length (CPU engines)
    max_output_tokens: int | None = None
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    thresholds: gates.Thresholds = field(default_factory=gates.Thresholds)
    limits: gates.ReliabilityLimits = field(default_factory=gates.ReliabilityLimits)
    engine_command: tuple[str, ...] | None = None
    seed: int = 0
    # Foreign CPU load (cores) above which a trial is marked contended; None: record only.
    contention_cores: float | None = 0.3
    host_wait_s: float = 6 * 3600.0  # longest wait for the engine host (another measurement holds it)
    # Load-generator processes (each its own event loop): one on a small CPU host, where more
    # would take cores from the engine; several on a GPU host, where one loop cannot keep up
    # with thousands of streamed tokens a second and would add its own delay to every TTFT.
    client_processes: int = 1
    # Requests of the workload replayed, at the target rate and discarded, before anything is
    # measured, as benchmark clients can (vLLM's has --num-warmups): the engine meets the
    # traffic's prompt lengths and batch shapes once before the repeats that count. Off by
    # default: on the 2-core CPU host it made no significant difference
    # (benchmarks/results/engine_noise_warmup.json: fresh engines with and without 32 warm-up
    # requests, alternating) and it lengthens every trial. For engines that set up work per new
    # shape outside their warm-up (compiled or graph-captured GPU engines), measure it there.
    warmup_requests: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_requests <= MAX_WARMUP_REQUESTS:
            raise ValueError(
                f"warmup_requests must be in [0, {MAX_WARMUP_REQUESTS}], got {self.warmup_requests}"
            )

    @property
    def priced(self) -> bool:
        """Whether trials have a cost: only a positive price makes one (0 is "not priced")."""
        return self.price_per_hour_usd > 0


@dataclass(frozen=True)
class LoadPoint:
    rate_multiple: float  # of the target rate
    repeat: int
    num_requests: int
    num_errors: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tokens_per_s: float  # prompt + output tokens served per second
    slo_met: bool
    violations: tuple[str, ...]
    send_lateness_p99_ms: float


@dataclass(frozen=True)
class TrialResult:
    config: dict[str, Any]
    status: str  # "ok" or "failed"
    error: str | None
    load: tuple[LoadPoint, ...]
    ttft_p50_ms: float  # pooled over the repeats at the target rate
    ttft_p95_ms: float
    ttft_p95_ci_ms: tuple[float, float]  # bootstrap 95% interval of the pooled p95
    tpot_p50_ms: float
    slo_met: bool
    slo_violations: tuple[str, ...]
    sustainable_multiple: float  # highest load multiple that met the SLO (0 when none)
    cost_per_mtok_usd: float | None
    correctness: dict[str, Any] | None
    reliability: dict[str, Any] | None
    capture: dict[str, Any] | None = field(repr=False)  # the golden-set answers (reference trial)
    prefix_cache_hit_rate: float | None = None
    preemptions: float | None = None
    duration_s: float = 0.0
    log_tail: tuple[str, ...] = field(default=(), repr=False)
    # The pooled target-rate TTFTs at evenly spaced quantiles 0..1 (all of them, sorted, when
    # there are at most TTFT_SAMPLE_POINTS): enough to draw the CDF in the job report. Empty in
    # results recorded before it existed.
    ttft_sample_ms: tuple[float, ...] = field(default=(), repr=False)
    # The correctness thresholds this trial was held to (`gates.Thresholds`), for the report.
    gate_thresholds: dict[str, float] | None = None
    # The host while it measured: CPU used by other processes (`LoadSample.to_dict()`), and
    # whether that exceeded the plan's threshold (then the trial is not evidence).
    foreign_load: dict[str, Any] | None = None
    contended: bool = False
    # GPU hosts: utilisation and memory while it measured, and other processes on the GPUs
    # (a foreign compute process makes the trial contended). None on a host without GPUs.
    gpu_load: dict[str, Any] | None = None
    # The engine's own view of the target-rate replays (its /metrics histograms, interpolated
    # within vLLM's buckets): TTFT from request arrival to first token inside the server, and
    # queueing. Beside the client's TTFT it shows what the load generator itself adds.
    engine_ttft_p50_ms: float | None = None
    engine_ttft_p95_ms: float | None = None
    engine_queue_p95_ms: float | None = None
    # Where TTFT went, as means: the client's own, and the engine's split of its part into
    # waiting to be scheduled (queue) and scheduled to first token (prefill); the client's mean
    # minus the engine's is what happens outside the engine loop (HTTP, tokenizer, the client).
    ttft_mean_ms: float | None = None
    engine_ttft_mean_ms: float | None = None
    engine_queue_mean_ms: float | None = None
    engine_prefill_mean_ms: float | None = None
    host_wait_s: float = 0.0  # queued behind another measurement of the same host
    host_waited_for: str = ""
    # The discarded warm-up replay before the measurement: requests sent and their p50 TTFT.
    warmup: dict[str, Any] | None = None

    @property
    def gates_passed(self) -> bool:
        return bool(
            self.correctness
            and self.correctness["passed"]
            and self.reliability
            and self.reliability["passed"]
        )

    def to_dict(self) -> dict[str, Any]:
        return json_finite(asdict(self))


TTFT_SAMPLE_POINTS = 500


def ttft_sample(values: Sequence[float], points: int = TTFT_SAMPLE_POINTS) -> tuple[float, ...]:
    """At most `points` sorted TTFTs: the values themselves, or their quantiles at i/(points-1).

    Either way the i-th of n values sits at cumulative share i/(n-1) (numpy's linear method), so a
    chart draws both the same way.
    """
    if len(values) <= points:
        return tuple(sorted(float(v) for v in values))
    return tuple(
        float(v) for v in np.quantile(np.asarray(values, dtype=np.float64), np.linspace(0, 1, points))
    )


def _bootstrap_p95(
    values: Sequence[float], rng: np.random.Generator, rounds: int = 400
) -> tuple[float, float]:
    if len(values) < 5:
        return (math.nan, math.nan)
    arr = np.asarray(values)
    samples = rng.choice(arr, size=(rounds, arr.size), replace=True)
    p95 = np.percentile(samples, 95, axis=1)
    low, high = np.percentile(p95, [2.5, 97.5])
    return (float(low), float(high))


def _point(result: ReplayResult, multiple: float, repeat: int, slo: SLOTarget) -> LoadPoint:
    s = result.summary
    violations = tuple(slo.violations(s))
    if s.num_errors:
        violations += (f"{s.num_errors} request errors",)
    return LoadPoint(
        rate_multiple=multiple,
        repeat=repeat,
        num_requests=s.num_requests,
        num_errors=s.num_errors,
        ttft_p50_ms=s.ttft_ms.p50,
        ttft_p95_ms=s.ttft_ms.p95,
        tpot_p50_ms=s.tpot_ms.p50,
        tokens_per_s=s.input_throughput_tps + s.output_throughput_tps,
        slo_met=not violations,
        violations=violations,
        send_lateness_p99_ms=s.send_lateness_ms.p99,
    )


def _failed(config: EngineConfig, error: str, started: float, log_tail: Sequence[str] = ()) -> TrialResult:
    return TrialResult(
        config=config.to_mapping(),
        status="failed",
        error=error,
        load=(),
        ttft_p50_ms=math.nan,
        ttft_p95_ms=math.nan,
        ttft_p95_ci_ms=(math.nan, math.nan),
        tpot_p50_ms=math.nan,
        slo_met=False,
        slo_violations=(),
        sustainable_multiple=0.0,
        cost_per_mtok_usd=None,
        correctness=None,
        reliability=None,
        capture=None,
        duration_s=time.monotonic() - started,
        log_tail=tuple(log_tail),
    )


def run_trial(
    plan: TrialPlan,
    config: EngineConfig,
    *,
    change_type: str,
    reference: gates.Capture | None,
    work_dir: Path,
    measure: bool = True,
    holder: str = "a trial",
    on_host_wait: Callable[[str], None] | None = None,
) -> TrialResult:
    """Measure one configuration against the reference's golden-set answers, holding the engine
    host for the whole trial.

    `measure=False` captures the golden-set answers only (the reference itself: no load, no
    verdict). A measured trial needs a reference: a candidate is never judged against itself.
    """
    if measure and reference is None:
        raise ValueError("a measured trial needs the reference's capture to judge its correctness")
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        with hold_host(holder=holder, wait_s=plan.host_wait_s, on_wait=on_host_wait) as hold:
            result = _run_held(plan, config, change_type, reference, work_dir, measure, started)
    except HostBusyError as exc:
        return _failed(config, str(exc), started)
    return replace(result, host_wait_s=round(hold.waited_s, 3), host_waited_for=hold.waited_for)


def _run_held(
    plan: TrialPlan,
    config: EngineConfig,
    change_type: str,
    reference: gates.Capture | None,
    work_dir: Path,
    measure: bool,
    started: float,
) -> TrialResult:
    try:
        engine = start_engine(
            model=plan.model_path,
            config=config,
            startup_timeout_s=plan.startup_timeout_s,
            command=list(plan.engine_command) if plan.engine_command else None,
            log_path=work_dir / "engine.log",
        )
    except EngineLaunchError as exc:
        return _failed(config, f"engine did not start: {exc}", started, getattr(exc, "log_tail", ()) or ())
    rng = np.random.default_rng(plan.seed)
    meters: list[GpuMeter] = []
    try:
        url = engine.base_url
        warm_up(url, seed=plan.seed)
        answers = gates.capture(url, _served_name(url), plan.golden)
        if not measure or reference is None:
            return _captured(config, answers, started)
        verdict = gates.compare(reference, answers, change_type=change_type, thresholds=plan.thresholds)
        warm = _warm_replay(plan, url)
        _require_alive(engine)
        meter = ForeignLoadMeter().start()
        gpu_meter = GpuMeter().start()
        meters.append(gpu_meter)
        before = scrape(url)
        points: list[LoadPoint] = []
        ttfts: list[float] = []
        for repeat in range(plan.repeats):
            result = _replay(plan, url, 1.0, repeat)
            _require_alive(engine)
            points.append(_point(result, 1.0, repeat, plan.slo))
            ttfts += [r.ttft_ms for r in result.requests if r.ok and r.ttft_ms is not None]
        at_target = [p for p in points if p.rate_multiple == 1.0]
        engine_view = snapshot_delta(before, scrape(url))
        pooled_p50 = float(np.percentile(ttfts, 50)) if ttfts else math.nan
        pooled_p95 = float(np.percentile(ttfts, 95)) if ttfts else math.nan
        violations = []
        for objective in plan.slo.objectives:
            if objective.metric == "ttft":
                value = float(np.percentile(ttfts, objective.percentile)) if ttfts else math.nan
            else:
                value = float(
                    np.mean([getattr(p, f"{objective.metric}_p50_ms", math.nan) for p in at_target])
                )
            if math.isnan(value) or value > objective.limit_ms:
                violations.append(f"{objective.name} {value:,.0f} > {objective.limit_ms:,.0f}")
        errors = sum(p.num_errors for p in at_target)
        if errors:
            violations.append(f"{errors} request errors")
        slo_met = not violations
        sustainable = 1.0 if slo_met else 0.0
        best_tps = float(np.mean([p.tokens_per_s for p in at_target])) if slo_met else math.nan
        if slo_met:
            for step, multiple in enumerate(plan.capacity_steps):
                # Prompts of their own (seed past the repeats'): a step replaying prompts the
                # engine has just seen would measure its prefix cache, not its capacity.
                replayed = _replay(plan, url, multiple, plan.repeats + step)
                _require_alive(engine)
                point = _point(replayed, multiple, 0, plan.slo)
                points.append(point)
                if not point.slo_met:
                    break
                sustainable, best_tps = multiple, point.tokens_per_s
        after = scrape(url)
        load = meter.stop()
        gpu = gpu_meter.stop()
        contended = plan.contention_cores is not None and (
            load.disturbance_cores > plan.contention_cores or (gpu is not None and gpu.contended)
        )
        delta = snapshot_delta(before, after)
        survived = engine.alive() and engine.healthy()
        rel = gates.reliability(
            num_requests=sum(p.num_requests for p in points),
            num_errors=sum(p.num_errors for p in points),
            engine_survived=survived,
            preemptions=delta.preemptions,
            p50_ttft_by_repeat=[p.ttft_p50_ms for p in at_target],
            limits=plan.limits,
        )
        cost = (
            plan.price_per_hour_usd / (best_tps * 3600) * 1e6
            if plan.priced and slo_met and best_tps > 0
            else None
        )
        return TrialResult(
            config=config.to_mapping(),
            status="ok",
            error=None,
            load=tuple(points),
            ttft_p50_ms=pooled_p50,
            ttft_p95_ms=pooled_p95,
            ttft_p95_ci_ms=_bootstrap_p95(ttfts, rng),
            tpot_p50_ms=float(np.nanmean([p.tpot_p50_ms for p in at_target])) if at_target else math.nan,
            slo_met=slo_met,
            slo_violations=tuple(violations),
            sustainable_multiple=sustainable,
            cost_per_mtok_usd=cost,
            correctness=verdict.to_dict(),
            reliability=rel.to_dict(),
            capture=None,
            prefix_cache_hit_rate=None
            if math.isnan(delta.prefix_cache_hit_rate)
            else delta.prefix_cache_hit_rate,
            preemptions=delta.preemptions,
            duration_s=time.monotonic() - started,
            ttft_sample_ms=ttft_sample(ttfts),
            gate_thresholds=asdict(plan.thresholds),
            foreign_load=load.to_dict(),
            contended=contended,
            gpu_load=gpu.to_dict() if gpu is not None else None,
            engine_ttft_p50_ms=_finite(engine_view.ttft_p50_ms),
            engine_ttft_p95_ms=_finite(engine_view.ttft_p95_ms),
            engine_queue_p95_ms=_finite(engine_view.queue_p95_ms),
            ttft_mean_ms=float(np.mean(ttfts)) if ttfts else None,
            engine_ttft_mean_ms=_finite(engine_view.ttft_mean_ms),
            engine_queue_mean_ms=_finite(engine_view.queue_mean_ms),
            engine_prefill_mean_ms=_finite(engine_view.prefill_mean_ms),
            warmup=warm,
        )
    except EngineDiedError as exc:
        return _failed(config, str(exc), started, engine.log_tail(20))
    except Exception as exc:
        # A request or scrape that failed because the engine had just died says so, not the
        # client's connection error.
        died = _death(engine, wait_s=2.0)
        error = f"{died} ({type(exc).__name__}: {exc})" if died else f"{type(exc).__name__}: {exc}"
        return _failed(config, error, started, engine.log_tail(20))
    finally:
        for gpu_meter in meters:
            gpu_meter.close()
        engine.stop()


class EngineDiedError(RuntimeError):
    """The engine process ended while the trial used it (crash, out of memory, killed)."""


def _engine_gone(engine: EngineProcess) -> bool:
    """Whether the engine's own process has ended (a zombie counts: its watchdog has yet to reap
    it). Its watchdog outlives it for a while, cleaning up the engine's process group, so the
    watchdog being alive says nothing."""
    try:
        stat = Path(f"/proc/{engine.engine_pid}/stat").read_text()
    except OSError:
        return True
    state = stat[stat.rfind(")") + 2 :].split()[:1]
    return state in (["Z"], ["X"]) or start_ticks(engine.engine_pid) != engine.engine_start_ticks


def _death(engine: EngineProcess, *, wait_s: float = 0.0) -> str:
    """Why the engine is gone ('' while it runs). Its watchdog exits with the engine's status
    (a signal's death as 256 - signal number, as sys.exit gives it) once it has cleaned up; a
    request that failed may have seen the death a moment before /proc does, hence the wait."""
    deadline = time.monotonic() + wait_s
    while not _engine_gone(engine):
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.1)
    code = engine.stop(timeout_s=60.0)
    if code is None:
        cause = "exit status unknown"
    else:
        number = -code if code < 0 else 256 - code if code > 128 else 0
        try:
            cause = f"killed by signal {number} ({signal.Signals(number).name})" if number else ""
        except ValueError:
            cause = ""
        cause = cause or f"exit status {code}"
    return f"the engine process (pid {engine.engine_pid}) died while the trial measured: {cause}"


def _require_alive(engine: EngineProcess) -> None:
    died = _death(engine)
    if died:
        raise EngineDiedError(died)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def _captured(config: EngineConfig, answers: gates.Capture, started: float) -> TrialResult:
    """The reference's record: its golden-set answers; no load was replayed, so no figures."""
    return replace(
        _failed(config, "", started),
        status="ok",
        error=None,
        capture=answers.to_dict(),
    )


def warm_up(url: str, *, seed: int = 0) -> None:
    """The first requests pay for lazy initialisation: sent before anything is measured."""
    replay_generated(
        endpoint=url,
        num_requests=4,
        rate_rps=50.0,
        num_prompt_tokens=64,
        num_output_tokens=8,
        seed=seed,
        progress=False,
    )


def _warm_replay(plan: TrialPlan, url: str) -> dict[str, Any] | None:
    """The first `plan.warmup_requests` of the workload at the target rate, with prompts of their
    own, not measured: the engine meets the traffic's shapes once before the repeats that count."""
    if not plan.warmup_requests:
        return None
    limit = (
        plan.warmup_requests if plan.max_requests is None else min(plan.warmup_requests, plan.max_requests)
    )
    result = replay_trace(
        endpoint=url,
        trace=Path(plan.workload_trace),
        max_requests=limit,
        max_prompt_tokens=plan.max_prompt_tokens,
        max_output_tokens=plan.max_output_tokens,
        seed=plan.seed + WARMUP_SEED_OFFSET,
        request_timeout_s=plan.request_timeout_s,
        progress=False,
        client_processes=plan.client_processes,
    )
    s = result.summary
    return {"requests": s.num_requests, "errors": s.num_errors, "ttft_p50_ms": _finite(s.ttft_ms.p50)}


def _served_name(base_url: str) -> str:
    from serving.engine.launcher import served_models

    models = served_models(base_url)
    return str(models[0]["id"])


def _replay(plan: TrialPlan, url: str, multiple: float, repeat: int) -> ReplayResult:
    own = dict(plan.capacity_traces).get(multiple) if multiple != 1.0 else None
    return replay_trace(
        endpoint=url,
        trace=Path(own or plan.workload_trace),
        rate_scale=1.0 if own or multiple == 1.0 else multiple,
        max_requests=plan.max_requests,
        max_prompt_tokens=plan.max_prompt_tokens,
        max_output_tokens=plan.max_output_tokens,
        seed=plan.seed + repeat,
        slo=plan.slo.per_request(),
        request_timeout_s=plan.request_timeout_s,
        progress=False,
        client_processes=plan.client_processes,
    )


def describe(assignment: Mapping[str, Any]) -> str:
    """A short label: only the knobs that differ from the engine's defaults."""
    parts = [f"{k}={v}" for k, v in assignment.items() if v is not None]
    return ", ".join(parts) or "vLLM defaults"
