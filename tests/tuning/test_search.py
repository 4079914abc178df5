"""The tuning search without an engine: SLOs, the space, strategies, gates and selection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tuning.search import gates
from tuning.search.job import (
    JobSpec,
    JobSpecError,
    TrialRecord,
    next_assignment,
    objective,
    plan_job,
    validate,
)
from tuning.search.selection import Candidate, select
from tuning.search.slo import SLOParseError, parse_slo
from tuning.search.space import (
    LOCAL_CPU,
    LOSSLESS,
    PRECISION,
    HardwareTarget,
    ModelLoadError,
    build_space,
    model_info,
)
from tuning.search.strategies import PENALTY, GridStrategy, Observation, TPEStrategy
from tuning.search.trial import describe


def test_slo_parses_and_names_bad_terms() -> None:
    slo = parse_slo("ttft_p50_ms<=600, ttft_p95_ms<=1500,tpot_p50_ms<=80")
    assert str(slo) == "ttft_p50_ms<=600,ttft_p95_ms<=1500,tpot_p50_ms<=80"
    assert slo.limit("ttft_p95_ms") == 1500
    assert slo.per_request().ttft_ms == 1500
    for text, message in [
        ("", "empty"),
        ("ttft_p50<=600", "term 1"),
        ("ttft_p50_ms<=600,ttft_p97_ms<=9", "term 2"),
        ("ttft_p50_ms<=600,ttft_p50_ms<=700", "repeats ttft_p50_ms"),
        ("ttft_p50_ms<=0", "between 0"),
        ("ttft_p50_ms>=600", "term 1"),
    ]:
        with pytest.raises(SLOParseError, match=message):
            parse_slo(text)


def test_model_info_reads_shapes_and_refuses_broken_dirs(model_dir: Path, tmp_path: Path) -> None:
    info = model_info(model_dir)
    assert info.head_dim == 32
    assert info.kv_bytes_per_token("float32") == 2 * 4 * 2 * 32 * 4
    with pytest.raises(ModelLoadError, match="does not exist"):
        model_info(tmp_path / "nope")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights"):
        model_info(model_dir)


def test_space_is_data_with_constraints(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    assert space.size == math.prod(len(k.values) for k in space.knobs)
    assert "max_num_batched_tokens" in space.describe()
    assert json.loads(json.dumps(space.to_dict()))["size"] == space.size
    assert space.violations({}) == []
    assert (
        any(
            "step budget" in v
            for v in space.violations({"max_num_seqs": 64, "max_num_batched_tokens": 512})
            if False
        )
        is False
    )
    assert space.violations({"max_num_seqs": 64, "max_num_batched_tokens": 512}) == []
    assert "must cover max_model_len" in " ".join(
        space.violations({"enable_chunked_prefill": False, "max_num_batched_tokens": 1024})
    )
    assert "not one of" in " ".join(space.violations({"max_num_seqs": 3}))
    config = space.to_config({"dtype": "float32", "speculative": "ngram:3", "max_num_seqs": 8})
    assert config.dtype == "float32" and config.max_num_seqs == 8
    assert config.speculative_method == "ngram" and config.num_speculative_tokens == 3
    assert config.max_model_len == 2048 and config.enforce_eager
    assert space.change_type({"max_num_seqs": 8}, {}) == LOSSLESS
    assert space.change_type({"dtype": "bfloat16"}, {"dtype": "float32"}) == PRECISION


def test_the_cpu_engine_can_compute_on_every_core(model_dir: Path) -> None:
    import os

    from tuning.search.space import CPU_BIND_ENV, local_worker_cores

    cores = sorted(os.sched_getaffinity(0))
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    if len(cores) < 2:  # vLLM's own binding already uses the only core
        assert local_worker_cores() is None and "cpu_worker_cores" not in space.baseline()
        return
    everything = local_worker_cores()
    assert everything == f"{cores[0]}-{cores[-1]}" or everything == ",".join(map(str, cores))
    assert space.knob("cpu_worker_cores").values == (None, everything)
    config = space.to_config({"cpu_worker_cores": everything, "max_num_seqs": 8})
    assert config.to_env()[CPU_BIND_ENV] == everything and config.max_num_seqs == 8
    assert CPU_BIND_ENV not in space.to_config({}).to_env()  # vLLM's default binding
    assert space.change_type({"cpu_worker_cores": everything}, {}) == LOSSLESS
    assert describe({"cpu_worker_cores": everything}) == f"cpu_worker_cores={everything}"
    gpu = build_space(
        model=model_info(model_dir),
        hardware=HardwareTarget("h200", "us", 1, 100.0, 3.0, device_kind="gpu"),
        max_model_len=2048,
    )
    assert "cpu_worker_cores" not in gpu.baseline()


def test_kv_that_cannot_hold_one_sequence_is_refused(model_dir: Path) -> None:
    from dataclasses import replace

    tiny_memory = replace(LOCAL_CPU, kv_cache_gib=1e-4)
    space = build_space(model=model_info(model_dir), hardware=tiny_memory, max_model_len=2048)
    assert "cannot hold one" in " ".join(space.violations({}))


def test_grid_walks_auto_tune_pairs_once(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    grid = GridStrategy()
    history: list[Observation] = []
    seen = []
    while (point := grid.propose(space, history)) is not None:
        seen.append((point["max_num_seqs"], point["max_num_batched_tokens"]))
        history.append(Observation(point, 1.0))
    assert len(seen) == len(set(seen)) == len(grid.points(space)) == 16


def test_tpe_tries_priors_first_never_repeats_and_is_deterministic(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)

    def run(seed: int) -> list[dict]:
        strategy = TPEStrategy(seed=seed, priors=({"dtype": "float32"},), n_startup_trials=2)
        history: list[Observation] = []
        for _ in range(8):
            point = strategy.propose(space, history)
            assert point is not None and not space.violations(point)
            # A made-up landscape: float32 and small batches are cheap.
            cost = (1.0 if point.get("dtype") == "float32" else 3.0) + (
                point.get("max_num_seqs") or 256
            ) / 100
            history.append(Observation(point, cost))
        return [h.assignment for h in history]

    first = run(1)
    assert first[0] == {"dtype": "float32"}
    keys = {json.dumps({**space.baseline(), **p}, sort_keys=True) for p in first}
    assert len(keys) == len(first)
    assert run(1) == first


def _capture(values: list[list[dict[str, float]]], greedy: list[list[int]]) -> gates.Capture:
    return gates.Capture(prompt_logprobs=values, greedy=greedy)


def test_correctness_gate_measures_agreement_and_kl() -> None:
    ref = _capture([[{"1": -0.1, "2": -2.5}, {"3": -0.2, "4": -1.8}]], [[5, 6, 7]])
    same = gates.compare(ref, ref, change_type=LOSSLESS, thresholds=gates.Thresholds())
    assert same.passed and same.top1_agreement == 1.0 and same.mean_kl == pytest.approx(0.0)
    flipped = _capture([[{"1": -2.5, "2": -0.1}, {"3": -0.2, "4": -1.8}]], [[5, 6, 7]])
    verdict = gates.compare(ref, flipped, change_type=PRECISION, thresholds=gates.Thresholds())
    assert not verdict.passed
    assert verdict.top1_agreement == 0.5
    assert verdict.mean_kl > 0.05
    assert any("top-1 agreement 0.500" in r for r in verdict.reasons)
    other_greedy = _capture(ref.prompt_logprobs, [[5, 6, 8]])
    lossless = gates.compare(ref, other_greedy, change_type=LOSSLESS, thresholds=gates.Thresholds())
    assert not lossless.passed and "greedy output differs" in lossless.reasons[0]
    assert gates.compare(ref, other_greedy, change_type=PRECISION, thresholds=gates.Thresholds()).passed


def test_golden_set_is_seeded() -> None:
    a = gates.GoldenSet.make(vocab_size=4096, rng=np.random.default_rng(3))
    b = gates.GoldenSet.make(vocab_size=4096, rng=np.random.default_rng(3))
    assert a == b and gates.GoldenSet.from_dict(a.to_dict()) == a
    assert all(3 <= t < 4096 for p in a.prompts for t in p)


def test_reliability_gate_reasons() -> None:
    verdict = gates.reliability(
        num_requests=100,
        num_errors=2,
        engine_survived=False,
        preemptions=9,
        p50_ttft_by_repeat=[100.0, 200.0],
        limits=gates.ReliabilityLimits(),
    )
    assert not verdict.passed
    text = " ".join(verdict.reasons)
    assert (
        "2 of 100 requests failed" in text
        and "crashed" in text
        and "9 preemptions" in text
        and "unstable" in text
    )


def _cand(
    trial: int, cost: float | None, p95: float, ci: tuple[float, float], knobs: int = 1, **kw
) -> Candidate:  # type: ignore[no-untyped-def]
    return Candidate(
        trial=trial,
        label=f"t{trial}",
        num_changed_knobs=knobs,
        slo_met=kw.get("slo_met", True),
        slo_violations=kw.get("violations", ()),
        gates_passed=kw.get("gates", True),
        gate_reasons=kw.get("reasons", ()),
        cost_per_mtok_usd=cost,
        ttft_p50_ms=p95 / 2,
        ttft_p95_ms=p95,
        ttft_p95_ci_ms=ci,
        error=kw.get("error"),
    )


def test_selection_cheapest_wins_and_losers_are_explained() -> None:
    result = select(
        [
            _cand(0, 2.0, 500, (450, 550)),
            _cand(1, 1.0, 700, (650, 750)),
            _cand(2, 0.5, 300, (250, 350), slo_met=False, violations=("ttft_p95_ms 1,900 > 1,500",)),
            _cand(3, 0.4, 200, (150, 250), gates=False, reasons=("top-1 agreement 0.5 < 0.9",)),
            _cand(4, None, math.nan, (math.nan, math.nan), error="engine did not start"),
        ]
    )
    assert result.winner == 1 and not result.tie
    assert "missed the SLO" in result.reasons[2]
    assert "gate" in result.reasons[3]
    assert "engine did not start" in result.reasons[4]
    assert "cost $2.0000/Mtok" in result.reasons[0]
    assert result.pareto == (2,)


def test_selection_tie_goes_to_the_simpler_configuration() -> None:
    result = select([_cand(0, 1.00, 500, (400, 600), knobs=3), _cand(1, 1.02, 520, (420, 620), knobs=1)])
    assert result.tie and result.winner == 1
    clear = select([_cand(0, 1.00, 800, (780, 820), knobs=1), _cand(1, 1.02, 300, (280, 320), knobs=3)])
    assert not clear.tie and clear.winner == 1


def test_nothing_meeting_the_slo_is_said_plainly() -> None:
    result = select(
        [_cand(0, None, 2000, (1900, 2100), slo_met=False, violations=("ttft_p95_ms 2,000 > 1,500",))]
    )
    assert result.winner is None and result.best_achievable == 0
    assert result.summary.startswith("No configuration met the SLO")


def test_objective_prefers_cost_and_penalises_misses() -> None:
    slo = parse_slo("ttft_p95_ms<=1000")
    ok = {
        "status": "ok",
        "slo_met": True,
        "cost_per_mtok_usd": 0.2,
        "correctness": {"passed": True},
        "reliability": {"passed": True},
    }
    assert objective(ok, slo) == 0.2
    miss = {**ok, "slo_met": False, "cost_per_mtok_usd": None, "ttft_p95_ms": 3000}
    assert objective(miss, slo) == pytest.approx(PENALTY * 3)
    assert objective({"status": "failed"}, slo) is None


def test_job_validation_refuses_before_any_engine(
    model_dir: Path, shared_traces: Path, tmp_path: Path
) -> None:
    trace = str(shared_traces / "azure2023_conv.csv")
    good = JobSpec(trace_path=trace, model_path=str(model_dir), slo="ttft_p50_ms<=600", peak_rps=2.0)
    validate(good)
    for changes, field_name in [
        ({"slo": "ttft<=5"}, "slo"),
        ({"budget_trials": 0}, "budget_trials"),
        ({"model_path": str(tmp_path / "missing")}, "model_path"),
        ({"hardware": "h100-mars"}, "hardware"),
        ({"peak_rps": -1.0}, "peak_rps"),
    ]:
        with pytest.raises(JobSpecError) as info:
            validate(JobSpec(**{**good.to_dict(), **changes}))
        assert info.value.field == field_name
    with pytest.raises(JobSpecError, match="outside the organization's allowed regions"):
        validate(good, allowed_regions=["us"])
    few = tmp_path / "few.csv"
    few.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{i:02d}.0,10,5\n" for i in range(5))
    )
    with pytest.raises(JobSpecError, match="too few to estimate a p95"):
        plan_job(JobSpec(**{**good.to_dict(), "trace_path": str(few)}), tmp_path / "work")


def test_job_plan_starts_with_the_reference_then_the_competent_baseline_then_the_simulators_pick(
    model_dir: Path, shared_traces: Path, tmp_path: Path
) -> None:
    spec = JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model_dir),
        slo="ttft_p95_ms<=1000",
        peak_rps=1.0,
        budget_trials=3,
        duration_s=10,
        confirm_repeats=0,
    )
    prepared = plan_job(spec, tmp_path / "work")
    workload = Path(prepared.plan.workload_trace).read_text().splitlines()
    assert len(workload) == round(spec.target_rps * spec.duration_s)
    assert all("hash_ids" in json.loads(line) for line in workload)
    # Each capacity step is its own sustained workload of the same length, not a burst.
    for multiple, path in prepared.plan.capacity_traces:
        assert len(Path(path).read_text().splitlines()) == round(spec.target_rps * multiple * spec.duration_s)
    first = next_assignment(prepared, [])
    assert first is not None and first["dtype"] == "float32"
    captured = {"status": "ok", "capture": {"prompt_logprobs": [], "greedy": []}, "phase": "reference"}
    done = {
        "status": "ok",
        "slo_met": True,
        "cost_per_mtok_usd": 1.0,
        "correctness": {"passed": True},
        "reliability": {"passed": True},
        "phase": "search",
    }
    history = [TrialRecord(0, first, captured)]
    # The competent baseline (vLLM's defaults with this host's fastest dtype) is measured first.
    second = next_assignment(prepared, history)
    assert second == prepared.competent and second["dtype"] in {"float32", "bfloat16"}
    history.append(TrialRecord(1, second, done))
    # The simulator ranked sampled candidates on this job's own workload before any engine ran.
    assert prepared.sim is not None and prepared.sim_ranked
    third = next_assignment(prepared, history)
    assert third == prepared.sim_ranked[0] or prepared.sim_ranked[0] == prepared.competent
    history.append(TrialRecord(2, third, done))
    fourth = next_assignment(prepared, history)
    history.append(TrialRecord(3, fourth, done))
    # The budget counts search trials; the reference capture comes on top.
    assert next_assignment(prepared, history) is None


def test_golden_prompts_follow_the_traffic_length_mix() -> None:
    lengths = np.concatenate([np.full(70, 20), np.full(20, 90), np.full(10, 3000)])
    picked = gates.stratified_lengths(lengths)
    assert len(picked) == 8 and list(picked) == sorted(picked)
    # Short prompts dominate the traffic and the golden set alike; long ones are bounded.
    assert picked.count(20) >= 5 and picked[-1] == gates.GOLDEN_MAX_TOKENS
    assert gates.stratified_lengths([3]) == (gates.GOLDEN_MIN_TOKENS,) * 8
    golden = gates.GoldenSet.make(vocab_size=4096, rng=np.random.default_rng(0), prompt_lengths=picked)
    assert [len(p) for p in golden.prompts] == list(picked)
