"""The traffic-weighted fused-MoE tuner: budget shares, choices, refusals, and (in Triton's
interpreter on a CPU) candidate configurations checked against the torch reference.

Timings are injected: nothing here measures speed or asserts one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from kernels import moe_tuning as mtu
from kernels.moe_tuning import MoEShape, TuneBucket, TuningWontFit
from serving.engine import EngineConfig, moe_tables
from tailguard import moe_step
from tests.kernels.device import DEVICE, ON_GPU

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def _cfg(
    bm: int, bn: int = 64, bk: int = 32, group: int = 1, warps: int = 4, stages: int = 2
) -> dict[str, int]:
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


def _model_bench(cfg: Mapping[str, int], tokens: int) -> float:
    """A stand-in cost: the row block that wastes least padding on `tokens` rows wins (16 us floor)."""
    bm = cfg["BLOCK_SIZE_M"]
    return 16.0 + (-(-tokens // bm) * bm - tokens) + 0.01 * cfg["BLOCK_SIZE_N"]


def test_budget_goes_where_the_traffic_spends_its_time() -> None:
    buckets = [
        TuneBucket(1, 0.5, ((1, 1.0),)),
        TuneBucket(16, 0.25, ((19, 0.5), (20, 0.5))),
        TuneBucket(1024, 0.25, ((1031, 1.0),)),
    ]
    pool = mtu.candidate_pool(64)
    plan = mtu.plan(buckets, pool, budget=40, min_per_bucket=4)
    # 28 trials left after three floors of 4, shared 0.5 / 0.25 / 0.25.
    assert plan.per_bucket == (4 + 14, 4 + 7, 4 + 7)
    assert plan.num_timings == 18 * 1 + 11 * 2 + 11 * 1  # each candidate at each of its points
    # A bucket never gets more candidates than the pool holds.
    assert mtu.plan(buckets, pool[:5], budget=40).per_bucket == (5, 5, 5)
    uniform = mtu.plan(mtu.uniform_buckets(moe_tables.BATCH_SIZE_KEYS), pool, budget=72)
    assert uniform.per_bucket == (4,) * 18  # vLLM's grid, every key alike
    with pytest.raises(ValueError, match="cannot give 18 buckets 4 candidates"):
        mtu.plan(mtu.uniform_buckets(moe_tables.BATCH_SIZE_KEYS), pool, budget=36)


def test_each_bucket_tries_row_tiles_that_suit_its_token_count() -> None:
    # The H200 run of 2026-12-02 (benchmarks/results/kernels_e2e_run1_blind_tiles.json): with
    # ~5 candidates per bucket, every bucket tried the same first candidates of the pool, all BLOCK_SIZE_M 16, and
    # the tuned tables ran prefill 15x slower (p95 TTFT) than vLLM's generic default.
    shape = MoEShape(num_experts=64, shard_intermediate_size=768, hidden_size=2048, top_k=8)
    assert [mtu.preferred_block_m(t, shape) for t in (1, 64, 256, 512, 4096)] == [16, 16, 32, 64, 128]
    pool = mtu.candidate_pool(96)
    buckets = mtu.uniform_buckets(moe_tables.BATCH_SIZE_KEYS)
    blind = mtu.plan(buckets, pool, budget=96, min_per_bucket=5)
    assert {c["BLOCK_SIZE_M"] for i in range(len(buckets)) for c in blind.bucket_candidates(i)} == {16}
    plan = mtu.plan(buckets, pool, budget=96, min_per_bucket=5, shape=shape)
    by_key = {b.key: plan.bucket_candidates(i) for i, b in enumerate(plan.buckets)}
    assert {c["BLOCK_SIZE_M"] for c in by_key[4096]} == {128}
    assert {c["BLOCK_SIZE_M"] for c in by_key[512]} == {64}
    assert {c["BLOCK_SIZE_M"] for c in by_key[1]} == {16}
    # Same number of trials as before, distinct configurations within a bucket, and the plan
    # records what each bucket tried.
    assert plan.per_bucket == blind.per_bucket
    assert all(len({tuple(sorted(c.items())) for c in cands}) == len(cands) for cands in by_key.values())
    assert plan.to_dict()["buckets"][-1]["block_m_tried"] == [128]
    # The tuner runs exactly the planned candidates of each bucket.
    seen: dict[int, list[int]] = {}

    def bench(cfg: Mapping[str, int], tokens: int) -> float:
        seen.setdefault(tokens, []).append(cfg["BLOCK_SIZE_M"])
        return 1.0

    mtu.tune(plan, bench)
    assert set(seen[4096]) == {128} and set(seen[1]) == {16}


def test_plan_refuses_unbounded_or_empty_work() -> None:
    one = [TuneBucket(1, 1.0, ((1, 1.0),))]
    with pytest.raises(ValueError, match="budget must be in"):
        mtu.plan(one, [_cfg(16)], budget=mtu.MAX_TRIALS + 1)
    with pytest.raises(ValueError, match="no buckets"):
        mtu.plan([], [_cfg(16)], budget=10)
    with pytest.raises(ValueError, match="no candidate"):
        mtu.plan(one, [], budget=10)
    with pytest.raises(ValueError, match="duplicate bucket keys"):
        mtu.plan(one * 2, [_cfg(16)], budget=10)
    with pytest.raises(ValueError, match="bucket key"):
        TuneBucket(0, 1.0, ((1, 1.0),))
    with pytest.raises(ValueError, match="token counts"):
        TuneBucket(4, 1.0, tuple((i + 1, 0.1) for i in range(mtu.MAX_POINTS + 1)))


def test_tune_picks_the_lowest_weighted_time_and_records_failures() -> None:
    buckets = [TuneBucket(1, 0.5, ((1, 1.0),)), TuneBucket(256, 0.5, ((200, 0.25), (256, 0.75)))]
    pool = [_cfg(16), _cfg(128), _cfg(64), _cfg(256)]

    def bench(cfg: Mapping[str, int], tokens: int) -> float:
        if cfg["BLOCK_SIZE_M"] == 256:
            raise RuntimeError("out of shared memory")
        return _model_bench(cfg, tokens)

    result = mtu.tune(mtu.plan(buckets, pool, budget=8, min_per_bucket=4), bench)
    assert result.complete
    table = result.table()
    assert table[1]["BLOCK_SIZE_M"] == 16
    # 200 rows: 16 -> 208 (8 wasted), 64 -> 256 (56), 128 -> 256 (56); 256 rows: none wasted by any.
    assert table[256]["BLOCK_SIZE_M"] == 16
    failed = [t for c in result.choices for t in c.trials if t.time_us is None]
    assert len(failed) == 2 and all("out of shared memory" in (t.error or "") for t in failed)
    expected = 0.5 * _model_bench(_cfg(16), 1) + 0.5 * (
        0.25 * _model_bench(_cfg(16), 200) + 0.75 * _model_bench(_cfg(16), 256)
    )
    assert result.weighted_time_us() == pytest.approx(expected)
    # The table, evaluated the way vLLM looks entries up, gives back the same figure.
    assert mtu.evaluate(table, buckets, _model_bench) == pytest.approx(expected)


def test_a_stopped_run_is_partial_and_keeps_the_heaviest_buckets() -> None:
    buckets = [TuneBucket(1, 0.1, ((1, 1.0),)), TuneBucket(64, 0.9, ((64, 1.0),))]
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 1

    result = mtu.tune(
        mtu.plan(buckets, [_cfg(16), _cfg(64)], budget=4, min_per_bucket=2), _model_bench, should_stop=stop
    )
    assert not result.complete
    assert list(result.table()) == [64]


def test_the_engines_own_configuration_is_timed_and_kept_where_nothing_beats_it() -> None:
    # The H200 run of 2026-12-03 (benchmarks/results/kernels_e2e_run2.json) found the traffic-weighted
    # table no faster end to end than vLLM's generic default, and had no kernel-level figure
    # against it: the engine's configuration is now a timed, eligible candidate of every bucket.
    buckets = [TuneBucket(1, 0.5, ((1, 1.0),)), TuneBucket(256, 0.5, ((256, 1.0),))]
    pool = [_cfg(64), _cfg(128)]  # neither suits one token (64 or 128 rows for 1)

    def engine(tokens: int) -> dict[str, int]:
        return {**_cfg(16 if tokens <= 32 else 128), "SPLIT_K": 1}  # vLLM adds keys we do not tune

    result = mtu.tune(mtu.plan(buckets, pool, budget=4, min_per_bucket=2), _model_bench, baseline=engine)
    one, many = result.choices
    assert one.best_is_baseline and result.table()[1] == _cfg(16)  # the engine's 16 rows win
    assert not many.best_is_baseline  # a tie: a candidate timed as fast as the engine is kept
    assert many.baseline is not None and many.baseline.config == _cfg(128)
    # Both buckets: the engine's time over the table's is 1.0 where the table kept or tied it.
    assert result.speedup_vs_baseline() == pytest.approx(1.0)
    record = result.to_dict()["buckets"][0]
    assert record["best_is_engine"] and record["engine"]["time_us"] == pytest.approx(
        _model_bench(_cfg(16), 1)
    )

    # An engine running 128-row tiles everywhere: the table's 64 rows beat it at one token.
    faster = mtu.tune(
        mtu.plan(buckets, pool, budget=4, min_per_bucket=2), _model_bench, baseline=lambda tokens: _cfg(128)
    )
    engine_time = 0.5 * _model_bench(_cfg(128), 1) + 0.5 * _model_bench(_cfg(128), 256)
    table_time = 0.5 * _model_bench(_cfg(64), 1) + 0.5 * _model_bench(_cfg(64), 256)
    assert faster.speedup_vs_baseline() == pytest.approx(engine_time / table_time)
    assert faster.speedup_vs_baseline() > 1.5

    def broken(tokens: int) -> dict[str, int]:
        raise RuntimeError("no such op in this vLLM")

    plain = mtu.tune(mtu.plan(buckets, pool, budget=4, min_per_bucket=2), _model_bench, baseline=broken)
    assert plain.speedup_vs_baseline() is None
    assert plain.baseline_coverage() == 0.0 and result.baseline_coverage() == pytest.approx(1.0)
    assert plain.to_dict()["kernel_speedup_vs_engine_weight_covered"] == 0.0
    assert all(c.baseline is not None and "no such op" in (c.baseline.error or "") for c in plain.choices)
    assert plain.table() == {1: _cfg(64), 256: _cfg(64)}  # the candidates alone, first of a tie


def test_runs_that_would_not_fit_are_refused_before_starting() -> None:
    shape = MoEShape(num_experts=128, shard_intermediate_size=768, hidden_size=2048, top_k=8)
    buckets = [TuneBucket(k, 1.0, ((k, 1.0),)) for k in (1, 4096)]
    plan = mtu.plan(buckets, [_cfg(16), _cfg(64)], budget=4)
    assert mtu.check_fits(plan, shape, seconds_per_timing=1.0, time_budget_s=10.0) == pytest.approx(4.0)
    with pytest.raises(TuningWontFit, match="over the budget of 3 s"):
        mtu.check_fits(plan, shape, seconds_per_timing=1.0, time_budget_s=3.0)
    with pytest.raises(TuningWontFit, match=r"more than the device's 1\.0 GiB"):
        mtu.check_fits(plan, shape, seconds_per_timing=1.0, time_budget_s=10.0, device_memory_bytes=2**30)
    with pytest.raises(ValueError, match="top_k 9 exceeds"):
        MoEShape(num_experts=8, shard_intermediate_size=16, hidden_size=16, top_k=9)


def test_candidate_pool_is_bounded_distinct_and_in_vllms_terms() -> None:
    pool = mtu.candidate_pool(200)
    assert len(pool) == 200
    assert len({tuple(c[k] for k in mtu.VLLM_KEYS) for c in pool}) == 200
    for i, cfg in enumerate(pool):
        moe_tables.check_entry(cfg, f"pool[{i}]")  # every candidate is a valid table entry
        assert mtu.to_vllm(mtu.from_vllm(cfg)) == cfg
    with pytest.raises(ValueError, match="limit"):
        mtu.candidate_pool(0)


# A shape the interpreter runs in well under a second per call.
TINY = MoEShape(num_experts=4, shard_intermediate_size=16, hidden_size=32, top_k=2)


def test_candidates_are_checked_against_the_reference_in_the_kernel() -> None:
    check = mtu.moe_gemm_check(TINY, device=DEVICE, seed=1)
    buckets = [TuneBucket(1, 0.6, ((1, 1.0),)), TuneBucket(8, 0.4, ((7, 0.5), (9, 0.5)))]
    good = [_cfg(16, 32, 32), _cfg(32, 16, 16, group=2)]
    broken = _cfg(16) | {"BLOCK_SIZE_K": 0}  # no K tile: the launch must fail, not be chosen
    result = mtu.tune(
        mtu.plan(buckets, [broken, *good], budget=6, min_per_bucket=3), _model_bench, check=check
    )
    table = result.table()
    assert set(table) == {1, 8}
    assert all(cfg in good for cfg in table.values())
    errors = [t.error for c in result.choices for t in c.trials if t.time_us is None]
    assert len(errors) == 2 and all(errors)


def test_check_catches_a_configuration_that_computes_the_wrong_thing() -> None:
    check = mtu.moe_gemm_check(TINY, device=DEVICE, seed=2, tol=-1.0)  # no error is small enough
    with pytest.raises(ValueError, match="relative error"):
        check(_cfg(16, 32, 32), 3)


@pytest.mark.skipif(ON_GPU, reason="the CPU path: the GPU path times kernels, which tests never assert")
def test_gpu_bench_says_it_needs_a_gpu() -> None:
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        mtu.moe_gemm_bench(TINY)


# -- the job step: traffic sample -> simulator -> buckets -> tuner -> vLLM's table ---------------


def test_job_step_writes_a_traffic_weighted_table_vllm_reads(tmp_path: Path) -> None:
    config = EngineConfig(max_num_batched_tokens=2048)
    sample = moe_step.step_sample(
        TRACES / "azure2023_conv.csv", model="qwen3-30b-a3b", hardware="h200", config=config, max_requests=60
    )
    assert sum(s for s, _ in sample.step_tokens.values()) > 0
    assert max(sample.step_tokens) <= 2048  # the step budget bounds every step
    planned = moe_step.plan_tables(
        model="qwen3-30b-a3b",
        config=config,
        gpu_name="NVIDIA H200",
        sample=sample,
        budget=60,
        time_budget_s=600,
        pool_size=40,
        min_per_bucket=2,
    )
    assert planned.table.file_name == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert planned.mode == "traffic" and sum(planned.plan.per_bucket) <= 60
    heaviest = max(planned.buckets, key=lambda b: b.weight)
    assert planned.plan.per_bucket[planned.buckets.index(heaviest)] == max(planned.plan.per_bucket)
    path, result = moe_step.run_tables(planned, _model_bench, tmp_path)
    assert path is not None and result.complete
    table = moe_tables.read_table(path, expect=planned.table)
    assert set(table) == {b.key for b in planned.buckets}
    # A tensor-parallel split is a table of its own.
    tp2 = moe_step.plan_tables(
        model="qwen3-30b-a3b",
        config=EngineConfig(tensor_parallel_size=2),
        gpu_name="NVIDIA H200",
        sample=None,
        budget=72,
        time_budget_s=600,
        pool_size=8,
    )
    assert tp2.table.file_name == "E=128,N=384,device_name=NVIDIA_H200.json"
    assert tp2.mode == "uniform" and [b.key for b in tp2.plan.buckets] == list(moe_tables.BATCH_SIZE_KEYS)


@pytest.mark.parametrize(
    ("model", "config", "reason"),
    [
        ("llama-3.1-8b", EngineConfig(), "not a mixture-of-experts model"),
        ("qwen3-30b-a3b", EngineConfig(quantization="fp8"), "quantization 'fp8'"),
        ("qwen3-30b-a3b", EngineConfig(dtype="float32"), "only bf16/fp16"),
        ("qwen3-30b-a3b", EngineConfig(tensor_parallel_size=5), "does not split"),
    ],
)
def test_job_step_refuses_what_has_no_table(model: str, config: EngineConfig, reason: str) -> None:
    with pytest.raises(moe_step.NotTunable, match=reason):
        moe_step.plan_tables(
            model=model, config=config, gpu_name="NVIDIA H200", sample=None, budget=100, time_budget_s=60
        )


def test_job_step_refuses_a_run_over_its_device_time() -> None:
    with pytest.raises(TuningWontFit, match="over the budget"):
        moe_step.plan_tables(
            model="qwen3-30b-a3b",
            config=EngineConfig(),
            gpu_name="NVIDIA H200",
            sample=None,
            budget=5000,
            time_budget_s=60,
            seconds_per_timing=0.05,
        )
