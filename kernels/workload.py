"""From a workload profile to the shape buckets the kernels should be tuned for, with weights.

The profile is the JSON of `tailguard profile TRACE --json` (DESIGN.md): prompt and output
length percentiles and arrival rates. Kernels see neither requests nor rates, only the number of
tokens in one engine step (RMSNorm, SiLU-mul and the MoE GEMM run over every token of the step)
and, for decode attention, the number of running sequences and their context length. This
module turns the one into the other with a small, explicit engine model:

- Load levels: the trace's mean rate and its 60-second peak, weighted equally (a deployment
  is sized for the peak but spends most of its time nearer the mean).
- Running sequences (Little's law): C = rate * mean output tokens * step time, capped at
  `max_num_seqs`. Every step decodes one token for each of them.
- Chunked prefill: a prompt enters in chunks of at most `max_batched_tokens`; the share of
  steps that carry a chunk is (chunks per second * step time), capped at 1. Such a step
  processes C + chunk tokens (capped at the budget); the others C.
- Lengths: the percentiles are read as a piecewise-linear quantile function through
  (0, 1), (0.5, p50), (0.9, p90), (0.95, p95), (0.99, p99), (1, max), sampled at 64
  equal-mass points.
- Decode attention: a batch of C sequences whose longest context is the prompt quantile at
  C/(C+1) plus half the mean output (sequences are, on average, half-way through generating).

Where the simulator's distribution of tokens per engine step is available it replaces this
model: pass it as `step_tokens` (tokens -> count of steps).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernels._common import attention_bucket, token_bucket

_QUANTILE_KEYS = ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"), (1.0, "max"))
_SAMPLES = 64


@dataclass(frozen=True)
class EngineAssumptions:
    step_s: float = 0.025  # duration of one engine step (decode TPOT) at these loads
    max_batched_tokens: int = 8192  # chunked-prefill token budget of one step
    max_num_seqs: int = 256  # most sequences the engine runs at once


@dataclass(frozen=True)
class ShapeBuckets:
    # token-count bucket (power of two) -> share of engine steps; weights sum to 1
    token_buckets: dict[int, float]
    # "b{seqs}_c{context}" decode-attention bucket -> share of decode steps; weights sum to 1
    attention_buckets: dict[str, float]
    # load level ("mean", "peak") -> (running sequences, longest context in tokens)
    decode_batches: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "token_buckets": {str(k): round(v, 6) for k, v in sorted(self.token_buckets.items())},
            "attention_buckets": {k: round(v, 6) for k, v in sorted(self.attention_buckets.items())},
            "decode_batches": {
                k: {"num_seqs": s, "max_seq_len": c} for k, (s, c) in self.decode_batches.items()
            },
        }


class ProfileError(ValueError):
    """The profile lacks a field the bucket model needs (the message names it)."""


def _number(section: Mapping[str, Any], key: str, where: str) -> float:
    value = section.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ProfileError(f"profile: `{where}.{key}` must be a number, got {value!r}")
    if value < 0:
        raise ProfileError(f"profile: `{where}.{key}` is negative ({value})")
    return float(value)


def _quantile_fn(section: Mapping[str, Any], where: str) -> tuple[list[tuple[float, float]], float]:
    points = [(0.0, 1.0)]
    for q, key in _QUANTILE_KEYS:
        points.append((q, max(points[-1][1], _number(section, key, where))))
    return points, _number(section, "mean", where)


def _quantile(points: list[tuple[float, float]], p: float) -> float:
    for (q0, v0), (q1, v1) in itertools.pairwise(points):
        if p <= q1:
            return v0 + (v1 - v0) * (p - q0) / (q1 - q0)
    return points[-1][1]


def _normalise(weights: Mapping[Any, float]) -> dict[Any, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items() if v > 0}


def buckets_from_profile(
    profile: Mapping[str, Any],
    assumptions: EngineAssumptions | None = None,
    *,
    step_tokens: Mapping[int, float] | None = None,
) -> ShapeBuckets:
    """The token-count and decode-attention buckets that carry this workload, with weights."""
    eng = assumptions or EngineAssumptions()
    for key in ("input_tokens", "output_tokens", "arrival"):
        if not isinstance(profile.get(key), Mapping):
            raise ProfileError(
                f"profile: `{key}` is missing (expected the JSON of `tailguard profile --json`)"
            )
    in_q, _ = _quantile_fn(profile["input_tokens"], "input_tokens")
    _, out_mean = _quantile_fn(profile["output_tokens"], "output_tokens")
    arrival = profile["arrival"]
    levels = {
        "mean": _number(arrival, "mean_rps", "arrival"),
        "peak": max(_number(arrival, "peak_rps_60s", "arrival"), _number(arrival, "mean_rps", "arrival")),
    }
    samples = [_quantile(in_q, (i + 0.5) / _SAMPLES) for i in range(_SAMPLES)]
    budget = eng.max_batched_tokens
    chunks: list[int] = []  # every prefill chunk of the sampled prompts
    for n in samples:
        n_int = max(1, round(n))
        full, rest = divmod(n_int, budget)
        chunks.extend([budget] * full + ([rest] if rest else []))
    chunks_per_request = len(chunks) / _SAMPLES

    tokens: dict[int, float] = {}
    attention: dict[str, float] = {}
    batches: dict[str, tuple[int, int]] = {}
    for level, rate in levels.items():
        running = min(eng.max_num_seqs, max(1, round(rate * out_mean * eng.step_s)))
        prefill_share = min(1.0, rate * chunks_per_request * eng.step_s)
        b = token_bucket(running)
        tokens[b] = tokens.get(b, 0.0) + 0.5 * (1.0 - prefill_share)
        for chunk in chunks:
            b = token_bucket(min(budget, running + chunk))
            tokens[b] = tokens.get(b, 0.0) + 0.5 * prefill_share / len(chunks)
        longest = round(_quantile(in_q, running / (running + 1)) + out_mean / 2)
        key = attention_bucket(running, longest)
        attention[key] = attention.get(key, 0.0) + 0.5
        batches[level] = (running, longest)
    if step_tokens:
        tokens = {}
        for n, count in step_tokens.items():
            b = token_bucket(int(n))
            tokens[b] = tokens.get(b, 0.0) + float(count)
    return ShapeBuckets(
        token_buckets=_normalise(tokens), attention_buckets=_normalise(attention), decode_batches=batches
    )
