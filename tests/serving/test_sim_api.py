"""Simulator end to end: same outputs as the load generator, prefix sharing, ranking, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.catalog import get_hardware, get_model
from serving.engine import EngineConfig
from serving.loadgen.results import ReplaySummary, RequestResult
from serving.loadgen.traces import TraceRequest
from serving.sim import LatencyTargets, max_rate_scale, rank_candidates, simulate, simulate_trace
from serving.sim.simulator import prompt_block_hashes, resolve_config

CPU_CONFIG = EngineConfig.cpu_default(max_model_len=4096, cpu_kv_cache_space_gib=1)


def poisson_trace(n: int, rate: float, prompt: int, output: int, seed: int = 0) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return [TraceRequest(float(t - times[0]), prompt, output) for t in times]


def test_outputs_are_the_load_generators_types_with_its_token_counts() -> None:
    trace = poisson_trace(50, 5.0, 3000, 40)
    result = simulate(
        trace,
        model=get_model("tiny-llama-s"),
        hardware=get_hardware("local-cpu"),
        config=CPU_CONFIG,
        max_prompt_tokens=1000,
        max_output_tokens=16,
        record_itl=True,
    )
    assert isinstance(result.summary, ReplaySummary)
    assert all(isinstance(r, RequestResult) for r in result.requests)
    first = result.requests[0]
    assert first.num_prompt_tokens == 1000 and first.max_output_tokens == 16 and first.num_output_tokens == 16
    assert len(first.itl_ms) == 15 and first.tpot_ms == pytest.approx(sum(first.itl_ms) / 15, rel=1e-6)
    assert result.summary.num_requests == 50 and result.summary.num_errors == 0
    assert result.basis.startswith("measured on local-cpu")


def test_the_same_seed_gives_the_same_result() -> None:
    trace = poisson_trace(200, 20.0, 500, 30)
    spec_config = EngineConfig.cpu_default(
        max_model_len=4096, speculative_method="ngram", num_speculative_tokens=3
    )
    runs = [
        simulate_trace(trace, model="tiny-llama-s", hardware="local-cpu", config=spec_config, seed=7).summary
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_more_load_means_more_queueing() -> None:
    trace = poisson_trace(300, 1.0, 1500, 20)
    light = simulate_trace(
        trace, model="tiny-llama-s", hardware="local-cpu", config=CPU_CONFIG, rate_scale=1.0
    )
    heavy = simulate_trace(
        trace, model="tiny-llama-s", hardware="local-cpu", config=CPU_CONFIG, rate_scale=40.0
    )
    assert heavy.summary.ttft_ms.p95 > light.summary.ttft_ms.p95
    assert heavy.attribution.tail.queueing_ms + heavy.attribution.tail.chunking_delay_ms > (
        light.attribution.tail.queueing_ms + light.attribution.tail.chunking_delay_ms
    )


def test_shared_trace_blocks_hit_the_simulated_prefix_cache() -> None:
    shared = [TraceRequest(i * 0.5, 2048, 4, hash_ids=(1, 2, 3, 4)) for i in range(10)]
    cfg_on = EngineConfig.cpu_default(max_model_len=4096, enable_prefix_caching=True)
    cfg_off = EngineConfig.cpu_default(max_model_len=4096, enable_prefix_caching=False)
    on = simulate(shared, model=get_model("tiny-llama-s"), hardware=get_hardware("local-cpu"), config=cfg_on)
    off = simulate(
        shared, model=get_model("tiny-llama-s"), hardware=get_hardware("local-cpu"), config=cfg_off
    )
    # After the first request, each reuses (2048 - 1) // 128 = 15 of its 16 blocks.
    assert on.prefix_cache_hit_rate == pytest.approx(9 * 15 * 128 / (10 * 2048))
    assert off.prefix_cache_hit_rate == 0.0
    assert on.summary.ttft_ms.p50 < off.summary.ttft_ms.p50


def test_block_hashes_follow_the_load_generators_prompt_layout() -> None:
    a = TraceRequest(0.0, 1200, 1, hash_ids=(7, 8, 9))
    b = TraceRequest(0.0, 700, 1, hash_ids=(7, 8))
    c = TraceRequest(0.0, 1200, 1, hash_ids=(6, 8, 9))
    ha = prompt_block_hashes(a, num_prompt_tokens=1200, overhead_tokens=1, block_size=128)
    hb = prompt_block_hashes(b, num_prompt_tokens=700, overhead_tokens=1, block_size=128)
    hc = prompt_block_hashes(c, num_prompt_tokens=1200, overhead_tokens=1, block_size=128)
    assert len(ha) == 1200 // 128 and len(hb) == 700 // 128
    assert hb == ha[: len(hb)]  # the same leading trace blocks, the same engine blocks
    assert hc[0] != ha[0]
    assert (
        prompt_block_hashes(
            TraceRequest(0.0, 1200, 1), num_prompt_tokens=1200, overhead_tokens=1, block_size=128
        )
        == []
    )


def test_engine_defaults_are_resolved_per_hardware() -> None:
    cpu, wfmt, _ = resolve_config(
        EngineConfig.cpu_default(), get_model("tiny-llama-s"), get_hardware("local-cpu")
    )
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs, cpu.block_size, wfmt) == (2048, 128, 128, "fp32")
    gpu, wfmt, kv = resolve_config(
        EngineConfig(kv_cache_dtype="fp8"), get_model("llama-3.1-8b"), get_hardware("h200")
    )
    assert (gpu.max_num_batched_tokens, gpu.max_num_seqs, gpu.block_size, wfmt, kv) == (
        8192,
        1024,
        16,
        "bf16",
        "fp8",
    )
    off, _, _ = resolve_config(
        EngineConfig(enable_chunked_prefill=False, max_model_len=32768),
        get_model("llama-3.1-8b"),
        get_hardware("h200"),
    )
    assert off.max_num_batched_tokens == 32768
    # as vLLM defaults it: an unset max_num_seqs is capped at a smaller token budget, a set one is
    # kept (and then a budget below it is refused, as vLLM refuses it)
    small, _, _ = resolve_config(
        EngineConfig(max_num_batched_tokens=512), get_model("llama-3.1-8b"), get_hardware("h100")
    )
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (512, 512)
    from serving.engine import InvalidEngineConfig

    with pytest.raises(InvalidEngineConfig):
        resolve_config(
            EngineConfig(max_num_batched_tokens=512, max_num_seqs=1024),
            get_model("llama-3.1-8b"),
            get_hardware("h100"),
        )


def test_requests_beyond_max_model_len_fail_like_the_engine_refuses_them() -> None:
    trace = [TraceRequest(0.0, 5000, 10), TraceRequest(0.1, 100, 10)]
    result = simulate(
        trace, model=get_model("tiny-llama-s"), hardware=get_hardware("local-cpu"), config=CPU_CONFIG
    )
    assert result.requests[0].error is not None and "max_model_len" in result.requests[0].error
    assert result.requests[1].ok and result.summary.num_errors == 1


def test_rank_candidates_puts_cheap_candidates_meeting_the_targets_first() -> None:
    trace = poisson_trace(100, 2.0, 2000, 64)
    candidates = [
        ("h100", EngineConfig()),  # 70B in bf16 does not fit on one H100
        ("h200", EngineConfig(quantization="fp8")),
        ("b200", EngineConfig(quantization="fp8")),
        ("b200", EngineConfig()),
        ("h200", EngineConfig(quantization="fp8", max_num_batched_tokens=256, max_num_seqs=2)),
    ]
    ranked = rank_candidates(
        trace, candidates, model="llama-3.1-70b", targets=LatencyTargets(ttft_p95_ms=1000)
    )
    assert [c.rank for c in ranked] == [1, 2, 3, 4, 5]
    assert ranked[-1].error is not None and "does not fit" in ranked[-1].error
    ok = [c for c in ranked if c.meets_targets]
    assert len(ok) >= 2 and ok == ranked[: len(ok)]
    costs = [c.cost_per_million_tokens_usd for c in ok]
    assert costs == sorted(costs)
    starved = next(c for c in ranked if c.config.max_num_seqs == 2)
    assert not starved.meets_targets
    assert all(c.basis for c in ranked if c.error is None)


def test_max_rate_scale_finds_where_the_targets_stop_holding() -> None:
    trace = poisson_trace(150, 2.0, 1000, 16)
    targets = LatencyTargets(ttft_p95_ms=400)
    scale = max_rate_scale(
        trace, model="tiny-llama-s", hardware="local-cpu", config=CPU_CONFIG, targets=targets, iterations=6
    )
    assert scale is not None and 0.05 < scale < 64
    worse = simulate_trace(
        trace, model="tiny-llama-s", hardware="local-cpu", config=CPU_CONFIG, rate_scale=scale * 1.5
    )
    assert not targets.met_by(worse.summary)


def test_the_cli_simulates_a_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from serving.sim_commands import register

    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 200, "input_length": 1000, "output_length": 20, "hash_ids": [0, 1]})
            + "\n"
            for i in range(30)
        )
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"max_num_seqs": 64, "max_model_len": 8192}))
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "simulate",
            "--trace",
            str(trace),
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "h200",
            "--config",
            str(config),
            "--json",
        ]
    )
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["num_requests"] == 30 and data["summary"]["ttft_ms"]["p50"] > 0
    assert data["scheduler"]["max_num_seqs"] == 64 and data["attribution"]["dominant_cause"]
    args = parser.parse_args(
        ["simulate", "--trace", str(trace), "--model", "llama-3.1-70b", "--hardware", "h100"]
    )
    assert args.func(args) == 2
    assert "does not fit" in capsys.readouterr().err


def test_a_configuration_vllm_would_refuse_is_refused_with_the_flag() -> None:
    from serving.engine import InvalidEngineConfig

    bad = EngineConfig.cpu_default(
        max_model_len=4096, enable_chunked_prefill=False, max_num_batched_tokens=1024
    )
    with pytest.raises(InvalidEngineConfig, match="smaller than max_model_len") as info:
        resolve_config(bad, get_model("tiny-llama-s"), get_hardware("local-cpu"))
    assert info.value.flag == "--max-num-batched-tokens"


def test_a_request_sent_while_others_stream_reaches_the_engine_later_by_the_calibrated_cost() -> None:
    """Two long streams start at 0; a short request sent at 0.5 s (both streaming) waits the
    fixed overhead plus twice the per-stream cost; one sent after they end waits the fixed one."""
    import dataclasses

    from serving.perf.model import load_efficiency

    base = load_efficiency("local-cpu")
    assert base is not None
    eff = dataclasses.replace(base, request_overhead_ms=5.0, stream_overhead_ms=7.0)
    trace = [TraceRequest(0.0, 64, 400), TraceRequest(0.0, 64, 400), TraceRequest(0.5, 32, 2)]
    trace.append(TraceRequest(30.0, 32, 2))
    kwargs = {"model": get_model("tiny-llama-s"), "hardware": get_hardware("local-cpu"), "config": CPU_CONFIG}
    result = simulate(trace, efficiency=eff, **kwargs)  # type: ignore[arg-type]
    overhead = {r.index: r.overhead_ms for r in result.attribution.requests}
    assert overhead[0] == pytest.approx(5.0) and overhead[1] == pytest.approx(5.0)
    assert overhead[2] == pytest.approx(5.0 + 2 * 7.0)
    assert overhead[3] == pytest.approx(5.0)
    plain = simulate(trace, efficiency=dataclasses.replace(eff, stream_overhead_ms=0.0), **kwargs)  # type: ignore[arg-type]
    delayed, undelayed = result.requests[2].ttft_ms, plain.requests[2].ttft_ms
    assert delayed is not None and undelayed is not None and delayed > undelayed + 10.0


def test_the_frontend_reads_prompts_in_turn_outside_the_engines_steps() -> None:
    # A 20,000-token prompt, then a 100-token one sent 1 ms later: with a per-prompt-token
    # frontend cost the short request waits for the long prompt to be read (one API-server
    # process), while the engine's steps cost what they cost without it.
    import dataclasses

    from serving.perf.model import Efficiency, load_efficiency
    from serving.sim.simulator import SimResult

    base = load_efficiency("h200")
    assert base is not None
    base = dataclasses.replace(base, prompt_token_overhead_ms=0.0)
    slow_frontend = dataclasses.replace(base, prompt_token_overhead_ms=0.01)  # 200 ms for 20k tokens
    trace = [TraceRequest(0.0, 20_000, 8), TraceRequest(0.001, 100, 8)]

    def run(eff: Efficiency) -> SimResult:
        return simulate(
            trace,
            model=get_model("llama-3.1-8b"),
            hardware=get_hardware("h200"),
            config=EngineConfig(dtype="bfloat16", max_model_len=32768),
            efficiency=eff,
        )

    fast, slow = run(base), run(slow_frontend)
    short_fast, short_slow = fast.requests[1].ttft_ms, slow.requests[1].ttft_ms
    assert short_fast is not None and short_slow is not None
    # The short one waited for the long prompt's 200 ms of reading, not for its own 1 ms.
    assert short_slow - short_fast > 150.0
    assert slow.busy_s == pytest.approx(fast.busy_s)
