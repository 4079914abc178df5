"""Synthesis: same seed same file; the sample's lengths, burstiness and prefix reuse survive."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from tuning.workload import IngestResult, SyntheticTrace, ingest, synthesize, write_mooncake_jsonl


def written(trace: SyntheticTrace) -> bytes:
    buffer = io.BytesIO()
    write_mooncake_jsonl(trace, buffer)
    return buffer.getvalue()


def synth(sample: IngestResult, seed: int, rps: float = 8.0, duration: float = 900.0) -> SyntheticTrace:
    return synthesize(sample, target_rps=rps, duration_s=duration, rng=np.random.default_rng(seed))


def test_same_seed_same_file_other_seed_other_file(mooncake_result: IngestResult) -> None:
    first = written(synth(mooncake_result, 11))
    assert first == written(synth(mooncake_result, 11))
    assert first != written(synth(mooncake_result, 12))


def test_rate_duration_and_shape_are_kept(mooncake_result: IngestResult) -> None:
    source = mooncake_result.profile
    trace = synth(mooncake_result, 21, rps=8.0, duration=900.0)
    data = written(trace)
    result = ingest(io.BytesIO(data))
    out = result.profile
    assert out.num_requests == 7200
    assert out.duration_s == pytest.approx(900.0, abs=1e-3)
    assert out.arrival.mean_rps == pytest.approx(8.0, rel=1e-5)
    for key in ("mean", "p50", "p95"):
        assert getattr(out.input_tokens, key) == pytest.approx(getattr(source.input_tokens, key), rel=0.15), (
            key
        )
        assert getattr(out.output_tokens, key) == pytest.approx(
            getattr(source.output_tokens, key), rel=0.15
        ), key
    assert out.arrival.interarrival_cv == pytest.approx(source.arrival.interarrival_cv, rel=0.2)
    assert source.prefix.reuse_ratio is not None and out.prefix.reuse_ratio is not None
    assert out.prefix.reuse_ratio == pytest.approx(source.prefix.reuse_ratio, abs=0.1)


def test_joint_lengths_are_sample_pairs_and_blocks_fit_the_prompt(mooncake_result: IngestResult) -> None:
    columns = mooncake_result.columns
    pairs = set(zip(columns.input_tokens.tolist(), columns.output_tokens.tolist(), strict=True))
    rows = [json.loads(line) for line in written(synth(mooncake_result, 31)).splitlines()]
    assert all((r["input_length"], r["output_length"]) in pairs for r in rows)
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)
    times = [r["timestamp"] for r in rows]
    assert times[0] == 0 and times == sorted(times) and all(isinstance(t, int) for t in times)
    assert list(rows[0]) == ["timestamp", "input_length", "output_length", "hash_ids"]


def test_a_segment_drawn_twice_is_not_a_free_cache_hit(mooncake_result: IngestResult) -> None:
    """With one segment spanning the whole sample, every copy must reuse no more than the sample."""
    size = mooncake_result.profile.num_requests
    trace = synthesize(
        mooncake_result,
        target_rps=3 * size / 1000,
        duration_s=1000,
        rng=np.random.default_rng(5),
        segment_requests=size,
    )
    out = ingest(io.BytesIO(written(trace))).profile
    assert out.num_requests == 3 * size
    assert out.prefix.reuse_ratio == pytest.approx(mooncake_result.profile.prefix.reuse_ratio, abs=1e-9)


def test_sources_without_prefixes_give_traces_without_hash_ids(azure_result: IngestResult) -> None:
    trace = synth(azure_result, 41, rps=1.25 * azure_result.profile.arrival.peak_rps_60s, duration=600)
    data = written(trace)
    assert b"hash_ids" not in data
    out = ingest(io.BytesIO(data)).profile
    assert out.prefix.reuse_ratio is None
    assert out.arrival.mean_rps == pytest.approx(1.25 * 8.45, rel=1e-3)


def test_prefix_sources_need_their_blocks(mooncake_path: object) -> None:
    from pathlib import Path

    from tuning.workload import ingest_path

    sample = ingest_path(Path(str(mooncake_path)), curve_max_blocks=0)
    with pytest.raises(ValueError, match="keep_blocks=True"):
        synth(sample, 1)
    with pytest.raises(ValueError, match="positive"):
        synthesize(sample, target_rps=0, duration_s=10, rng=np.random.default_rng(0))
