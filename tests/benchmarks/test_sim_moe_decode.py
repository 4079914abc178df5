"""benchmarks/sim_moe_decode.py on a made-up kernels_e2e result: the MoE op is read at the key vLLM
uses, only the default arm's measured rounds are scored, and every figure carries its interval."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import sim_moe_decode as smd
from serving.perf.model import load_efficiency


def test_the_moe_op_is_read_at_the_key_vllm_uses() -> None:
    assert smd.nearest_key([1, 2, 4, 8, 16, 24, 32], 3) == 2  # a tie goes to the smaller key
    assert smd.nearest_key([1, 2, 4, 8, 16, 24, 32], 20) == 16
    assert smd.nearest_key([1, 2, 4, 8, 16, 24, 32], 500) == 32
    case = {"tables": {"uniform": None, "traffic-t": {"buckets": [
        {"key": 1, "engine": {"time_us": 30.0}},
        {"key": 64, "engine": {"time_us": 170.0}},
        {"key": 256, "engine": None},
    ]}}}  # fmt: skip
    assert smd.measured_moe_us(case, 1) == 30.0
    assert smd.measured_moe_us(case, 200) == 170.0  # 256 has no engine timing: not a key
    assert smd.measured_moe_us({"tables": {}}, 8) is None


def test_only_the_default_arms_measured_rounds_are_scored() -> None:
    rng = np.random.default_rng(0)

    def block(arm: str, round_: int, tpot: float) -> dict[str, object]:
        return {
            "arm": arm,
            "round": round_,
            "steady": {"16": {"tpot_ms": list(tpot + rng.normal(0, 0.01, 32)), "tpot_p50_ms": tpot}},
        }

    blocks = [block("default", r, 10.0) for r in range(3)] + [block("traffic", r, 99.0) for r in range(3)]
    blocks.append(block("default", -1, 500.0))  # a warm-up round
    result = {
        "method": {"steady_decode": {"prompt_tokens": 128, "output_tokens": 32}},
        "plan": {"engine_config": {"load_format": "dummy", "max_model_len": 4096}},
        "cases": {
            "qwen3-30b-a3b-e64/azure_conv": {
                "blocks": blocks,
                "tables": {"traffic-azure_conv": {"buckets": [{"key": 16, "engine": {"time_us": 140.0}}]}},
            }
        },
    }
    without = load_efficiency("h200", moe=False)
    assert without is not None
    case = smd.score(result, without, "h200")["cases"]["qwen3-30b-a3b-e64/azure_conv"]
    row = case["batches"]["16"]
    assert row["blocks"] == 3
    measured = row["measured_tpot_p50_ms"]
    assert measured["ci_low"] <= measured["value"] <= measured["ci_high"]
    assert abs(measured["value"] - 10.0) < 0.05  # neither the traffic arm nor the warm-up
    ratio = row["predicted_over_measured"]
    assert ratio["ci_low"] <= ratio["value"] <= ratio["ci_high"]
    assert row["moe_ms_per_step"]["measured"] == round(case["moe_layers"] * 140.0 / 1e3, 4)
    assert row["predicted_tpot_p50_ms"] > 0
    mape = case["tpot_mape"]
    assert mape["ci_low"] <= mape["value"] <= mape["ci_high"]
    assert mape["value"] == round(abs(ratio["value"] - 1.0), 4)


def test_the_moe_op_is_fitted_on_its_own_timings() -> None:
    # An op that streams the experts its tokens hit at 80% of the H200's bandwidth after a 15 us
    # floor, and reaches 30% of the bf16 peak on prefill chunks: the fit gives those back.
    from serving.catalog.hardware import get_hardware

    spec = smd.model_spec("qwen3-30b-a3b-e64")
    hw = get_hardware("h200")
    expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    e, k = spec.num_experts, spec.num_experts_per_token
    buckets = []
    for tokens in (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048, 4096):
        if tokens <= smd.MEMORY_BOUND_TOKENS:
            seconds = 15e-6 + e * (1 - (1 - k / e) ** tokens) * expert * 2 / (
                hw.memory_bandwidth_bytes_per_s * 0.8
            )
        else:
            seconds = 15e-6 + 2 * k * tokens * expert / (hw.peak_flops("bf16") * 0.3)
        buckets.append({"key": tokens, "engine": {"time_us": seconds * 1e6}})
    result = {"cases": {"qwen3-30b-a3b-e64/t": {"tables": {"traffic-t": {"buckets": buckets}}}}}
    fitted = smd.fit_moe_op(result)["fitted"]
    assert fitted["moe_floor_us"] == pytest.approx(15.0, abs=0.01)
    assert fitted["moe_memory_efficiency"] == pytest.approx(0.8, abs=1e-3)
    assert fitted["moe_gemm_efficiency"] == pytest.approx(0.3, abs=1e-3)
    with pytest.raises(SystemExit):  # too few timings: refused, nothing written
        smd.fit_moe_op({"cases": {"qwen3-30b-a3b-e64/t": {"tables": {}}}})
