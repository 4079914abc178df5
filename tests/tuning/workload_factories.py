"""Seeded generators of small Mooncake-format traces for drift and synthesis tests, and the length
buckets the continual-loop tests count in."""

from __future__ import annotations

import io
import json
import math

import numpy as np

from tuning.workload import IngestResult, ingest

# vLLM's length buckets (1-2-5 steps) up to a 2048-token context.
BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, math.inf)


def mooncake_trace(
    rng: np.random.Generator,
    *,
    n: int = 2000,
    rate_rps: float = 5.0,
    input_scale: float = 1.0,
    gap_shape: float = 1.0,
    shared_prefixes: int = 20,
    start_ms: int = 0,
    first_id: int = 0,
) -> list[str]:
    """Stationary traffic: gamma gaps (shape 1 = Poisson; smaller = burstier) at `rate_rps`,
    correlated log-normal lengths, and prompts that start with one of `shared_prefixes` system
    prompts (Zipf-popular, 4 blocks each) followed by private blocks; 0 = nothing shared."""
    gaps_s = rng.gamma(gap_shape, 1.0 / (gap_shape * rate_rps), size=n)
    arrival_ms = start_ms + np.cumsum(np.round(gaps_s * 1000)).astype(np.int64)
    z = rng.standard_normal((n, 2))
    inputs = np.maximum(1, np.round(input_scale * np.exp(7.0 + 0.9 * z[:, 0]))).astype(np.int64)
    outputs = np.maximum(1, np.round(np.exp(5.0 + 0.5 * z[:, 0] + 0.6 * z[:, 1]))).astype(np.int64)
    popularity = 1.0 / np.arange(1, max(shared_prefixes, 1) + 1)
    popularity /= popularity.sum()
    chosen = rng.choice(max(shared_prefixes, 1), size=n, p=popularity).tolist()
    next_id = first_id + 10_000
    lines = []
    for i in range(n):
        blocks = -(-int(inputs[i]) // 512)
        head = [first_id + chosen[i] * 4 + k for k in range(min(4, blocks))] if shared_prefixes else []
        tail = list(range(next_id, next_id + blocks - len(head)))
        next_id += len(tail)
        record = {
            "timestamp": int(arrival_ms[i]),
            "input_length": int(inputs[i]),
            "output_length": int(outputs[i]),
            "hash_ids": head + tail,
        }
        lines.append(json.dumps(record))
    return lines


def ingest_lines(lines: list[str], **options: object) -> IngestResult:
    return ingest(io.BytesIO("\n".join(lines).encode()), **options)  # type: ignore[arg-type]
