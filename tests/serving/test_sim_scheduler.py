"""The simulated scheduler stepped by hand: exact tokens per step (budget, chunking, prefix hits,
eviction, preemption, speculative decoding)."""

from __future__ import annotations

import numpy as np
import pytest

from serving.sim.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SimRequest


def config(**overrides: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 16,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "block_size": 4,
        "num_kv_blocks": 64,
        "max_model_len": 256,
    }
    base.update(overrides)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def req(index: int, prompt: int, output: int, hashes: list[int] | None = None) -> SimRequest:
    return SimRequest(
        index, engine_arrival_s=0.0, num_prompt_tokens=prompt, max_output_tokens=output, block_hashes=hashes
    )


def step(s: Scheduler, t: float = 0.0) -> tuple[SchedulerOutput, dict[int, int]]:
    out = s.schedule(t)
    tokens = {r.index: n for r, n, _ in out.scheduled}
    s.update_from_output(out, t, t + 1.0)
    return out, tokens


def test_chunked_prefill_splits_a_long_prompt_by_the_budget() -> None:
    s = Scheduler(config())
    a = req(0, 30, 3)
    s.add_request(a)
    out, tokens = step(s)
    assert tokens == {0: 16} and out.num_prefill_tokens == 16 and out.num_sampled == 0
    assert a.first_token_s is None
    out, tokens = step(s, 1.0)
    assert tokens == {0: 14} and out.num_sampled == 1
    assert a.first_token_s == 2.0 and a.num_output_tokens == 1
    out, tokens = step(s, 2.0)
    assert tokens == {0: 1} and out.num_decode_tokens == 1 and out.decode_ctx_tokens == 31
    out, tokens = step(s, 3.0)
    assert tokens == {0: 1}
    assert a.finished and a.finish_s == 4.0 and a.num_output_tokens == 3
    assert not s.has_unfinished() and s.pool.num_used == 0


def test_running_requests_go_first_and_share_the_budget() -> None:
    s = Scheduler(config())
    s.add_request(req(0, 10, 4))
    s.add_request(req(1, 10, 4))
    _, tokens = step(s)
    assert tokens == {0: 10, 1: 6}  # B's prefill is cut to what A left of the budget
    out, tokens = step(s, 1.0)
    assert tokens == {0: 1, 1: 4}  # A decodes, B finishes its prompt
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 4 and out.num_sampled == 2


def test_without_chunking_a_prompt_waits_for_a_step_it_fits_in() -> None:
    s = Scheduler(config(enable_chunked_prefill=False, max_model_len=16))
    s.add_request(req(0, 10, 2))
    s.add_request(req(1, 10, 2))
    out, tokens = step(s)
    assert tokens == {0: 10} and out.blocked_by == "token_budget"
    _, tokens = step(s, 1.0)
    assert tokens == {0: 1, 1: 10}


def test_max_num_seqs_holds_requests_in_the_queue() -> None:
    s = Scheduler(config(max_num_seqs=1))
    s.add_request(req(0, 4, 2))
    s.add_request(req(1, 4, 2))
    out, tokens = step(s)
    assert tokens == {0: 4} and out.blocked_by == "max_num_seqs"
    _, tokens = step(s, 1.0)
    assert tokens == {0: 1}  # A finishes here; B is admitted at the next step
    _, tokens = step(s, 2.0)
    assert tokens == {1: 4}
    second = s.running[0]
    assert second.queue_s == pytest.approx(2.0)


def test_prefix_cache_hits_whole_blocks_and_always_computes_the_last_token() -> None:
    s = Scheduler(config())
    s.add_request(req(0, 12, 1, hashes=[11, 12, 13]))
    _, tokens = step(s)
    assert tokens == {0: 12}
    # Same 12-token prompt: at most (12 - 1) // 4 = 2 blocks can be reused, 4 tokens recomputed.
    b = req(1, 12, 1, hashes=[11, 12, 13])
    s.add_request(b)
    out, tokens = step(s, 1.0)
    assert tokens == {1: 4} and b.num_cached_tokens == 8 and out.prefill_cached_tokens == 8
    # A longer prompt sharing all three blocks reuses them all.
    c = req(2, 14, 1, hashes=[11, 12, 13])
    s.add_request(c)
    _, tokens = step(s, 2.0)
    assert tokens == {2: 2} and c.num_cached_tokens == 12
    # A different first block: no hit (hashes are chained).
    d = req(3, 12, 1, hashes=[99, 12, 13])
    s.add_request(d)
    _, tokens = step(s, 3.0)
    assert tokens == {3: 12} and d.num_cached_tokens == 0


