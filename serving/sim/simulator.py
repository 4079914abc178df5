"""Replay a trace through the simulated scheduler and the step-latency model.

The loop is the engine's: admit what has arrived, `schedule()` one step, advance the clock by
the step's modelled time, `update_from_output`. Stretches where every running request is
decoding and nothing can be admitted are advanced in one jump (their step times grow linearly
with context, so the sum is exact up to the roofline's kinks), and the replay is one pass: a
request's arrival (with the frontend's per-stream cost) is resolved when the clock passes its send
time. `benchmarks/sim_accuracy.py` times a 10,000-request trace (`sim_10k_requests_s`).

Requests are built exactly as the load generator builds them (`serving.loadgen`): the same
prompt cap and token count (the tokenizer's special tokens included), the same output cap, and,
for traces with block ids, the same prefix sharing, hashed at the engine's block size. Results
are `RequestResult`s and a `ReplaySummary`, so predicted and measured compare field by field.
"""

from __future__ import annotations

import bisect
import heapq
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.catalog.fit import check_fit
from serving.catalog.hardware import Hardware
from serving.catalog.models import ModelSpec
from serving.engine.config import CPU_BIND_ENV, EngineConfig, InvalidEngineConfig
from serving.engine.host import parse_cpu_list
from serving.loadgen.arrivals import trace_offsets_s
from serving.loadgen.results import SLO, ReplaySummary, RequestResult, summarize
from serving.loadgen.traces import TraceRequest
from serving.perf.model import Efficiency, StepTimeModel
from serving.sim.scheduler import Scheduler, SchedulerConfig, SimRequest

CPU_KV_DEFAULT_GIB = 4  # vLLM CPU's KV space when VLLM_CPU_KVCACHE_SPACE is unset
SPEC_ACCEPTANCE_DEFAULT = {"ngram": 0.3, "eagle": 0.7, "eagle3": 0.75, "draft_model": 0.6, "mtp": 0.8}


