"""From one replay against one target at one load level to the numbers a report shows.

Pure functions (no Django, no I/O), so they are tested on hand-made replay results:
- latency distributions as client-observed TTFT/TPOT percentiles, plus 101 quantiles (0..100 %)
  as the compact sample the CDF charts draw;
- bootstrap 95 % intervals of the p50 and p95 TTFT (resampling requests);
- throughput (completed requests/s, output tokens/s);
- failures counted by kind, so a refusing, timing-out or non-streaming endpoint reads as such;
- cost per million tokens (prompt + output) under the engineer's price: a dedicated endpoint's
  hourly price over the tokens it served per hour at that load, or a per-token provider's input
  and output prices weighted by the tokens actually sent and received.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.loadgen.results import ReplayResult, RequestResult, json_finite

CDF_POINTS = 101  # quantiles at 0, 1, ..., 100 %
BOOTSTRAP_ROUNDS = 1000
_MIN_FOR_CI = 5
_BOOTSTRAP_CHUNK = 100

# Kinds of failure, in the order a report lists them, with the words it uses.
ERROR_KINDS: dict[str, str] = {
    "connection_refused": "connection refused",
    "cannot_connect": "could not connect",
    "timeout": "timed out",
    "not_streaming": "answered without a token stream",
    "stream_error": "error inside the stream",
    "bad_stream": "malformed stream",
    "disconnected": "connection dropped",
    "http_4xx": "HTTP 4xx",
    "http_5xx": "HTTP 5xx",
    "client": "client could not run the replay",
    "other": "other",
}


@dataclass(frozen=True)
class Price:
    """What the engineer entered for one target (USD)."""

    pricing: str  # "hourly" or "per_token"
    per_hour_usd: float | None = None
    input_per_mtok_usd: float | None = None
    output_per_mtok_usd: float | None = None


def level_label(multiplier: float, rate_rps: float) -> str:
    return f"{multiplier:g}\u00d7 peak ({rate_rps:.2f} req/s)"


def error_kind(message: str) -> str:
    """The kind of one request's failure, from the load generator's error text."""
    head = message.split(":", 1)[0]
    lowered = message.lower()
    if message.startswith("HTTP "):
        status = message[5:8]
        return "http_5xx" if status.startswith("5") else "http_4xx"
    if "timeout" in head.lower():
        return "timeout"
    if head in {"ClientConnectorError", "ClientConnectorDNSError", "ClientConnectionError"} or (
        "refused" in lowered
    ):
        refused = "refused" in lowered or "connect call failed" in lowered
        return "connection_refused" if refused else "cannot_connect"
    if message == "stream ended without a token":
        # A 200 answer whose body had no `data:` events: a plain JSON (non-streaming) response.
        return "not_streaming"
    if message.startswith("stream error"):
        return "stream_error"
    if head == "JSONDecodeError":
        return "bad_stream"
    if head in {"ServerDisconnectedError", "ClientPayloadError", "ClientOSError"}:
        return "disconnected"
    return "other"


def safe_error_example(kind: str, message: str) -> str:
    """What a report may show of one failure: never what the target answered (an internal
    service's page, an error body), only the status or the client-side exception."""
    if kind in {"http_4xx", "http_5xx"}:
        return message[:8].strip()  # "HTTP 404"
    if kind == "stream_error":
        return "error event in the stream"
    if kind == "other":
        return message.split(":", 1)[0][:80]  # the exception's type only
    return message[:200]


def quantiles(values: Sequence[float]) -> list[float]:
    """`CDF_POINTS` evenly spaced quantiles (numpy's linear method), to 0.1 ms."""
    if not values:
        return []
    grid = np.linspace(0.0, 100.0, CDF_POINTS)
    return [round(float(v), 1) for v in np.percentile(np.asarray(values, dtype=np.float64), grid)]


def bootstrap_ci(
    values: Sequence[float], percentile: float, rng: np.random.Generator, rounds: int = BOOTSTRAP_ROUNDS
) -> tuple[float, float] | None:
    """95 % percentile-bootstrap interval of the `percentile`-th percentile; None under 5 values."""
    if len(values) < _MIN_FOR_CI:
        return None
    arr = np.asarray(values, dtype=np.float64)
    estimates = []
    # In chunks: rounds x n draws at once would hold gigabytes for a long run.
    for start in range(0, rounds, _BOOTSTRAP_CHUNK):
        size = min(_BOOTSTRAP_CHUNK, rounds - start)
        draws = rng.choice(arr, size=(size, arr.size), replace=True)
        estimates.append(np.percentile(draws, percentile, axis=1))
    low, high = np.percentile(np.concatenate(estimates), [2.5, 97.5])
    return (float(low), float(high))


def _stats(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = (float(x) for x in np.percentile(arr, [50, 90, 95, 99]))
    return {
        "count": int(arr.size),
        "mean": float(arr.mean()),
        "p50": p50,
        "p90": p90,
        "p95": p95,
        "p99": p99,
        "max": float(arr.max()),
    }


def _prompt_tokens(r: RequestResult) -> int:
    # The endpoint's own count where it reports one: that is what a provider bills.
    return r.num_prompt_tokens_reported if r.num_prompt_tokens_reported is not None else r.num_prompt_tokens


def cost_per_mtok_usd(
    price: Price, *, input_tokens: int, output_tokens: int, duration_s: float
) -> float | None:
    """USD per million tokens (prompt + output) served; None when nothing was served."""
    total = input_tokens + output_tokens
    if total <= 0:
        return None
    if price.pricing == "hourly":
        if price.per_hour_usd is None or not duration_s > 0:
            return None
        tokens_per_hour = total / duration_s * 3600.0
        return price.per_hour_usd / tokens_per_hour * 1e6
    if price.input_per_mtok_usd is None or price.output_per_mtok_usd is None:
        return None
    return (input_tokens * price.input_per_mtok_usd + output_tokens * price.output_per_mtok_usd) / total


def cell_from_replay(result: ReplayResult, *, price: Price, rng: np.random.Generator) -> dict[str, Any]:
    """The stored form of one replay: JSON-ready, NaN-free."""
    s = result.summary
    ok = [r for r in result.requests if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for r in result.requests:
        if r.error is not None:
            kind = error_kind(r.error)
            kinds[kind] += 1
            examples.setdefault(kind, safe_error_example(kind, r.error))
    input_tokens = sum(_prompt_tokens(r) for r in ok)
    output_tokens = sum(r.num_output_tokens for r in ok)
    reported = [r.num_prompt_tokens_reported for r in ok if r.num_prompt_tokens_reported is not None]
    cell = {
        "started_at": result.started_at,
        "num_requests": s.num_requests,
        "num_ok": s.num_ok,
        "num_errors": s.num_errors,
        "error_rate": s.error_rate,
        "errors": {k: kinds[k] for k in ERROR_KINDS if kinds[k]},
        "error_examples": {k: examples[k] for k in ERROR_KINDS if k in examples},
        "duration_s": s.duration_s,
        "offered_rate_rps": s.offered_rate_rps,
        "request_throughput_rps": s.request_throughput_rps,
        "output_throughput_tps": s.output_throughput_tps,
        "input_throughput_tps": s.input_throughput_tps,
        "ttft_ms": _stats(ttfts),
        "tpot_ms": _stats(tpots),
        "ttft_p50_ci_ms": bootstrap_ci(ttfts, 50, rng),
        "ttft_p95_ci_ms": bootstrap_ci(ttfts, 95, rng),
        "ttft_cdf_ms": quantiles(ttfts),
        "tpot_cdf_ms": quantiles(tpots),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "prompt_tokens_planned_mean": (
            float(np.mean([r.num_prompt_tokens for r in result.requests])) if result.requests else None
        ),
        "prompt_tokens_reported_mean": float(np.mean(reported)) if reported else None,
        "send_lateness_p99_ms": s.send_lateness_ms.p99,
        "cost_per_mtok_usd": cost_per_mtok_usd(
            price, input_tokens=input_tokens, output_tokens=output_tokens, duration_s=s.duration_s
        ),
    }
    return dict(json_finite(cell))


def failed_cell(*, num_requests: int, reason: str) -> dict[str, Any]:
    """A replay that could not run at all: every planned request counts as a client failure."""
    return {
        "started_at": None,
        "num_requests": num_requests,
        "num_ok": 0,
        "num_errors": num_requests,
        "error_rate": 1.0 if num_requests else None,
        "errors": {"client": num_requests},
        "error_examples": {"client": reason[:200]},
        "duration_s": None,
        "offered_rate_rps": None,
        "request_throughput_rps": 0.0,
        "output_throughput_tps": 0.0,
        "input_throughput_tps": 0.0,
        "ttft_ms": _stats([]),
        "tpot_ms": _stats([]),
        "ttft_p50_ci_ms": None,
        "ttft_p95_ci_ms": None,
        "ttft_cdf_ms": [],
        "tpot_cdf_ms": [],
        "input_tokens": 0,
        "output_tokens": 0,
        "prompt_tokens_planned_mean": None,
        "prompt_tokens_reported_mean": None,
        "send_lateness_p99_ms": None,
        "cost_per_mtok_usd": None,
    }
