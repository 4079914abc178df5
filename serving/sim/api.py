"""What the tuning search calls: simulate a trace, rank candidate configurations, find the rate limit.

All functions are deterministic for a given seed; none starts an engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.catalog.fit import ModelDoesNotFit
from serving.catalog.hardware import Hardware, get_hardware
from serving.catalog.models import ModelSpec, get_model
from serving.engine.config import EngineConfig
from serving.loadgen.results import SLO, ReplaySummary
from serving.loadgen.traces import TraceRequest, read_trace
from serving.perf.model import Efficiency
from serving.sim.simulator import SimResult, simulate


@dataclass(frozen=True)
class LatencyTargets:
    """Percentile objectives over a whole replay (what a customer's SLO states)."""

    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_mean_ms: float | None = None
    max_error_rate: float = 0.0

    def met_by(self, summary: ReplaySummary) -> bool:
        if summary.num_ok == 0 or summary.error_rate > self.max_error_rate:
            return False
        checks = (
            (self.ttft_p50_ms, summary.ttft_ms.p50),
            (self.ttft_p95_ms, summary.ttft_ms.p95),
            (self.tpot_mean_ms, summary.tpot_ms.mean),
        )
        return all(limit is None or (not math.isnan(v) and v <= limit) for limit, v in checks)


def _model(model: str | ModelSpec) -> ModelSpec:
    return get_model(model) if isinstance(model, str) else model


def _hardware(hardware: str | Hardware) -> Hardware:
    return get_hardware(hardware) if isinstance(hardware, str) else hardware


def load_requests(
    trace: Path | Sequence[TraceRequest], *, max_requests: int | None = None, skip: int = 0
) -> list[TraceRequest]:
    if isinstance(trace, Path):
        return read_trace(trace, max_requests=max_requests, skip=skip)
    items = list(trace)[skip:]
    return items[:max_requests] if max_requests is not None else items


def simulate_trace(
    trace: Path | Sequence[TraceRequest],
    *,
    model: str | ModelSpec,
    hardware: str | Hardware,
    config: EngineConfig,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    skip: int = 0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    slo: SLO | None = None,
    seed: int = 0,
    record_itl: bool = False,
    efficiency: Efficiency | None = None,
) -> SimResult:
    """Simulate replaying `trace` (a file or requests) on `hardware` with `config`."""
    requests = load_requests(trace, max_requests=max_requests, skip=skip)
    return simulate(
        requests,
        model=_model(model),
        hardware=_hardware(hardware),
        config=config,
        time_scale=time_scale,
        rate_scale=rate_scale,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        rng=np.random.default_rng(seed),
        slo=slo,
        record_itl=record_itl,
        efficiency=efficiency,
    )


@dataclass(frozen=True)
class CandidateScore:
    """One candidate's simulated outcome, as the search's prior."""

    rank: int
    hardware: str
    config: EngineConfig
    meets_targets: bool
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_mean_ms: float | None
    cost_per_million_tokens_usd: float | None  # price x devices x replay time / tokens
    dominant_cause: str | None
    knob: str | None
    basis: str | None  # how the step times were obtained
    error: str | None  # why the candidate could not be simulated (e.g. does not fit)
    result: SimResult | None = field(default=None, repr=False)


def rank_candidates(
    requests: Path | Sequence[TraceRequest],
    candidates: Sequence[tuple[str | Hardware, EngineConfig]],
    *,
    model: str | ModelSpec,
    targets: LatencyTargets,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    seed: int = 0,
    keep_results: bool = False,
    efficiency: Efficiency | None = None,
    prices: Mapping[str, float] | None = None,
) -> list[CandidateScore]:
    """Simulate every (hardware, config) candidate on the same requests; best first.

    `prices`: per-device hourly prices by hardware name that replace the catalog's.

    Order: candidates meeting `targets` by cost per million tokens (then p95 TTFT); then the
    rest by p95 TTFT; candidates that cannot run (do not fit, invalid) last, with the reason.
    """
    reqs = load_requests(requests)
    spec = _model(model)
    scored: list[CandidateScore] = []
    for hw_name, config in candidates:
        hw = _hardware(hw_name)
        try:
            result = simulate(
                reqs,
                model=spec,
                hardware=hw,
                config=config,
                time_scale=time_scale,
                rate_scale=rate_scale,
                max_prompt_tokens=max_prompt_tokens,
                max_output_tokens=max_output_tokens,
                rng=np.random.default_rng(seed),
                efficiency=efficiency,
            )
        except (ModelDoesNotFit, ValueError) as exc:
            scored.append(
                CandidateScore(0, hw.name, config, False, None, None, None, None, None, None, None, str(exc))
            )
            continue
        s = result.summary
        tokens = s.input_throughput_tps * s.duration_s + s.output_throughput_tps * s.duration_s
        price = (prices or {}).get(hw.name, hw.price_per_hour_usd.value) * config.tensor_parallel_size
        cost = price * s.duration_s / 3600.0 / (tokens / 1e6) if tokens > 0 else None
        scored.append(
            CandidateScore(
                rank=0,
                hardware=hw.name,
                config=config,
                meets_targets=targets.met_by(s),
                ttft_p50_ms=_num(s.ttft_ms.p50),
                ttft_p95_ms=_num(s.ttft_ms.p95),
                tpot_mean_ms=_num(s.tpot_ms.mean),
                cost_per_million_tokens_usd=cost,
                dominant_cause=result.attribution.dominant_cause,
                knob=result.attribution.knob,
                basis=result.basis,
                error=None,
                result=result if keep_results else None,
            )
        )

    def key(c: CandidateScore) -> tuple[int, float, float]:
        if c.error is not None:
            return (2, math.inf, math.inf)
        p95 = c.ttft_p95_ms if c.ttft_p95_ms is not None else math.inf
        if c.meets_targets:
            return (
                0,
                c.cost_per_million_tokens_usd if c.cost_per_million_tokens_usd is not None else math.inf,
                p95,
            )
        return (1, p95, 0.0)

    ordered = sorted(scored, key=key)
    return [dataclasses.replace(c, rank=i + 1) for i, c in enumerate(ordered)]


def max_rate_scale(
    requests: Path | Sequence[TraceRequest],
    *,
    model: str | ModelSpec,
    hardware: str | Hardware,
    config: EngineConfig,
    targets: LatencyTargets,
    low: float = 0.05,
    high: float = 64.0,
    iterations: int = 12,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    seed: int = 0,
    efficiency: Efficiency | None = None,
) -> float | None:
    """The largest rate scale (x the trace's arrival rate) at which `targets` still hold, by bisection.

    None when even `low` misses the targets. `efficiency` replaces the hardware's stored calibration.
    """
    reqs = load_requests(requests)
    spec, hw = _model(model), _hardware(hardware)

    def ok(scale: float) -> bool:
        result = simulate(
            reqs,
            model=spec,
            hardware=hw,
            config=config,
            rate_scale=scale,
            max_prompt_tokens=max_prompt_tokens,
            max_output_tokens=max_output_tokens,
            rng=np.random.default_rng(seed),
            efficiency=efficiency,
        )
        return targets.met_by(result.summary)

    if not ok(low):
        return None
    if ok(high):
        return high
    lo, hi = math.log(low), math.log(high)
    for _ in range(iterations):
        mid = (lo + hi) / 2.0
        if ok(math.exp(mid)):
            lo = mid
        else:
            hi = mid
    return math.exp(lo)


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


def result_to_dict(result: SimResult, *, include_requests: bool = False) -> dict[str, Any]:
    """JSON-ready form of a simulation (NaN -> null)."""
    data: dict[str, Any] = {
        "model": result.model,
        "hardware": result.hardware,
        "basis": result.basis,
        "scheduler": dataclasses.asdict(result.scheduler),
        "summary": dataclasses.asdict(result.summary),
        "attribution": {
            "dominant_cause": result.attribution.dominant_cause,
            "knob": result.attribution.knob,
            "ttft_mean_ms": dataclasses.asdict(result.attribution.mean),
            "ttft_tail_ms": dataclasses.asdict(result.attribution.tail),
            "step_time_share": result.attribution.step_time_share,
            "queue_blocked_share": result.attribution.queue_blocked_share,
        },
        "num_steps": result.num_steps,
        "num_preemptions": result.num_preemptions,
        "prefix_cache_hit_rate": result.prefix_cache_hit_rate,
        "max_kv_blocks_used": result.max_kv_blocks_used,
        "busy_s": result.busy_s,
        "wall_s": result.wall_s,
    }
    if include_requests:
        data["requests"] = [{**dataclasses.asdict(r), "itl_ms": list(r.itl_ms)} for r in result.requests]
        data["request_attribution"] = [dataclasses.asdict(a) for a in result.attribution.requests]
    return _finite(data)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
