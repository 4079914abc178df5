"""Synthetic traffic at a target rate that keeps a sample's shape.

Method (a moving-block bootstrap): the output is a sequence of segments, each a run of
consecutive requests copied from the sample at a random start. Copying whole requests keeps the
joint (input, output) length distribution exactly; copying runs of consecutive gaps keeps
burstiness, including its short-range correlation, and copying runs of requests keeps the prefix
structure of conversations. Gaps are then scaled so the output spans exactly `duration_s` with
`round(target_rps * duration_s)` requests.

Prefix blocks are renamed per copied segment so that a segment drawn twice is not a free cache
hit: blocks the sample introduced inside the segment get fresh ids in each copy, while blocks
introduced before it (system prompts, earlier turns) keep one id across the whole output, and so
stay shared as they were in the sample.

The output is a Mooncake-style trace (ms timestamps, lengths, `hash_ids` of 512-token blocks),
which the load generator replays and `tailguard profile` reads back. `scale_lengths` shortens
every request by one factor where the hardware cannot replay the real lengths; the scaled trace
also carries each request's sample lengths (`sample_input_length`, `sample_output_length`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from tuning.workload.ingest import IngestResult


@dataclass(frozen=True, eq=False)
class SyntheticTrace:
    block_size_tokens: int
    arrival_ms: np.ndarray = field(repr=False)  # int64, from 0
    input_tokens: np.ndarray = field(repr=False)  # int64
    output_tokens: np.ndarray = field(repr=False)  # int64
    block_ids: np.ndarray | None = field(repr=False)  # int64, flat; None without prefix info
    block_offsets: np.ndarray | None = field(repr=False)  # int64, num_requests + 1
    # After `scale_lengths`: the lengths the sample had (written beside the replayed ones, so
    # that every report can count the requests the factor changed); None when not scaled.
    sample_input_tokens: np.ndarray | None = field(default=None, repr=False)
    sample_output_tokens: np.ndarray | None = field(default=None, repr=False)
    length_scale: float = 1.0

    @property
    def num_requests(self) -> int:
        return int(self.arrival_ms.shape[0])


def synthesize(
    sample: IngestResult,
    *,
    target_rps: float,
    duration_s: float,
    rng: np.random.Generator,
    segment_requests: int | None = None,
) -> SyntheticTrace:
    """A trace of `round(target_rps * duration_s)` requests over `duration_s` seconds.

    `sample` must come from `ingest(..., keep_blocks=True)` when it has prefix information.
    `segment_requests` is the bootstrap block length (default: an eighth of the sample, at
    least 64 requests).
    """
    if not target_rps > 0 or not duration_s > 0:
        raise ValueError("target_rps and duration_s must be positive")
    columns = sample.columns
    has_prefix = columns.prefix_hit_tokens is not None
    if has_prefix and sample.blocks is None:
        raise ValueError("ingest the sample with keep_blocks=True to synthesize its prefix structure")
    size = columns.num_requests
    wanted = max(2, round(target_rps * duration_s))
    length = min(size, segment_requests or max(64, size // 8))
    gaps = np.diff(columns.arrival_ns).astype(np.float64)
    # gap_before[r]: the gap that preceded request r in the sample (r = 0 has none: drawn later)
    gap_before = np.concatenate([[np.nan], gaps])
    rows_parts: list[np.ndarray] = []
    starts: list[int] = []
    produced = 0
    while produced < wanted:
        start = int(rng.integers(0, size - length + 1))
        take = min(length, wanted - produced)
        rows_parts.append(np.arange(start, start + take, dtype=np.int64))
        starts.append(start)
        produced += take
    rows = np.concatenate(rows_parts)
    out_gaps = gap_before[rows]
    missing = np.isnan(out_gaps)
    out_gaps[missing] = gaps[rng.integers(0, gaps.shape[0], size=int(missing.sum()))]
    out_gaps[0] = 0.0
    arrival = np.cumsum(out_gaps)
    if arrival[-1] > 0:
        arrival *= duration_s / arrival[-1]
    else:
        arrival = np.linspace(0.0, duration_s, rows.shape[0])
    arrival_ms = np.round(arrival * 1000).astype(np.int64)
    block_ids = block_offsets = None
    if has_prefix and sample.blocks is not None:
        block_ids, block_offsets = _rename_blocks(sample.blocks.ids, sample.blocks.offsets, rows_parts)
    return SyntheticTrace(
        block_size_tokens=sample.blocks.block_size_tokens if sample.blocks is not None else 512,
        arrival_ms=arrival_ms,
        input_tokens=columns.input_tokens[rows],
        output_tokens=columns.output_tokens[rows],
        block_ids=block_ids,
        block_offsets=block_offsets,
    )


MIN_LENGTH_SCALE = 0.01


def scale_lengths(trace: SyntheticTrace, factor: float) -> SyntheticTrace:
    """The same requests with prompts and outputs `factor` times their length (rounded, at least
    one token where there was any): the shape of the length distribution (its ratios, its tail)
    is kept, unlike a cap, which flattens everything above it onto one value.

    Prefix structure scales with the prompts: scaled block j stands for the sample's block that
    holds the original position (j + 1) / factor blocks in, so two requests that shared k blocks
    share about k x factor scaled blocks (block ids name whole prefixes, so sharing the later
    block means sharing everything before it).
    """
    if not (np.isfinite(factor) and MIN_LENGTH_SCALE <= factor <= 1.0):
        raise ValueError(f"the length scale must be {MIN_LENGTH_SCALE} to 1")
    if factor == 1.0:
        return trace

    def scaled(values: np.ndarray) -> np.ndarray:
        out = np.rint(values * factor).astype(np.int64)
        return np.where(values > 0, np.maximum(out, 1), 0)

    inputs = scaled(trace.input_tokens)
    block_ids = block_offsets = None
    if trace.block_ids is not None and trace.block_offsets is not None:
        size = trace.block_size_tokens
        counts = np.diff(trace.block_offsets)
        new_counts = np.minimum(-(-inputs // size), np.where(counts > 0, np.iinfo(np.int64).max, 0))
        parts: list[np.ndarray] = []
        for r in range(inputs.shape[0]):
            n_new = int(new_counts[r])
            if n_new == 0:
                continue
            j = np.arange(1, n_new + 1, dtype=np.float64)
            index = np.minimum(np.ceil(j / factor - 1e-9).astype(np.int64) - 1, int(counts[r]) - 1)
            parts.append(trace.block_ids[trace.block_offsets[r] + index])
        block_ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        block_offsets = np.zeros(inputs.shape[0] + 1, dtype=np.int64)
        np.cumsum(new_counts, out=block_offsets[1:])
    return SyntheticTrace(
        block_size_tokens=trace.block_size_tokens,
        arrival_ms=trace.arrival_ms,
        input_tokens=inputs,
        output_tokens=scaled(trace.output_tokens),
        block_ids=block_ids,
        block_offsets=block_offsets,
        sample_input_tokens=trace.input_tokens,
        sample_output_tokens=trace.output_tokens,
        length_scale=factor,
    )


def _rename_blocks(
    ids: np.ndarray, offsets: np.ndarray, segments: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    # The sample's ids are numbered in order of first use, so the ids used before request r are
    # exactly 0 .. known_before[r] - 1.
    running_max = np.maximum.accumulate(ids) if ids.size else ids
    ends = offsets[1:]
    known_before = np.zeros(offsets.shape[0] - 1, dtype=np.int64)
    nonzero_end = ends > 0
    known_before[1:] = np.where(nonzero_end[:-1], running_max[np.maximum(ends[:-1] - 1, 0)] + 1, 0)
    np.maximum.accumulate(known_before, out=known_before)
    shared = np.full(int(ids.max()) + 1 if ids.size else 0, -1, dtype=np.int64)
    next_id = 0
    out_ids: list[np.ndarray] = []
    out_counts: list[np.ndarray] = []
    for rows in segments:
        first, last = int(rows[0]), int(rows[-1])
        chunk = ids[offsets[first] : offsets[last + 1]]
        boundary = int(known_before[first])
        renamed = np.empty_like(chunk)
        old = chunk < boundary
        old_ids = chunk[old]
        if old_ids.size:
            fresh_old = np.unique(old_ids[shared[old_ids] < 0])
            shared[fresh_old] = np.arange(next_id, next_id + fresh_old.shape[0])
            next_id += int(fresh_old.shape[0])
            renamed[old] = shared[old_ids]
        new_ids = chunk[~old]
        if new_ids.size:
            renamed[~old] = next_id + (new_ids - boundary)
            next_id += int(new_ids.max()) - boundary + 1
        out_ids.append(renamed)
        out_counts.append(offsets[rows + 1] - offsets[rows])
    counts = np.concatenate(out_counts)
    out_offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out_offsets[1:])
    return np.concatenate(out_ids), out_offsets


def write_mooncake_jsonl(trace: SyntheticTrace, stream: BinaryIO) -> None:
    """One JSON object per line, keys in Mooncake's order; the same trace gives the same bytes."""
    arrival = trace.arrival_ms.tolist()
    inputs = trace.input_tokens.tolist()
    outputs = trace.output_tokens.tolist()
    lines: list[str] = []
    ids = trace.block_ids.tolist() if trace.block_ids is not None else None
    offsets = trace.block_offsets.tolist() if trace.block_offsets is not None else None
    sample_in = trace.sample_input_tokens.tolist() if trace.sample_input_tokens is not None else None
    sample_out = trace.sample_output_tokens.tolist() if trace.sample_output_tokens is not None else None
    for i in range(len(arrival)):
        head = f'{{"timestamp": {arrival[i]}, "input_length": {inputs[i]}, "output_length": {outputs[i]}'
        if sample_in is not None and sample_out is not None:
            head += f', "sample_input_length": {sample_in[i]}, "sample_output_length": {sample_out[i]}'
        if ids is not None and offsets is not None:
            blocks = ", ".join(map(str, ids[offsets[i] : offsets[i + 1]]))
            lines.append(f'{head}, "hash_ids": [{blocks}]}}\n')
        else:
            lines.append(head + "}\n")
        if len(lines) >= 8192:
            stream.write("".join(lines).encode())
            lines.clear()
    stream.write("".join(lines).encode())
