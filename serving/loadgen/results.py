"""What a replay measured: one record per request, and the summary a user reads."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class RequestResult:
    """One request as the client saw it. Times are milliseconds unless named otherwise."""

    index: int  # position in the replayed schedule
    scheduled_s: float  # planned send time, seconds after the run started
    send_lateness_ms: float  # how late the request actually left against its schedule
    num_prompt_tokens: int  # as synthesised and counted with the endpoint's tokenizer
    num_prompt_tokens_reported: int | None  # the endpoint's own count (usage), when it reports one
    max_output_tokens: int  # what the request asked for
    num_output_tokens: int  # what came back (usage, else streamed chunks)
    ttft_ms: float | None  # send to first streamed token
    e2e_ms: float | None  # send to last byte
    tpot_ms: float | None  # (e2e - ttft) / (output tokens - 1); None with fewer than 2 tokens
    itl_ms: tuple[float, ...] = field(repr=False, default=())  # gaps between streamed chunks
    status: int | None = None  # HTTP status; None when no response came
    error: str | None = None  # why it failed; None on success

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class LatencyStats:
    """Distribution of one latency (ms): numpy's default linear percentiles."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        arr = np.asarray(values, dtype=np.float64)
        p50, p90, p95, p99 = (float(x) for x in np.percentile(arr, PERCENTILES))
        return cls(len(arr), float(arr.mean()), p50, p90, p95, p99, float(arr.max()))


@dataclass(frozen=True)
class SLO:
    """Per-request latency objectives; a request meets the SLO when it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, result: RequestResult) -> bool:
        if not result.ok:
            return False
        # TPOT is undefined for one-token outputs: there is nothing to miss, so None passes there.
        checks = (
            (self.ttft_ms, result.ttft_ms, False),
            (self.tpot_ms, result.tpot_ms, True),
            (self.e2e_ms, result.e2e_ms, False),
        )
        for limit, value, missing_passes in checks:
            if limit is None:
                continue
            if value is None:
                if missing_passes:
                    continue
                return False
            if value > limit:
                return False
        return True


@dataclass(frozen=True)
class ReplaySummary:
    """Aggregates over one replay."""

    num_requests: int
    num_ok: int
    num_errors: int
    error_rate: float  # errors / requests
    duration_s: float  # first send to last completion
    offered_rate_rps: float  # requests over the span of their scheduled send times (the load asked for)
    request_throughput_rps: float  # completed requests per second
    input_throughput_tps: float  # prompt tokens of completed requests per second
    output_throughput_tps: float  # generated tokens per second
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2e_ms: LatencyStats
    send_lateness_ms: LatencyStats
    slo: SLO
    slo_attainment: float  # share of all requests meeting `slo`
    goodput_rps: float  # requests meeting `slo` per second
    num_prompt_token_mismatches: int  # requests whose endpoint-reported prompt count differs from ours


def summarize(results: Sequence[RequestResult], *, duration_s: float, slo: SLO) -> ReplaySummary:
    ok = [r for r in results if r.ok]
    num = len(results)
    good = sum(1 for r in results if slo.met_by(r))
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    return ReplaySummary(
        num_requests=num,
        num_ok=len(ok),
        num_errors=num - len(ok),
        error_rate=(num - len(ok)) / num if num else math.nan,
        duration_s=duration_s,
        offered_rate_rps=_offered_rate_rps([r.scheduled_s for r in results]),
        request_throughput_rps=per_s(len(ok)),
        input_throughput_tps=per_s(sum(r.num_prompt_tokens for r in ok)),
        output_throughput_tps=per_s(sum(r.num_output_tokens for r in ok)),
        ttft_ms=LatencyStats.of([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        tpot_ms=LatencyStats.of([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        itl_ms=LatencyStats.of([x for r in ok for x in r.itl_ms]),
        e2e_ms=LatencyStats.of([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        send_lateness_ms=LatencyStats.of([r.send_lateness_ms for r in results]),
        slo=slo,
        slo_attainment=good / num if num else math.nan,
        goodput_rps=per_s(good),
        num_prompt_token_mismatches=sum(
            1
            for r in ok
            if r.num_prompt_tokens_reported is not None
            and r.num_prompt_tokens_reported != r.num_prompt_tokens
        ),
    )


def _offered_rate_rps(scheduled_s: Sequence[float]) -> float:
    if len(scheduled_s) < 2:
        return math.nan
    span = max(scheduled_s) - min(scheduled_s)
    return (len(scheduled_s) - 1) / span if span > 0 else math.inf


@dataclass(frozen=True)
class ReplaySettings:
    """How the replay was run (recorded with its results)."""

    endpoint: str
    model: str
    api: str  # "completions" or "chat"
    source: str  # trace path, or "poisson"/"gamma" for generated arrivals
    time_scale: float
    rate_scale: float
    rate_rps: float | None  # generated arrivals only
    arrival_cv: float | None  # generated arrivals only
    max_requests: int | None
    max_prompt_tokens: int | None  # prompts longer than this were cut (keeping leading blocks)
    max_output_tokens: int | None
    ignore_eos: bool
    seed: int
    tokenizer: str
    # Client processes the requests were spread over (round-robin), each with its own event loop:
    # at thousands of streamed tokens a second one Python loop falls behind and adds its own
    # delay to every TTFT it measures.
    client_processes: int = 1
    # The scheduling policy of the client loops' threads ("fifo" where the host allows it; see
    # `serving.loadgen.scheduling`): at the normal policy a client sharing cores with the engine
    # read its tokens late.
    client_scheduling: str = "normal"


@dataclass(frozen=True)
class ReplayResult:
    settings: ReplaySettings
    summary: ReplaySummary
    requests: tuple[RequestResult, ...] = field(repr=False)
    started_at: str  # ISO time (UTC) of the first send

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["requests"] = [{**dataclasses.asdict(r), "itl_ms": list(r.itl_ms)} for r in self.requests]
        return json_finite(data)

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")


def json_finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None, recursively: JSON has no NaN,
    and an empty distribution's statistics become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_finite(v) for v in value]
    return value
