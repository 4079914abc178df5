"""When each request is sent: from a trace's timestamps, or from a Poisson/gamma process at a rate."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from serving.loadgen.traces import TraceRequest


def trace_offsets_s(
    requests: Sequence[TraceRequest], *, time_scale: float = 1.0, rate_scale: float = 1.0
) -> list[float]:
    """Send times from the trace: arrival times x `time_scale` / `rate_scale`.

    `time_scale` 0.5 replays twice as fast (same as `rate_scale` 2); both keep the trace's shape.
    """
    if time_scale <= 0 or rate_scale <= 0:
        raise ValueError("time_scale and rate_scale must be positive")
    factor = time_scale / rate_scale
    return [r.arrival_s * factor for r in requests]


def gamma_offsets_s(
    num_requests: int, *, rate_rps: float, rng: np.random.Generator, cv: float = 1.0
) -> list[float]:
    """Send times of a renewal process with mean rate `rate_rps` and inter-arrival CV `cv`.

    cv = 1 is a Poisson process, cv < 1 is smoother, cv > 1 burstier (gamma shape 1/cv^2);
    cv = 0 sends at constant spacing. The first request goes at time 0.
    """
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    if cv < 0:
        raise ValueError("cv must be >= 0")
    if num_requests <= 0:
        return []
    mean_gap_s = 1.0 / rate_rps
    if cv == 0:
        gaps = np.full(num_requests - 1, mean_gap_s)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape=shape, scale=mean_gap_s / shape, size=num_requests - 1)
    offsets = np.concatenate([[0.0], np.cumsum(gaps)])
    return [float(x) for x in offsets]


def poisson_offsets_s(num_requests: int, *, rate_rps: float, rng: np.random.Generator) -> list[float]:
    """Send times of a Poisson process at `rate_rps` (exponential gaps)."""
    return gamma_offsets_s(num_requests, rate_rps=rate_rps, rng=rng, cv=1.0)


def offered_rate_rps(offsets_s: Sequence[float]) -> float:
    """Mean offered rate of a schedule (requests per second over its span)."""
    if len(offsets_s) < 2:
        return math.nan
    span = max(offsets_s) - min(offsets_s)
    return (len(offsets_s) - 1) / span if span > 0 else math.inf
