"""Invariants of the simulated scheduler on random traces (hypothesis).

Stepping the scheduler directly (with a fixed step time) checks: no request gets a token before
it arrives or finishes before its first token; every request gets exactly its output tokens;
scheduled tokens are conserved (prompt + outputs - 1, plus whatever preemption recomputes, minus
prefix hits); the KV cache never holds more blocks than it has; the budget and slot limits hold
every step. The full `simulate` (with its decode jumps) is checked against the same invariants.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from serving.catalog import get_hardware, get_model  # noqa: E402
from serving.engine import EngineConfig  # noqa: E402
from serving.loadgen.traces import TraceRequest  # noqa: E402
from serving.sim.scheduler import Scheduler, SchedulerConfig, SimRequest  # noqa: E402
from serving.sim.simulator import simulate  # noqa: E402

request_strategy = st.tuples(
    st.floats(min_value=0.0, max_value=20.0, allow_nan=False),  # arrival
    st.integers(min_value=1, max_value=60),  # prompt tokens
    st.integers(min_value=1, max_value=12),  # output tokens
    st.lists(st.integers(min_value=0, max_value=3), max_size=4),  # shared block ids
)


def _make_config(
    seqs: int, budget: int, chunked: bool, caching: bool, block: int, blocks: int
) -> SchedulerConfig:
    # vLLM requires a budget of a whole max_model_len when prompts cannot be chunked.
    return SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget if chunked else 72,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        block_size=block,
        num_kv_blocks=blocks,
        max_model_len=72,
    )


config_strategy = st.builds(
    _make_config,
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=8, max_value=64),
    st.booleans(),
    st.booleans(),
    st.sampled_from([4, 8]),
    st.integers(min_value=20, max_value=40),
)


def _hashes(ids: list[int], prompt: int, block: int) -> list[int]:
    # Block ids at the scheduler's own block size: only whole blocks inside the prompt.
    out, prev = [], 0
    for b in range(min(len(ids), prompt // block)):
        prev = hash((prev, ids[b]))
        out.append(prev)
    return out


@settings(max_examples=120, deadline=None)
@given(st.lists(request_strategy, min_size=1, max_size=12), config_strategy)
def test_scheduler_invariants(raw: list[tuple[float, int, int, list[int]]], cfg: SchedulerConfig) -> None:
    requests = [
        SimRequest(
            i,
            engine_arrival_s=t,
            num_prompt_tokens=p,
            max_output_tokens=o,
            block_hashes=_hashes(ids, p, cfg.block_size),
        )
        for i, (t, p, o, ids) in enumerate(sorted(raw))
    ]
    s = Scheduler(cfg)
    scheduled_tokens = dict.fromkeys(range(len(requests)), 0)
    now, nxt, steps = 0.0, 0, 0
    while nxt < len(requests) or s.has_unfinished():
        while nxt < len(requests) and requests[nxt].engine_arrival_s <= now:
            s.add_request(requests[nxt])
            nxt += 1
        if not s.has_unfinished():
            now = requests[nxt].engine_arrival_s
            continue
        out = s.schedule(now)
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert len(s.running) <= cfg.max_num_seqs
        assert s.pool.num_used <= cfg.num_kv_blocks
        for r, n, _ in out.scheduled:
            assert n > 0 and r.engine_arrival_s <= now
            scheduled_tokens[r.index] += n
        if out.num_tokens == 0:
            assert nxt < len(requests), "stalled with nothing left to arrive"
            now = requests[nxt].engine_arrival_s
            continue
        s.update_from_output(out, now, now + 0.5)
        now += 0.5
        steps += 1
        assert steps < 10_000
    assert s.pool.num_used == 0
    for r in requests:
        assert r.finished and r.first_token_s is not None and r.finish_s is not None
        assert r.engine_arrival_s < r.first_token_s <= r.finish_s
        assert r.num_output_tokens == r.max_output_tokens
        cached = max(r.num_cached_tokens, 0)
        if r.num_preemptions == 0:
            assert scheduled_tokens[r.index] == r.num_prompt_tokens + r.max_output_tokens - 1 - cached
        else:
            # Recomputation may hit the request's own freed-but-cached prompt blocks.
            reusable = len(r.block_hashes) * cfg.block_size
            assert scheduled_tokens[r.index] >= r.num_prompt_tokens + r.max_output_tokens - 1 - reusable


@settings(max_examples=40, deadline=None)
@given(
    st.lists(request_strategy, min_size=1, max_size=30),
    st.integers(min_value=1, max_value=8),
    st.sampled_from([64, 256, 2048]),
    st.booleans(),
)
def test_simulate_results_are_consistent(
    raw: list[tuple[float, int, int, list[int]]], max_num_seqs: int, budget: int, chunked: bool
) -> None:
    trace = [
        TraceRequest(
            arrival_s=t, num_prompt_tokens=p * 20, num_output_tokens=o, hash_ids=tuple(ids), block_tokens=64
        )
        for t, p, o, ids in sorted(raw)
    ]
    config = EngineConfig.cpu_default(
        max_model_len=2048,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget if chunked else 2048,
        enable_chunked_prefill=chunked,
    )
    result = simulate(
        trace, model=get_model("tiny-llama-s"), hardware=get_hardware("local-cpu"), config=config
    )
    assert result.summary.num_errors == 0
    assert result.max_kv_blocks_used <= result.scheduler.num_kv_blocks
    for res, req in zip(result.requests, trace, strict=True):
        assert res.ttft_ms is not None and res.e2e_ms is not None
        assert res.ttft_ms > 0 and res.e2e_ms >= res.ttft_ms
        assert res.num_output_tokens == req.num_output_tokens
    # vLLM's tokens-per-iteration count: every prompt once, less its prefix-cache hit, and every
    # sampled token, over the steps that sampled (one for each token of the longest output at
    # least); chunk-only steps are in no count.
    counted = result.sampled_step_tokens
    everything = sum(r.num_prompt_tokens + r.num_output_tokens for r in trace)
    assert sum(n * c for n, c in counted.items()) == everything - result.num_prompt_tokens_cached
    assert max(r.num_output_tokens for r in trace) <= sum(counted.values()) <= result.num_steps
    for row in result.attribution.requests:
        parts = (
            row.overhead_ms
            + row.queueing_ms
            + row.prefill_compute_ms
            + row.chunking_delay_ms
            + row.preemption_ms
        )
        assert parts == pytest.approx(row.ttft_ms, rel=1e-6, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(request_strategy, min_size=2, max_size=40),
    st.integers(min_value=2, max_value=16),
    st.sampled_from([256, 2048]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([0.002, 0.004, 0.01]),  # 8, 16 and 40 blocks of 128 tokens
)
def test_decode_jumps_give_exactly_the_steps_result(
    raw: list[tuple[float, int, int, list[int]]],
    max_num_seqs: int,
    budget: int,
    chunked: bool,
    caching: bool,
    kv_gib: float,
) -> None:
    # Jumps (decode stretches advanced at once) must change nothing but the simulator's speed,
    # under KV pressure too: the same trace simulated step by step gives the same times, steps
    # and blocked shares.
    from unittest import mock

    from serving.sim import simulator

    trace = [
        TraceRequest(
            arrival_s=t,
            num_prompt_tokens=p * 8,
            num_output_tokens=o * 6,
            hash_ids=tuple(ids),
            block_tokens=64,
        )
        for t, p, o, ids in sorted(raw)
    ]
    config = EngineConfig.cpu_default(
        max_model_len=1024,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget if chunked else 1024,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        cpu_kv_cache_space_gib=kv_gib,
    )
    kwargs = {"model": get_model("tiny-llama-s"), "hardware": get_hardware("local-cpu"), "config": config}
    jumped = simulate(trace, **kwargs)  # type: ignore[arg-type]
    with mock.patch.object(simulator._Loop, "_try_jump", lambda self, now, next_arrival: False):
        stepped = simulate(trace, **kwargs)  # type: ignore[arg-type]
    assert jumped.num_steps == stepped.num_steps
    assert jumped.sampled_step_tokens == stepped.sampled_step_tokens
    for a, b in zip(jumped.requests, stepped.requests, strict=True):
        assert (a.error, a.num_output_tokens) == (b.error, b.num_output_tokens)
        if a.ttft_ms is not None:
            assert a.ttft_ms == pytest.approx(b.ttft_ms, rel=1e-9, abs=1e-9)
            assert a.e2e_ms == pytest.approx(b.e2e_ms, rel=1e-9, abs=1e-9)
    blocked_a, blocked_b = jumped.attribution.queue_blocked_share, stepped.attribution.queue_blocked_share
    assert blocked_a.keys() == blocked_b.keys()
    for key, share in blocked_a.items():
        assert share == pytest.approx(blocked_b[key], rel=1e-9, abs=1e-12)


def test_sampled_steps_count_as_vllms_iteration_histogram() -> None:
    # One prompt of 4 chunks and 8 output tokens: 11 engine steps, of which vLLM's histogram
    # records the 8 that sample, the first carrying the whole prompt with its first token.
    trace = [TraceRequest(arrival_s=0.0, num_prompt_tokens=1024, num_output_tokens=8)]
    config = EngineConfig.cpu_default(max_model_len=2048, max_num_batched_tokens=256)
    result = simulate(
        trace, model=get_model("tiny-llama-s"), hardware=get_hardware("local-cpu"), config=config
    )
    assert result.num_steps == 4 + 7
    assert result.sampled_step_tokens == {1: 7, 1025: 1}
