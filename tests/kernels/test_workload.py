"""The profile -> bucket model is pure Python: exact assertions, no GPU, no triton."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kernels.workload import EngineAssumptions, ProfileError, buckets_from_profile
from tests.kernels.helpers import PROFILE

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "profiles"


def test_weights_sum_to_one_and_buckets_are_powers_of_two() -> None:
    b = buckets_from_profile(PROFILE)
    assert sum(b.token_buckets.values()) == pytest.approx(1.0)
    assert sum(b.attention_buckets.values()) == pytest.approx(1.0)
    assert all(k & (k - 1) == 0 and 1 <= k <= 8192 for k in b.token_buckets)


def test_littles_law_sets_the_decode_batch() -> None:
    # mean: 10 rps * 200 tokens * 0.025 s = 50 running; peak: 20 rps -> 100
    b = buckets_from_profile(PROFILE)
    assert b.decode_batches["mean"][0] == 50
    assert b.decode_batches["peak"][0] == 100
    # longest context: the prompt quantile at 50/51 (7750) + 100 and at 100/101 (~8750) + 100
    assert set(b.attention_buckets) == {"b64_c8192", "b128_c16384"}
    # decode-only steps dominate: the buckets holding 50 and 100 tokens carry most weight
    assert b.token_buckets[64] + b.token_buckets[128] > 0.5


def test_prefill_chunks_respect_the_budget() -> None:
    b = buckets_from_profile(PROFILE, EngineAssumptions(max_batched_tokens=2048))
    assert max(b.token_buckets) == 2048


def test_running_sequences_are_capped() -> None:
    busy = copy.deepcopy(PROFILE)
    busy["arrival"] = {"mean_rps": 1000.0, "peak_rps_60s": 2000.0, "interarrival_cv": 1.0}
    b = buckets_from_profile(busy, EngineAssumptions(max_num_seqs=64))
    assert b.decode_batches["peak"][0] == 64


def test_a_step_histogram_replaces_the_model() -> None:
    b = buckets_from_profile(PROFILE, step_tokens={3: 1.0, 100: 3.0})
    assert b.token_buckets == {4: 0.25, 128: 0.75}


def test_missing_fields_are_named() -> None:
    broken = copy.deepcopy(PROFILE)
    del broken["input_tokens"]["p90"]
    with pytest.raises(ProfileError, match=r"input_tokens\.p90"):
        buckets_from_profile(broken)
    with pytest.raises(ProfileError, match="arrival"):
        buckets_from_profile({"input_tokens": {}, "output_tokens": {}})


@pytest.mark.parametrize("name", ["azure2023_conv", "mooncake_synthetic"])
def test_shipped_profiles_give_buckets(name: str) -> None:
    b = buckets_from_profile(json.loads((PROFILES / f"{name}.json").read_text()))
    assert sum(b.token_buckets.values()) == pytest.approx(1.0)
    assert len(b.token_buckets) >= 3
