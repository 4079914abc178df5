"""A model of vLLM v1's scheduler: the same contract (`add_request`, `schedule`, `update_from_output`).

Each `schedule()` call plans one engine step under a token budget (`max_num_batched_tokens`):
1. running requests first, in order: a decode gets its next token (plus speculative drafts), an
   unfinished prefill its next chunk, each capped by what is left of the budget; a request that
   cannot get KV blocks preempts the most recently admitted running request (recompute: its
   blocks are freed and it goes back to the front of the waiting queue);
2. then, only if nothing was preempted, waiting requests in order while the budget lasts, fewer
   than `max_num_seqs` run and KV blocks can be allocated: each starts after its longest cached
   prefix of full blocks (never the whole prompt: the last token is always computed), and is cut
   to the budget (chunked prefill) or, with chunking off, waits for a step that fits it whole.
`update_from_output` advances every scheduled request by its tokens; one whose computed tokens
reach its length samples a token (the first is its TTFT), and one with all its output tokens
finishes and frees its blocks.

The scheduler also books, per request, where its time to first token went (queueing, own
prefill compute, waiting behind other requests' tokens, preemption), for the attribution report.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from serving.sim.kv import BlockPool


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine knobs the scheduler obeys (resolved: no `None`s)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    block_size: int  # tokens per KV block
    num_kv_blocks: int  # KV-cache capacity in blocks
    max_model_len: int
    scheduling_policy: str = "fcfs"
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float = 0.0  # chance each draft token is accepted (given the previous one was)
    long_prefill_token_threshold: int = 0  # 0: off

    def __post_init__(self) -> None:
        # vLLM's own checks (SchedulerConfig.verify_max_model_len): without chunking, a prompt
        # longer than the budget could never be scheduled, so the engine refuses to start.
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_model_len "
                f"({self.max_model_len}) with chunked prefill off: vLLM refuses this configuration"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): vLLM refuses this configuration"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


class SimRequest:
    """A request's state inside the simulated engine (times in seconds of simulated time)."""

    __slots__ = (
        "block_hashes",
        "blocks",
        "chunk_wait_s",
        "engine_arrival_s",
        "finish_s",
        "first_scheduled_s",
        "first_token_s",
        "index",
        "itl_s",
        "last_token_s",
        "max_output_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "preempt_s",
        "preempt_stall_s",
        "prefill_s",
        "queue_s",
        "wait_since_s",
    )

    def __init__(
        self,
        index: int,
        *,
        engine_arrival_s: float,
        num_prompt_tokens: int,
        max_output_tokens: int,
        block_hashes: list[int] | None = None,
    ) -> None:
        self.index = index
        self.engine_arrival_s = engine_arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.block_hashes = block_hashes or []
        self.blocks: list[int] = []
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first admission (-1: not admitted yet)
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.wait_since_s = engine_arrival_s
        self.queue_s = 0.0  # waiting before first admission
        self.prefill_s = 0.0  # own share of steps computing its prompt
        self.chunk_wait_s = 0.0  # others' share of those steps, and steps it was running but left out
        self.preempt_s = 0.0  # re-waiting and recomputing after a preemption, before the first token
        self.preempt_stall_s = 0.0  # the same after the first token (shows in TPOT)
        self.itl_s: list[float] | None = None

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.index}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/"
            f"{self.max_output_tokens}, computed={self.num_computed_tokens})"
        )

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_computed_tokens == self.num_tokens - 1 and self.num_output_tokens > 0

    @property
    def finished(self) -> bool:
        return self.finish_s is not None


