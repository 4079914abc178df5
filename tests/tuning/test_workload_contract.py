"""The profile contract (DESIGN.md) on the shared public traces, against a plain recomputation.

The expected numbers are computed here from the raw files with the csv/json modules and numpy,
sharing no code with `tuning.workload`.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuning.workload import IngestResult

CONTRACT_KEYS = {"num_requests", "duration_s", "input_tokens", "output_tokens", "arrival", "prefix"}
STAT_KEYS = {"mean", "p50", "p90", "p95", "p99", "max"}


def expected_profile(arrival_s: np.ndarray, inputs: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """The contract, computed the plainest way."""
    t = arrival_s - arrival_s[0]
    duration = float(t[-1])
    gaps = np.diff(arrival_s)
    windows = np.floor(t / 60.0).astype(int)
    counts = np.bincount(windows)

    def stats(x: np.ndarray) -> dict[str, float]:
        return {
            "mean": float(np.mean(x)),
            "p50": float(np.percentile(x, 50)),
            "p90": float(np.percentile(x, 90)),
            "p95": float(np.percentile(x, 95)),
            "p99": float(np.percentile(x, 99)),
            "max": float(np.max(x)),
        }

    return {
        "num_requests": len(t),
        "duration_s": duration,
        "input_tokens": stats(inputs),
        "output_tokens": stats(outputs),
        "arrival": {
            "mean_rps": len(t) / duration,
            "peak_rps_60s": counts.max() / 60.0,
            "interarrival_cv": float(np.std(gaps) / np.mean(gaps)),
        },
    }


def assert_matches(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual["num_requests"] == expected["num_requests"]
    assert actual["duration_s"] == pytest.approx(expected["duration_s"], rel=1e-12)
    for side in ("input_tokens", "output_tokens"):
        assert set(actual[side]) == STAT_KEYS
        for key in STAT_KEYS:
            assert actual[side][key] == pytest.approx(expected[side][key], rel=1e-12), (side, key)
    assert actual["arrival"]["peak_rps_60s"] == expected["arrival"]["peak_rps_60s"]
    for key in ("mean_rps", "interarrival_cv"):
        assert actual["arrival"][key] == pytest.approx(expected["arrival"][key], rel=1e-9), key


def test_mooncake_contract_numbers(mooncake_path: Path, mooncake_result: IngestResult) -> None:
    rows = [json.loads(line) for line in mooncake_path.read_text().splitlines() if line.strip()]
    arrival_s = np.array([r["timestamp"] for r in rows], dtype=float) / 1000.0
    inputs = np.array([r["input_length"] for r in rows])
    outputs = np.array([r["output_length"] for r in rows])
    actual = json.loads(json.dumps(mooncake_result.profile.to_json_dict()))
    assert set(actual) >= CONTRACT_KEYS
    assert_matches(actual, expected_profile(arrival_s, inputs, outputs))

    # reuse: leading blocks whose ids occurred in any earlier request, 512 tokens each
    seen: set[int] = set()
    covered = 0
    for r in rows:
        reused = 0
        for block in r["hash_ids"]:
            if block not in seen:
                break
            reused += 1
        covered += min(reused * 512, r["input_length"])
        seen.update(r["hash_ids"])
    assert actual["prefix"]["reuse_ratio"] == pytest.approx(covered / inputs.sum(), rel=1e-12)
    assert actual["prefix"]["unique_blocks"] == len(seen)
    assert actual["format"] == "mooncake"


def test_azure_contract_numbers(azure_path: Path, azure_result: IngestResult) -> None:
    with azure_path.open(encoding="utf-8-sig", newline="") as handle:
        table = list(csv.DictReader(handle))
    nanos = []
    for row in table:
        whole, _, fraction = row["TIMESTAMP"].partition(".")
        second = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        nanos.append(int(second.timestamp()) * 10**9 + int(fraction.ljust(9, "0")))
    ns = np.array(nanos, dtype=np.int64)
    arrival_s = (ns - ns[0]) / 1e9
    inputs = np.array([int(r["ContextTokens"]) for r in table])
    outputs = np.array([int(r["GeneratedTokens"]) for r in table])
    actual = json.loads(json.dumps(azure_result.profile.to_json_dict()))
    assert set(actual) >= CONTRACT_KEYS
    assert_matches(actual, expected_profile(arrival_s, inputs, outputs))
    assert actual["prefix"]["reuse_ratio"] is None
    assert actual["format"] == "azure"
    assert actual["num_requests"] == 19366


def test_reuse_curve_ends_at_the_unbounded_ratio(mooncake_result: IngestResult) -> None:
    curve = mooncake_result.charts.reuse_curve
    assert curve is not None
    assert curve.num_requests_used == mooncake_result.profile.num_requests
    ratios = np.array(curve.hit_ratio)
    assert np.all(np.diff(ratios) >= 0), "LRU is a stack algorithm: a bigger cache never hits less"
    assert ratios[-1] == pytest.approx(mooncake_result.profile.prefix.reuse_ratio, rel=1e-12)
    assert curve.cache_size_blocks[-1] == mooncake_result.profile.prefix.unique_blocks


def test_reuse_curve_matches_a_plain_lru_simulation(
    mooncake_path: Path, mooncake_result: IngestResult
) -> None:
    """At a few cache sizes, replay the first 600 requests through an OrderedDict LRU."""
    from collections import OrderedDict

    from tuning.workload.columns import lru_reuse_curve

    rows = [json.loads(line) for line in mooncake_path.read_text().splitlines()[:600]]
    ids = np.array([b for r in rows for b in r["hash_ids"]], dtype=np.int64)
    counts = np.array([len(r["hash_ids"]) for r in rows], dtype=np.int64)
    tokens = np.array([r["input_length"] for r in rows], dtype=np.int64)
    sizes, ratios = lru_reuse_curve(ids, counts, tokens, 512, 12)
    for size, ratio in zip(sizes.tolist(), ratios.tolist(), strict=True):
        cache: OrderedDict[int, None] = OrderedDict()
        hit = 0
        for r in rows:
            reusing = True
            for k, block in enumerate(r["hash_ids"]):
                present = block in cache
                if present:
                    cache.move_to_end(block)
                else:
                    cache[block] = None
                    if len(cache) > size:
                        cache.popitem(last=False)
                reusing = reusing and present
                if reusing:
                    hit += min(512, r["input_length"] - k * 512)
        assert ratio == pytest.approx(hit / tokens.sum(), abs=1e-12), size


def test_chart_data_is_consistent(azure_result: IngestResult) -> None:
    charts = azure_result.charts
    profile = azure_result.profile
    rate = charts.arrival_rate
    assert sum(r * rate.bin_s for r in rate.rate_rps) == pytest.approx(profile.num_requests)
    assert rate.peak_rps_60s == profile.arrival.peak_rps_60s
    assert rate.peak_window_end_s - rate.peak_window_start_s == 60
    assert sum(charts.input_tokens.counts) == profile.num_requests
    assert sum(charts.output_tokens.counts) == profile.num_requests
    gaps = charts.interarrival
    assert gaps.num_zero_gaps + sum(gaps.positive_gaps_s.counts) == profile.num_requests - 1
    assert charts.reuse_curve is None
    assert max(charts.concurrency.max_in_flight) >= 1
    assert len(rate.rate_rps) <= 720
    json.dumps(charts.to_json_dict())  # JSON-ready