def resolve_config(
    config: EngineConfig,
    model: ModelSpec,
    hardware: Hardware,
    *,
    spec_acceptance_rate: float | None = None,
) -> tuple[SchedulerConfig, str, str]:
    """vLLM's defaults for this hardware filled in: (scheduler config, weight format, KV format)."""
    cpu = hardware.kind == "cpu"
    tp = config.tensor_parallel_size
    weight_format = _weight_format(config, model)
    kv_format = (
        config.kv_cache_dtype
        if config.kv_cache_dtype != "auto"
        else (weight_format if weight_format in ("fp32", "bf16", "fp16") else "bf16")
    )
    max_model_len = config.max_model_len or model.max_position_embeddings
    if cpu:
        seqs_default, tokens_default, block_size = 128 * tp, 2048 * tp, 128
    elif hardware.memory_bytes >= 160 * 2**30:
        seqs_default, tokens_default, block_size = 1024, 16384, 16
    elif hardware.memory_bytes >= 70 * 2**30:
        seqs_default, tokens_default, block_size = 1024, 8192, 16
    elif hardware.kind == "tpu":
        seqs_default, tokens_default, block_size = 256, 1024, 16
    else:
        seqs_default, tokens_default, block_size = 256, 2048, 16
    chunked = True if config.enable_chunked_prefill is None else config.enable_chunked_prefill
    max_num_seqs = config.max_num_seqs or seqs_default
    if config.max_num_batched_tokens is not None:
        max_tokens = config.max_num_batched_tokens
    else:
        max_tokens = tokens_default if chunked else max(max_model_len, tokens_default)
        max_tokens = min(max_tokens, max_num_seqs * max_model_len)
    if config.max_num_seqs is None:
        # vLLM's own defaulting (EngineArgs): a max_num_seqs left unset is capped at the token
        # budget, so a budget below the default's sequences starts rather than being refused.
        max_num_seqs = min(max_num_seqs, max_tokens)
    if cpu:
        space_gib = config.cpu_kv_cache_space_gib or CPU_KV_DEFAULT_GIB
        fit = check_fit(
            model,
            hardware,
            num_devices=tp,
            weight_format=weight_format,
            kv_cache_format=kv_format,
            kv_cache_bytes=space_gib * 2**30,
        )
    else:
        fit = check_fit(
            model,
            hardware,
            num_devices=tp,
            weight_format=weight_format,
            kv_cache_format=kv_format,
            memory_utilization=config.gpu_memory_utilization or 0.9,
        )
    num_blocks = max(1, fit.kv_capacity_tokens // block_size)
    spec_tokens = config.num_speculative_tokens or 0
    if spec_acceptance_rate is None:
        spec_acceptance_rate = SPEC_ACCEPTANCE_DEFAULT.get(config.speculative_method or "", 0.5)
    sched = _scheduler_config(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_tokens,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=True if config.enable_prefix_caching is None else config.enable_prefix_caching,
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        scheduling_policy=config.scheduling_policy or "fcfs",
        num_speculative_tokens=spec_tokens,
        spec_acceptance_rate=spec_acceptance_rate if spec_tokens else 0.0,
    )
    return sched, weight_format, kv_format


# vLLM's largest CUDA graph by default: min(2 x max_num_seqs, 512) tokens
# (`max_cudagraph_capture_size`); a step of more runs outside the graphs.
GRAPH_CAPTURE_TOKENS = 512


def graph_max_tokens(config: EngineConfig, sched: SchedulerConfig, hardware: Hardware) -> int | None:
    """The most tokens a step the engine runs inside its CUDA graphs holds: 0 for an eager
    engine, None off the GPU (no graphs to leave)."""
    if hardware.kind != "gpu":
        return None
    if config.enforce_eager:
        return 0
    return min(2 * sched.max_num_seqs, GRAPH_CAPTURE_TOKENS)


def _scheduler_config(**fields: Any) -> SchedulerConfig:
    try:
        return SchedulerConfig(**fields)
    except ValueError as exc:
        flag = "--max-num-batched-tokens"
        raise InvalidEngineConfig(str(exc), flag=flag) from exc


def _weight_format(config: EngineConfig, model: ModelSpec) -> str:
    if config.quantization:
        q = config.quantization.lower()
        return "fp8" if "fp8" in q else ("fp4" if "fp4" in q else ("int4" if q in ("awq", "gptq") else q))
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32"}
    if config.dtype in ("auto", None):
        return model.checkpoint_format
    return dtype.get(config.dtype, config.dtype)


def prompt_block_hashes(
    request: TraceRequest,
    *,
    num_prompt_tokens: int,
    overhead_tokens: int,
    block_size: int,
) -> list[int]:
    """Chained hashes of the engine's full prompt blocks that lie inside the trace's shared blocks.

    The load generator sends `overhead_tokens` special tokens, then the trace's blocks: block j
    is the words of id `hash_ids[j]` (cut at the prompt's end), and the rest is private to the
    request. Only blocks made wholly of shared content can ever match another request's, and a
    chained hash stops at the first private one, so hashing stops there.
    """
    ids = request.hash_ids
    if not ids:
        return []
    trace_block = request.block_tokens
    content = num_prompt_tokens - overhead_tokens
    shared_tokens = overhead_tokens + min(content, len(ids) * trace_block)
    hashes = []
    prev = 0
    for b in range(shared_tokens // block_size):
        c0 = b * block_size - overhead_tokens  # first content index in the block (<0: special tokens)
        c1 = (b + 1) * block_size - overhead_tokens - 1
        j0 = max(c0, 0) // trace_block
        j1 = c1 // trace_block
        desc = (c0, c1 % trace_block, *ids[j0 : j1 + 1]) if c0 >= 0 else (c0, c1, *ids[: j1 + 1])
        prev = hash((prev, desc))
        hashes.append(prev)
    return hashes


@dataclass(frozen=True)
class TimeBreakdown:
    """Where time went, in milliseconds (means over the requests it covers)."""

    overhead_ms: float  # outside the engine loop (HTTP, tokenization)
    queueing_ms: float  # waiting for admission (a slot, KV space or budget)
    prefill_compute_ms: float  # own share of the steps computing the prompt
    chunking_delay_ms: float  # behind other requests' tokens in shared steps, or left out of steps
    preemption_ms: float  # re-waiting and recomputing after preemption

    def dominant(self) -> str:
        parts = {
            "queueing": self.queueing_ms,
            "prefill_compute": self.prefill_compute_ms,
            "chunking_delay": self.chunking_delay_ms,
            "preemption": self.preemption_ms,
            "overhead": self.overhead_ms,
        }
        return max(parts, key=lambda k: parts[k])

    def load_free_share(self) -> float:
        """The share of the TTFT that does not depend on load: the fixed overhead and the
        request's own prefill compute (1.0 when there is no time to split)."""
        total = (
            self.overhead_ms
            + self.queueing_ms
            + self.prefill_compute_ms
            + self.chunking_delay_ms
            + self.preemption_ms
        )
        return (self.overhead_ms + self.prefill_compute_ms) / total if total > 0 else 1.0


@dataclass(frozen=True)
class RequestAttribution:
    """One request's TTFT split (ms); the parts sum to its TTFT."""

    index: int
    ttft_ms: float
    overhead_ms: float
    queueing_ms: float
    prefill_compute_ms: float
    chunking_delay_ms: float
    preemption_ms: float
    decode_stall_ms: float  # preemption after the first token (lengthens TPOT)
    num_cached_prompt_tokens: int  # prefix-cache hit at admission
    num_preemptions: int


KNOBS = {
    "queueing": "capacity: a larger max_num_seqs / max_num_batched_tokens if slots or budget block "
    "admission, more KV memory if the cache does, else faster hardware or more replicas",
    "prefill_compute": "prefill speed: dtype/quantization, tensor_parallel_size, faster hardware, "
    "or enable_prefix_caching where prompts share prefixes",
    "chunking_delay": "max_num_batched_tokens (token budget per step), long_prefill_token_threshold, "
    "or max_num_seqs (fewer decodes sharing each step)",
    "preemption": "KV capacity: gpu_memory_utilization / cpu_kv_cache_space_gib, kv_cache_dtype=fp8, "
    "or a lower max_num_seqs",
    "overhead": "per-request overhead outside the engine (client, HTTP, tokenizer, other requests' streams "
    "sharing the API server's CPU): not an engine knob",
}


@dataclass(frozen=True)
class Attribution:
    """Where the milliseconds go, for a configuration and a trace."""

    mean: TimeBreakdown  # over all completed requests
    tail: TimeBreakdown  # over the requests at or above the p95 TTFT
    dominant_cause: str  # of the tail
    knob: str  # what addresses the dominant cause
    step_time_share: dict[str, float]  # share of busy engine time per operator class
    queue_blocked_share: dict[str, float]  # share of steps with a waiting queue, by what blocked it
    requests: tuple[RequestAttribution, ...] = field(repr=False)


@dataclass(frozen=True)
class SimResult:
    """A simulated replay: the load generator's outputs plus what only a simulator can tell."""

    requests: tuple[RequestResult, ...] = field(repr=False)
    summary: ReplaySummary
    attribution: Attribution
    scheduler: SchedulerConfig
    basis: str  # how step times were obtained (measured, or datasheet + whose efficiency)
    model: str
    hardware: str
    num_steps: int
    num_preemptions: int
    prefix_cache_hit_rate: float  # cached prompt tokens / admitted prompt tokens
    num_prompt_tokens_cached: int  # prompt tokens a prefix-cache hit skipped, at first admission
    max_kv_blocks_used: int
    busy_s: float  # simulated time the engine spent in steps
    wall_s: float  # real time the simulation took
    # tokens in one engine step -> (number of such steps, simulated seconds they took): what the
    # kernels see (a fused-MoE or norm launch runs over every token of the step)
    step_tokens: Mapping[int, tuple[int, float]] = field(default_factory=dict, repr=False)
    # The steps vLLM's tokens-per-iteration histogram (`vllm:iteration_tokens_total`) records, by
    # the tokens it counts -> how many: a step is recorded only where it samples a token, and
    # counts each prompt's computed tokens (less its prefix-cache hit) in the step that samples
    # its first token, so its prompt chunks before that are in no step's count (what the live
    # engine's histogram is set beside).
    sampled_step_tokens: Mapping[int, int] = field(default_factory=dict, repr=False)


def _request_overhead_ms(step_model: StepTimeModel) -> float:
    return step_model.request_overhead_s * 1000.0


def cpu_compute_parallelism(config: EngineConfig) -> float:
    """Cores the CPU engine's worker computes on (VLLM_CPU_OMP_THREADS_BIND) over vLLM's own
    choice, every core of this machine but one (the calibration's engine ran with that)."""
    default = max(1, len(os.sched_getaffinity(0)) - 1) if hasattr(os, "sched_getaffinity") else 1
    bound = dict(config.extra_env).get(CPU_BIND_ENV, "auto")
    if bound in ("auto", "nobind", ""):
        return 1.0
    try:
        cores = parse_cpu_list(bound.split("|")[0].replace(" ", ""))
    except ValueError:  # not a list vLLM would take: its own choice
        return 1.0
    return len(cores) / default if cores else 1.0


def simulate(
    requests: Sequence[TraceRequest],
    *,
    model: ModelSpec,
    hardware: Hardware,
    config: EngineConfig,
    step_model: StepTimeModel | None = None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    offsets_s: Sequence[float] | None = None,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    prompt_overhead_tokens: int = 1,
    rng: np.random.Generator | None = None,
    slo: SLO | None = None,
    record_itl: bool = False,
    spec_acceptance_rate: float | None = None,
    efficiency: Efficiency | None = None,
) -> SimResult:
    """Simulate replaying `requests` (arrivals x time_scale / rate_scale, or `offsets_s`).

    `efficiency` overrides the hardware's stored calibration (e.g. one corrected by live trials).
    """
    started = time.perf_counter()
    sched_cfg, weight_format, kv_format = resolve_config(
        config, model, hardware, spec_acceptance_rate=spec_acceptance_rate
    )
    if step_model is None:
        compute = (
            "fp32"
            if weight_format == "fp32"
            else ("bf16" if weight_format in ("fp16", "int4") else weight_format)
        )
        step_model = StepTimeModel(
            model,
            hardware,
            weight_format=weight_format,
            kv_cache_format=kv_format,
            compute_format=compute,
            tensor_parallel_size=config.tensor_parallel_size,
            efficiency=efficiency,
            compute_parallelism=cpu_compute_parallelism(config) if hardware.kind == "cpu" else 1.0,
            graph_max_tokens=graph_max_tokens(config, sched_cfg, hardware),
        )
    if sched_cfg.num_speculative_tokens and rng is None:
        rng = np.random.default_rng(0)
    scheduler = Scheduler(sched_cfg, rng=rng)
    offsets = (
        list(offsets_s)
        if offsets_s is not None
        else trace_offsets_s(requests, time_scale=time_scale, rate_scale=rate_scale)
    )
    overhead_s = step_model.request_overhead_s
    sims: list[SimRequest] = []
    errors: dict[int, str] = {}
    for index, (req, offset) in enumerate(zip(requests, offsets, strict=True)):
        target = (
            req.num_prompt_tokens
            if max_prompt_tokens is None
            else min(req.num_prompt_tokens, max_prompt_tokens)
        )
        num_prompt = max(1, target - prompt_overhead_tokens) + prompt_overhead_tokens
        out = max(1, req.num_output_tokens)
        if max_output_tokens is not None:
            out = min(out, max_output_tokens)
        hashes = (
            prompt_block_hashes(
                req,
                num_prompt_tokens=num_prompt,
                overhead_tokens=prompt_overhead_tokens,
                block_size=sched_cfg.block_size,
            )
            if sched_cfg.enable_prefix_caching
            else []
        )
        sim = SimRequest(
            index,
            engine_arrival_s=offset + overhead_s + num_prompt * step_model.prompt_token_overhead_s,
            num_prompt_tokens=num_prompt,
            max_output_tokens=out,
            block_hashes=hashes,
        )
        if record_itl:
            sim.itl_s = []
        if num_prompt + out > sched_cfg.max_model_len:
            errors[index] = (
                f"HTTP 400: {num_prompt} prompt + {out} output tokens exceed max_model_len {sched_cfg.max_model_len}"
            )
        sims.append(sim)
    # Requests are sent at their offsets; each reaches the engine after the frontend has read its
    # prompt (a per-token cost, one prompt at a time) and the fixed overhead, plus, where the
    # calibration has one, the per-stream cost of the streams open when it was sent (the frontend
    # shares its CPU with them): resolved as the replay passes each send time.
    sends = sorted(
        ((offsets[s.index], s) for s in sims if s.index not in errors), key=lambda p: (p[0], p[1].index)
    )
    loop = _Loop(scheduler, step_model, record_itl=record_itl)
    loop.run(
        sends,
        overhead_s=overhead_s,
        stream_s=step_model.stream_overhead_s,
        prompt_token_s=step_model.prompt_token_overhead_s,
    )

    results = []
    for sim, offset in zip(sims, offsets, strict=True):
        results.append(_to_result(sim, offset, overhead_s, errors.get(sim.index)))
    ok_finish = [s.finish_s for s in sims if s.finish_s is not None]
    first = min(offsets) if offsets else 0.0
    duration_s = (max(ok_finish) - first) if ok_finish else 0.0
    summary = summarize(results, duration_s=duration_s, slo=slo or SLO())
    attribution = _attribute(sims, results, loop)
    admitted = scheduler.num_prompt_tokens_admitted
    return SimResult(
        requests=tuple(results),
        summary=summary,
        attribution=attribution,
        scheduler=sched_cfg,
        basis=step_model.basis,
        model=model.name,
        hardware=hardware.name,
        num_steps=loop.num_steps,
        num_preemptions=scheduler.num_preemptions,
        prefix_cache_hit_rate=scheduler.num_prompt_tokens_cached / admitted if admitted else 0.0,
        num_prompt_tokens_cached=scheduler.num_prompt_tokens_cached,
        max_kv_blocks_used=loop.max_blocks_used,
        busy_s=loop.busy_s,
        wall_s=time.perf_counter() - started,
        step_tokens={n: (int(c), s) for n, (c, s) in sorted(loop.step_tokens.items())},
        sampled_step_tokens=dict(sorted(loop.sampled_step_tokens.items())),
    )


def _to_result(sim: SimRequest, offset: float, overhead_s: float, error: str | None) -> RequestResult:
    if error is not None or sim.first_token_s is None or sim.finish_s is None:
        return RequestResult(
            index=sim.index,
            scheduled_s=offset,
            send_lateness_ms=0.0,
            num_prompt_tokens=sim.num_prompt_tokens,
            num_prompt_tokens_reported=None,
            max_output_tokens=sim.max_output_tokens,
            num_output_tokens=0,
            ttft_ms=None,
            e2e_ms=None,
            tpot_ms=None,
            status=400 if error else None,
            error=error or "not finished in the simulation",
        )
    ttft_ms = (sim.first_token_s - offset) * 1000.0
    e2e_ms = (sim.finish_s - offset) * 1000.0
    n = sim.num_output_tokens
    tpot_ms = (e2e_ms - ttft_ms) / (n - 1) if n > 1 else None
    return RequestResult(
        index=sim.index,
        scheduled_s=offset,
        send_lateness_ms=0.0,
        num_prompt_tokens=sim.num_prompt_tokens,
        num_prompt_tokens_reported=sim.num_prompt_tokens,
        max_output_tokens=sim.max_output_tokens,
        num_output_tokens=n,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        tpot_ms=tpot_ms,
        itl_ms=tuple(x * 1000.0 for x in sim.itl_s) if sim.itl_s else (),
        status=200,
        error=None,
    )


class _Loop:
    """The engine loop over simulated time, with decode-only stretches advanced in one jump."""

    def __init__(self, scheduler: Scheduler, step_model: StepTimeModel, *, record_itl: bool) -> None:
        self.s = scheduler
        self.m = step_model
        self.record_itl = record_itl
        self.num_steps = 0
        self.busy_s = 0.0
        self.max_blocks_used = 0
        self.op_s = {"gemm": 0.0, "attention": 0.0, "communication": 0.0, "overhead": 0.0}
        self.blocked_steps: dict[str, float] = {}
        self.step_tokens: dict[int, list[float]] = {}  # tokens -> [steps, seconds]
        self.sampled_step_tokens: dict[int, int] = {}  # tokens as vLLM counts them -> steps

    def run(
        self,
        sends: Sequence[tuple[float, SimRequest]],
        *,
        overhead_s: float,
        stream_s: float = 0.0,
        prompt_token_s: float = 0.0,
    ) -> None:
        """Replay `sends` ((send time, request), in send order).

        A request reaches the engine `overhead_s` after the frontend has read its prompt, at
        `prompt_token_s` per token, one prompt at a time in send order (one API-server process
        tokenizes them: a long prompt holds up the requests sent after it, not the engine's steps),
        plus `stream_s` for every stream open at its send time (first token out, not finished). That count is known once the replay has passed the send time, so each send is
        resolved then and queued by its arrival; until then `send time + overhead_s` bounds its
        arrival, which is all the clock jumps need.
        """
        s = self.s
        cfg = s.config
        m = self.m
        now = 0.0
        nxt = 0
        n_send = len(sends)
        arrivals: list[tuple[float, int, SimRequest]] = []  # resolved, not yet reached the engine
        first_times = s.first_token_times
        finish_times = s.finish_times
        spec = cfg.num_speculative_tokens
        op_s = self.op_s
        pool = s.pool
        step_tokens = self.step_tokens
        sampled_step_tokens = self.sampled_step_tokens
        frontend_free = 0.0  # when the frontend has read the prompts sent so far
        while nxt < n_send or arrivals or s.waiting or s.running:
            while nxt < n_send and sends[nxt][0] <= now:  # every event up to `now` is known
                offset, req = sends[nxt]
                nxt += 1
                if prompt_token_s:  # one frontend reads the prompts, in the order they were sent
                    frontend_free = max(offset, frontend_free) + prompt_token_s * req.num_prompt_tokens
                    arrival = frontend_free + overhead_s
                else:
                    arrival = offset + overhead_s
                if stream_s:
                    opened = bisect.bisect_right(first_times, offset)
                    arrival += stream_s * (opened - bisect.bisect_right(finish_times, offset))
                req.engine_arrival_s = arrival
                heapq.heappush(arrivals, (arrival, req.index, req))
            while arrivals and arrivals[0][0] <= now:
                s.add_request(heapq.heappop(arrivals)[2])
            next_arrival = arrivals[0][0] if arrivals else math.inf
            if nxt < n_send and sends[nxt][0] + overhead_s < next_arrival:
                next_arrival = sends[nxt][0] + overhead_s
            if not (s.waiting or s.running):
                now = next_arrival
                continue
            if not spec and self._try_jump(now, next_arrival):
                now = self._jump_end
                continue
            out = s.schedule(now)
            if out.num_tokens == 0:
                if next_arrival == math.inf:
                    raise RuntimeError("simulated engine stalled: nothing schedulable and no arrivals left")
                now = max(now, next_arrival)
                continue
            num_tokens = out.num_prefill_tokens + out.num_decode_tokens
            gemm, attention, comm, overhead = m.step_parts(  # step_time's parts, no objects built
                num_tokens,
                len(out.scheduled),
                out.num_sampled,
                out.prefill_attn_pairs,
                out.prefill_cached_tokens,
                out.decode_ctx_tokens,
            )
            op_s["gemm"] += gemm
            op_s["attention"] += attention
            op_s["communication"] += comm
            op_s["overhead"] += overhead
            dt = gemm + attention + comm + overhead
            if out.blocked_by is not None:
                self.blocked_steps[out.blocked_by] = self.blocked_steps.get(out.blocked_by, 0.0) + dt
            used = pool.fresh - len(pool.free)  # pool.num_used, inlined (hot path)
            if used > self.max_blocks_used:
                self.max_blocks_used = used
            s.update_from_output(out, now, now + dt)
            counted = s.step_counted_tokens
            if counted:
                sampled_step_tokens[counted] = sampled_step_tokens.get(counted, 0) + 1
            now += dt
            self.busy_s += dt
            self.num_steps += 1
            entry = step_tokens.get(num_tokens)
            if entry is None:
                step_tokens[num_tokens] = [1.0, dt]
            else:
                entry[0] += 1
                entry[1] += dt

    _jump_end = 0.0

    def _try_jump(self, now: float, next_arrival: float) -> bool:
        """Advance k >= 2 identical decode steps at once when nothing else can happen meanwhile."""
        s = self.s
        cfg = s.config
        running = s.running
        n = len(running)
        if n == 0 or n > cfg.max_num_batched_tokens:
            return False
        if s.waiting and n < cfg.max_num_seqs:
            return False
        last = running[-1]  # the newest admission, the likeliest to be still in its prefill
        if (
            last.num_output_tokens == 0
            or last.num_computed_tokens != last.num_prompt_tokens + last.num_output_tokens - 1
        ):
            return False
        k = 1 << 30
        ctx0 = 0
        bs = cfg.block_size
        # Per request, the tokens its blocks still hold beyond what it computed: k more steps need
        # ceil((k - room) / bs) new blocks when k > room (= ceil((computed + k) / bs) - blocks).
        rooms = []
        for req in running:
            out_tokens = req.num_output_tokens
            tokens = req.num_prompt_tokens + out_tokens  # req.num_tokens, inlined (hot path)
            computed = req.num_computed_tokens
            if out_tokens == 0 or computed != tokens - 1:
                return False
            left = req.max_output_tokens - out_tokens
            if left < k:
                k = left
            ctx0 += tokens
            rooms.append(len(req.blocks) * bs - computed)
        if k < 2 or self.m.eager_floored(n):  # a floored step's time is not linear in the context
            return False
        # A decode step's parts grow linearly with the context (n more tokens per step): the
        # first step's and their growth give every step of the stretch, and its sums.
        g0, a0, c0, o0 = self.m.step_parts(n, n, n, 0.0, 0, ctx0)
        g1, a1, c1, o1 = self.m.step_parts(n, n, n, 0.0, 0, ctx0 + n)
        t0 = g0 + a0 + c0 + o0
        slope = g1 + a1 + c1 + o1 - t0
        if next_arrival < math.inf:
            gap = next_arrival - now
            # Steps that start before the next arrival: smallest i with C(i) >= gap, where
            # C(i) = i*t0 + slope*i*(i-1)/2 is the start of step i.
            if slope > 1e-15:
                a, b = slope / 2.0, t0 - slope / 2.0
                i_arr = math.ceil((-b + math.sqrt(b * b + 4 * a * gap)) / (2 * a))
            else:
                i_arr = math.ceil(gap / t0) if t0 > 0 else k
            i_arr = max(1, i_arr)
            while i_arr > 1 and (i_arr - 1) * t0 + slope * (i_arr - 1) * (i_arr - 2) / 2.0 >= gap:
                i_arr -= 1
            k = min(k, i_arr)
        if k < 2:
            return False
        pool = s.pool
        free = pool.num_blocks - pool.fresh + len(pool.free)  # pool.num_free, inlined (hot path)
        while k >= 2:
            needed = 0
            for room in rooms:
                if k > room:
                    needed += -(-(k - room) // bs)
            if needed <= free:
                break
            k //= 2
        if k < 2:
            return False
        pairs = k * (k - 1) / 2.0  # sum of 0..k-1: how much of the growth the k steps add up
        total = k * t0 + slope * pairs
        end = now + total
        op_s = self.op_s
        op_s["gemm"] += k * g0 + (g1 - g0) * pairs
        op_s["attention"] += k * a0 + (a1 - a0) * pairs
        op_s["communication"] += k * c0 + (c1 - c0) * pairs
        op_s["overhead"] += k * o0 + (o1 - o0) * pairs
        for req, room in zip(running, rooms, strict=True):
            if k > room:
                req.blocks.extend(pool.allocate(-(-(k - room) // bs)))
            if req.itl_s is not None:
                gaps = [t0 + slope * i for i in range(k)]
                if req.last_token_s is not None:
                    gaps[0] = now + t0 - req.last_token_s
                req.itl_s.extend(gaps)
            req.num_computed_tokens += k
            req.num_output_tokens += k
            req.last_token_s = end
        used = pool.fresh - len(pool.free)  # pool.num_used, inlined
        if used > self.max_blocks_used:
            self.max_blocks_used = used
        finished = [r for r in running if r.num_output_tokens >= r.max_output_tokens]
        if finished:
            s.running = [r for r in running if r.num_output_tokens < r.max_output_tokens]
            for req in finished:
                req.finish_s = end
                s.finish_times.append(end)
                pool.release(req.blocks)
                req.blocks = []
        if s.waiting:
            blocked = "max_num_seqs"
            self.blocked_steps[blocked] = self.blocked_steps.get(blocked, 0.0) + total
        self.num_steps += k
        self.busy_s += total
        # each of the k steps samples one token for each of the n (vLLM's histogram counts n)
        self.sampled_step_tokens[n] = self.sampled_step_tokens.get(n, 0) + k
        entry = self.step_tokens.get(n)
        if entry is None:
            self.step_tokens[n] = [float(k), total]
        else:
            entry[0] += k
            entry[1] += total
        self._jump_end = end
        return True


def _attribute(sims: list[SimRequest], results: list[RequestResult], loop: _Loop) -> Attribution:
    rows = []
    for sim, res in zip(sims, results, strict=True):
        if res.ttft_ms is None:
            continue
        rows.append(
            RequestAttribution(
                index=sim.index,
                ttft_ms=res.ttft_ms,
                # Outside the engine: the fixed cost and any wait behind other streams.
                overhead_ms=(sim.engine_arrival_s - res.scheduled_s) * 1000.0,
                queueing_ms=sim.queue_s * 1000.0,
                prefill_compute_ms=sim.prefill_s * 1000.0,
                chunking_delay_ms=sim.chunk_wait_s * 1000.0,
                preemption_ms=sim.preempt_s * 1000.0,
                decode_stall_ms=sim.preempt_stall_s * 1000.0,
                num_cached_prompt_tokens=max(0, sim.num_cached_tokens),
                num_preemptions=sim.num_preemptions,
            )
        )
    mean = _mean_breakdown(rows)
    if rows:
        cut = float(np.percentile([r.ttft_ms for r in rows], 95))
        tail = _mean_breakdown([r for r in rows if r.ttft_ms >= cut])
    else:
        tail = mean
    busy = sum(loop.op_s.values()) or 1.0
    blocked_total = sum(loop.blocked_steps.values())
    dominant = tail.dominant()
    return Attribution(
        mean=mean,
        tail=tail,
        dominant_cause=dominant,
        knob=KNOBS[dominant],
        step_time_share={k: v / busy for k, v in loop.op_s.items()},
        queue_blocked_share={k: v / blocked_total for k, v in loop.blocked_steps.items()}
        if blocked_total
        else {},
        requests=tuple(rows),
    )


def _mean_breakdown(rows: list[RequestAttribution]) -> TimeBreakdown:
    if not rows:
        return TimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0)
    n = float(len(rows))
    return TimeBreakdown(
        overhead_ms=sum(r.overhead_ms for r in rows) / n,
        queueing_ms=sum(r.queueing_ms for r in rows) / n,
        prefill_compute_ms=sum(r.prefill_compute_ms for r in rows) / n,
        chunking_delay_ms=sum(r.chunking_delay_ms for r in rows) / n,
        preemption_ms=sum(r.preemption_ms for r in rows) / n,
    )