@dataclass(slots=True)
class SchedulerOutput:
    """One planned step: who runs how many tokens, and the step's aggregate shape."""

    scheduled: list[tuple[SimRequest, int, int]] = field(default_factory=list)  # (req, tokens, drafts)
    preempted: list[SimRequest] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_sampled: int = 0
    prefill_attn_pairs: float = 0.0
    prefill_cached_tokens: int = 0
    decode_ctx_tokens: int = 0
    num_new_admissions: int = 0
    blocked_by: str | None = None  # why the head of the waiting queue was not admitted

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, *, rng: np.random.Generator | None = None) -> None:
        if config.num_speculative_tokens and rng is None:
            raise ValueError("speculative decoding draws acceptances: pass a seeded numpy Generator")
        self.config = config
        self.pool = BlockPool(
            config.num_kv_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.rng = rng
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.num_preemptions = 0
        self.num_prompt_tokens_admitted = 0
        self.num_prompt_tokens_cached = 0
        # When streams opened (first tokens) and closed (finishes), in time order: the frontend's
        # per-stream cost reads how many were open when a request was sent.
        self.first_token_times: list[float] = []
        # What vLLM's tokens-per-iteration histogram (`vllm:iteration_tokens_total`) counts for the
        # last step: the tokens sampled, and each prompt's computed tokens (less its prefix-cache
        # hit) in the step that samples its first token; 0 for a step that only advances prompt
        # chunks (it samples nothing, and vLLM records nothing for it).
        self.step_counted_tokens = 0
        self.finish_times: list[float] = []

    # -- contract ------------------------------------------------------------------------------

    def add_request(self, request: SimRequest) -> None:
        if request.num_prompt_tokens + request.max_output_tokens > self.config.max_model_len:
            raise ValueError(
                f"request {request.index}: {request.num_prompt_tokens} prompt + {request.max_output_tokens} "
                f"output tokens exceed max_model_len {self.config.max_model_len}"
            )
        blocks_needed = -(-(request.num_prompt_tokens + request.max_output_tokens) // self.config.block_size)
        if blocks_needed > self.config.num_kv_blocks:
            raise ValueError(
                f"request {request.index} needs {blocks_needed} KV blocks, the cache has {self.config.num_kv_blocks}"
            )
        request.wait_since_s = request.engine_arrival_s
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now_s: float = 0.0) -> SchedulerOutput:
        cfg = self.config
        pool = self.pool
        bs = cfg.block_size
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        spec = cfg.num_speculative_tokens
        scheduled_ids: dict[int, int] = {}  # request index -> position in out.scheduled
        caching = cfg.enable_prefix_caching

        # Plain decode steps (the bulk of every step under load) are counted here as they are
        # scheduled; the loop after admission counts the rest, or all of them again where a
        # preemption dropped entries.
        fast_sampled = fast_ctx = 0
        slow: list[tuple[SimRequest, int, int]] = []  # the running loop's other entries
        # Where a preemption may pick a request scheduled earlier in this step (priority
        # policy), its entry is found by id; first-come-first-served preempts the last running
        # request, never one already scheduled.
        track = cfg.scheduling_policy == "priority"
        running = self.running  # the same list throughout (preemption pops from it)
        scheduled = out.scheduled
        plain = not spec  # without drafts a decode schedules exactly one token
        i = 0
        n_running = len(running)
        while i < n_running and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            out_tokens = req.num_output_tokens
            if plain and out_tokens > 0 and req.num_prompt_tokens + out_tokens - computed == 1:
                blocks = req.blocks
                # No new block while the token fits the ones it holds (need <= 0 below).
                need = 0 if computed < len(blocks) * bs else -(-(computed + 1) // bs) - len(blocks)
                if need <= 0 or need <= pool.num_blocks - pool.fresh + len(pool.free):
                    if need > 0:
                        blocks.extend(pool.allocate(need))
                    if caching and req.block_hashes:
                        self._register_full_blocks(req, computed + 1)
                    if track:
                        scheduled_ids[req.index] = len(scheduled)
                    scheduled.append((req, 1, 0))
                    fast_sampled += 1
                    fast_ctx += computed  # plus one per decode, added below
                    budget -= 1
                    i += 1
                    continue
            remaining = req.num_prompt_tokens + out_tokens - computed
            drafts = 0
            if spec and req.is_decoding:
                drafts = min(spec, req.max_output_tokens - req.num_output_tokens - 1)
                drafts = max(0, min(drafts, cfg.max_model_len - req.num_tokens - 1))
            num_new = remaining + drafts
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            drafts = max(0, num_new - remaining)
            need = -(-(req.num_computed_tokens + num_new) // bs) - len(req.blocks)
            can_run = True
            while need > pool.num_free:
                victim = self._pick_victim()
                pos_in_running = self.running.index(victim)
                self.running.pop(pos_in_running)
                n_running -= 1
                if pos_in_running < i:
                    i -= 1
                if victim.index in scheduled_ids:
                    pos = scheduled_ids.pop(victim.index)
                    budget += out.scheduled[pos][1]
                    out.scheduled[pos] = (victim, 0, 0)  # dropped below
                self._preempt(victim, now_s)
                out.preempted.append(victim)
                if victim is req:
                    can_run = False
                    break
            if not can_run:
                break
            if need > 0:
                req.blocks.extend(pool.allocate(need))
            if caching and req.block_hashes:
                self._register_full_blocks(req, req.num_computed_tokens + num_new)
            scheduled_ids[req.index] = len(out.scheduled)
            out.scheduled.append((req, num_new, drafts))
            slow.append((req, num_new, drafts))
            budget -= num_new
            i += 1
        admitted_from = len(out.scheduled)

        if out.preempted:
            out.scheduled = [s for s in out.scheduled if s[1] > 0]
        else:
            while self.waiting and budget > 0:
                if len(self.running) >= cfg.max_num_seqs:
                    out.blocked_by = "max_num_seqs"
                    break
                req = self.waiting[0]
                hit: list[int] = []
                if cfg.enable_prefix_caching and req.block_hashes:
                    hit = pool.longest_hit(req.block_hashes, (req.num_tokens - 1) // bs)
                num_computed = len(hit) * bs
                num_new = req.num_tokens - num_computed
                if 0 < threshold < num_new:
                    num_new = threshold
                if not cfg.enable_chunked_prefill and num_new > budget:
                    out.blocked_by = "token_budget"
                    break
                num_new = min(num_new, budget)
                need = -(-(num_computed + num_new) // bs) - len(hit)
                free = (
                    pool.num_free_after_touch(hit) if hit else pool.num_blocks - pool.fresh + len(pool.free)
                )
                if need > free:
                    out.blocked_by = "kv_cache"
                    break
                pool.touch(hit)
                req.blocks = hit + pool.allocate(need)
                req.num_computed_tokens = num_computed
                self._register_full_blocks(req, num_computed + num_new)
                self.waiting.popleft()
                self.running.append(req)
                waited = now_s - req.wait_since_s
                if req.num_preemptions == 0:
                    req.queue_s += waited
                    req.first_scheduled_s = now_s
                    req.num_cached_tokens = num_computed
                    self.num_prompt_tokens_admitted += req.num_prompt_tokens
                    self.num_prompt_tokens_cached += num_computed
                elif req.first_token_s is None:
                    req.preempt_s += waited
                else:
                    req.preempt_stall_s += waited
                out.scheduled.append((req, num_new, 0))
                out.num_new_admissions += 1
                budget -= num_new
            if self.waiting and budget <= 0 and out.blocked_by is None:
                out.blocked_by = "token_budget"

        sampled = decode_tokens = decode_ctx = prefill_tokens = prefill_cached = 0
        pairs = 0.0
        rest = out.scheduled
        if fast_sampled and not out.preempted:
            sampled, decode_tokens, decode_ctx = fast_sampled, fast_sampled, fast_ctx + fast_sampled
            rest = slow + out.scheduled[admitted_from:]
        for req, num_new, drafts in rest:
            computed = req.num_computed_tokens
            tokens = req.num_prompt_tokens + req.num_output_tokens
            if computed + num_new - drafts >= tokens:
                sampled += 1
            if computed == tokens - 1 and req.num_output_tokens > 0:
                decode_tokens += num_new
                decode_ctx += computed + num_new
            else:
                prefill_tokens += num_new
                pairs += num_new * (computed + (num_new + 1) / 2.0)
                prefill_cached += computed
        out.num_sampled = sampled
        out.num_decode_tokens = decode_tokens
        out.decode_ctx_tokens = decode_ctx
        out.num_prefill_tokens = prefill_tokens
        out.prefill_attn_pairs = pairs
        out.prefill_cached_tokens = prefill_cached
        return out

    def update_from_output(self, out: SchedulerOutput, start_s: float, end_s: float) -> list[SimRequest]:
        """Advance the scheduled requests by one step that ran from `start_s` to `end_s`."""
        dt = end_s - start_s
        total = out.num_tokens or 1
        finished: list[SimRequest] = []
        # Scheduled requests are running ones, each once: when all ran, none waited for a chunk.
        everyone = len(out.scheduled) == len(self.running)
        finish_times = self.finish_times
        counted = 0  # what vLLM's iteration histogram counts for this step
        for req, num_new, drafts in out.scheduled:
            if not drafts and req.first_token_s is not None:
                # Past its first token, no drafts (a decode, or a recompute after preemption):
                # the general path below without its attribution and acceptance draws.
                computed = req.num_computed_tokens + num_new
                req.num_computed_tokens = computed
                out_tokens = req.num_output_tokens
                if computed < req.num_prompt_tokens + out_tokens:
                    continue
                left = req.max_output_tokens - out_tokens
                produced = 1 if left > 1 else left  # min(1, left)
                counted += produced
                out_tokens += produced
                req.num_output_tokens = out_tokens
                if req.itl_s is not None and req.last_token_s is not None:
                    req.itl_s.append(end_s - req.last_token_s)
                req.last_token_s = end_s
                if left <= 1 and out_tokens >= req.max_output_tokens:  # its last token
                    req.finish_s = end_s
                    finish_times.append(end_s)
                    finished.append(req)
                continue
            if req.first_token_s is None:
                own = dt * num_new / total
                if req.num_preemptions:
                    req.preempt_s += own
                else:
                    req.prefill_s += own
                req.chunk_wait_s += dt - own
            req.num_computed_tokens += num_new
            if req.num_computed_tokens - drafts < req.num_prompt_tokens + req.num_output_tokens:
                continue  # a prefill chunk: nothing sampled yet
            accepted = self._accepted(drafts) if drafts else 0
            req.num_computed_tokens -= drafts - accepted
            produced = min(1 + accepted, req.max_output_tokens - req.num_output_tokens)
            req.num_output_tokens += produced
            counted += produced
            if req.first_token_s is None:
                # the prompt tokens it computed: those its prefix-cache hit skipped are not counted
                counted += req.num_prompt_tokens - max(req.num_cached_tokens, 0)
                req.first_token_s = end_s
                self.first_token_times.append(end_s)
            elif req.itl_s is not None and req.last_token_s is not None:
                req.itl_s.append(end_s - req.last_token_s)
            req.last_token_s = end_s
            if req.num_output_tokens >= req.max_output_tokens:
                req.finish_s = end_s
                self.finish_times.append(end_s)
                finished.append(req)
        self.step_counted_tokens = counted
        if finished:
            for req in finished:  # a few per step: removed in place (a C-level scan each)
                self.running.remove(req)
            for req in finished:
                self.pool.release(req.blocks)
                req.blocks = []
        if not everyone:
            scheduled = {req.index for req, _, _ in out.scheduled}
            for req in self.running:
                if req.first_token_s is None and req.index not in scheduled:
                    req.chunk_wait_s += dt
        return finished

    # -- helpers -------------------------------------------------------------------------------

    def _pick_victim(self) -> SimRequest:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.engine_arrival_s, r.index))
        return self.running[-1]

    def _preempt(self, req: SimRequest, now_s: float) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.wait_since_s = now_s
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _register_full_blocks(self, req: SimRequest, num_tokens_after: int) -> None:
        hashes = req.block_hashes
        if not hashes or not self.config.enable_prefix_caching:
            return
        full = min(num_tokens_after // self.config.block_size, len(hashes), len(req.blocks))
        for b in range(req.num_computed_tokens // self.config.block_size, full):
            self.pool.register(req.blocks[b], hashes[b])

    def _accepted(self, drafts: int) -> int:
        assert self.rng is not None
        p = self.config.spec_acceptance_rate
        accepted = 0
        draws = self.rng.random(drafts)
        for value in draws:
            if value >= p:
                break
            accepted += 1
        return accepted

    def kv_blocks_in_use(self) -> int:
        return self.pool.num_used