def test_lru_eviction_reuses_the_least_recently_freed_blocks() -> None:
    s = Scheduler(config(num_kv_blocks=4))
    s.add_request(req(0, 8, 1, hashes=[1, 2]))
    step(s)  # A: blocks for 8 tokens, registered, then freed (cached)
    assert s.pool.num_free == 4 and len(s.pool.cached) == 2
    s.add_request(req(1, 13, 1))  # needs all 4 blocks: evicts A's cached blocks
    step(s, 1.0)
    assert s.pool.cached == {} and s.pool.num_evictions == 2
    again = req(2, 8, 1, hashes=[1, 2])
    s.add_request(again)
    _, tokens = step(s, 2.0)
    assert tokens == {2: 8} and again.num_cached_tokens == 0


def test_the_free_queue_hands_out_unused_blocks_in_order_then_the_least_recently_freed() -> None:
    from serving.sim.kv import BlockPool

    pool = BlockPool(6, 16, enable_caching=True)
    first = pool.allocate(2)
    assert first == [0, 1] and pool.num_free == 4 and pool.num_used == 2
    pool.register(0, 100)
    pool.release(first)  # tail-first: block 1, then block 0 (cached) join the queue's tail
    assert pool.num_free == 6
    # Never-used blocks come first, in id order; then the freed ones, least recently freed first.
    assert pool.allocate(4) == [2, 3, 4, 5] and pool.num_evictions == 0
    assert pool.allocate(1) == [1]
    assert pool.longest_hit([100], 1) == [0] and pool.num_free_after_touch([0]) == 0
    assert pool.allocate(1) == [0] and pool.num_evictions == 1 and pool.cached == {}
    assert pool.num_free == 0


def test_kv_exhaustion_preempts_the_newest_request_and_recomputes_it() -> None:
    s = Scheduler(config(num_kv_blocks=6, enable_prefix_caching=False))
    a, b = req(0, 8, 10), req(1, 8, 10)
    s.add_request(a)
    s.add_request(b)
    _, tokens = step(s)
    assert tokens == {0: 8, 1: 8} and s.pool.num_used == 4
    t = 1.0
    preempted_at = None
    for _ in range(8):
        out, tokens = step(s, t)
        if out.preempted:
            preempted_at = t
            assert out.preempted == [b] and tokens == {0: 1}
            assert out.num_new_admissions == 0  # no admissions in a step that preempted
            break
        assert tokens == {0: 1, 1: 1}
        t += 1.0
    # 6 blocks hold 24 tokens. The step starting at t computes token 8 + t of each request, so both
    # fill 3 blocks by t = 4, and at t = 5 A's 13th token needs a 4th block: B, the newest, goes.
    assert preempted_at == 5.0
    assert b.num_preemptions == 1 and b.num_computed_tokens == 0 and b.blocks == []
    assert s.waiting[0] is b and s.pool.num_used == 4
    # B comes back (once A finishes and frees its blocks) by recomputing its prompt and the 5
    # tokens it had generated, in one prefill.
    assert b.num_tokens == 13
    for _ in range(10):
        out, tokens = step(s, t)
        t += 1.0
        if 1 in tokens:
            assert tokens[1] == 13 and a.finished
            assert b.num_output_tokens == 6 and b.preempt_stall_s > 0
            break
    else:
        pytest.fail("the preempted request never came back")


def test_speculative_decoding_emits_accepted_drafts() -> None:
    all_accepted = Scheduler(
        config(num_speculative_tokens=3, spec_acceptance_rate=1.0), rng=np.random.default_rng(0)
    )
    a = req(0, 4, 9)
    all_accepted.add_request(a)
    step(all_accepted)
    assert a.num_output_tokens == 1
    _, tokens = step(all_accepted, 1.0)
    assert tokens == {0: 4} and a.num_output_tokens == 5  # 1 + 3 accepted drafts
    assert a.num_computed_tokens == a.num_tokens - 1
    none_accepted = Scheduler(
        config(num_speculative_tokens=3, spec_acceptance_rate=0.0), rng=np.random.default_rng(0)
    )
    b = req(0, 4, 9)
    none_accepted.add_request(b)
    step(none_accepted)
    _, tokens = step(none_accepted, 1.0)
    assert tokens == {0: 4} and b.num_output_tokens == 2
    assert b.num_computed_tokens == b.num_tokens - 1


def test_requests_longer_than_the_model_or_the_cache_are_refused() -> None:
    s = Scheduler(config(max_model_len=32, num_kv_blocks=4))
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(req(0, 30, 5))
    with pytest.raises(ValueError, match="KV blocks"):
        s.add_request(req(1, 16, 4))


def test_configurations_vllm_refuses_are_refused() -> None:
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        config(enable_chunked_prefill=False)  # budget 16 < max_model_len 256
    with pytest.raises(ValueError, match="max_num_seqs"):
        config(max_num_seqs=32)
