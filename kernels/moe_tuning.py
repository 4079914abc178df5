"""Tuning the engine's fused-MoE kernel per batch-size bucket, weighted by the traffic.

vLLM's fused-MoE Triton kernel takes its launch configuration from a table keyed by batch size
(the tokens of one engine step; `serving.engine.moe_tables` has the format). vLLM's own tuning
script times every candidate at every key of a fixed grid, each key alike. Here a bucket is
what the traffic makes of a key: the steps whose token count maps to it, their share of the
engine's time (`weight`), and the token counts that actually occur in it (`points`). The tuner

- spends a bounded number of timed trials, more of them where the traffic spends its time: a
  bucket gets `round(budget x weight)` candidates from a prior-ordered pool, at least
  `min_per_bucket`, at most the pool;
- times each candidate at the bucket's own token counts (not at the key) and keeps the one with
  the lowest traffic-weighted time;
- refuses before starting a run whose estimated time does not fit the given budget.

The timing (`bench`) and the check (`check`) are injected: on a GPU the caller times vLLM's real
kernel (or `kernels.moe_gemm`'s, a kernel of the same tiling); on a CPU, tests run
`kernels.moe_gemm` in Triton's interpreter to check configurations, never to time them.
Candidate configurations use vLLM's keys (BLOCK_SIZE_M, ...), so a result is a table entry as is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
MAX_TRIALS = 20_000  # one run's timed (config, bucket) pairs: hours of device time at most
MAX_POINTS = 16  # token counts timed per bucket
MAX_TOKENS = 1 << 17  # one step's tokens; beyond any engine's batched-token budget

Bench = Callable[[Mapping[str, int], int], float]  # (config, tokens) -> microseconds
Check = Callable[[Mapping[str, int], int], None]  # (config, tokens) -> raises if unusable
# tokens -> the configuration the engine runs without a table of ours (vLLM's keys)
Baseline = Callable[[int], Mapping[str, int]]


class TuningWontFit(RuntimeError):
    """The run would exceed its time or memory budget; the message says by how much."""


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer as its fused kernel sees it on one device."""

    num_experts: int  # E
    shard_intermediate_size: int  # N: one expert's MLP width on this tensor-parallel shard
    hidden_size: int  # K of the up projection
    top_k: int  # experts per token
    dtype_bytes: int = 2  # bf16/fp16

    def __post_init__(self) -> None:
        for name in ("num_experts", "shard_intermediate_size", "hidden_size", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoE shape: {name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoE shape: top_k {self.top_k} exceeds the {self.num_experts} experts")

    @property
    def weight_bytes(self) -> int:
        """Both projections' weights (w1: [E, 2N, K], w2: [E, K, N])."""
        return 3 * self.num_experts * self.shard_intermediate_size * self.hidden_size * self.dtype_bytes

    def workspace_bytes(self, num_tokens: int) -> int:
        """Activations and intermediates of one call at `num_tokens` (an upper bound)."""
        pairs = num_tokens * self.top_k
        return (
            num_tokens * self.hidden_size * 2 + pairs * (3 * self.shard_intermediate_size + self.hidden_size)
        ) * self.dtype_bytes


@dataclass(frozen=True)
class TuneBucket:
    """One table key to tune: its share of the engine's time and where to time it."""

    key: int
    weight: float  # share of the traffic's step time in this bucket (0 for a uniform grid's keys)
    points: tuple[tuple[int, float], ...]  # (tokens, share of the bucket's time); shares sum to 1

    def __post_init__(self) -> None:
        if not 1 <= self.key <= MAX_TOKENS:
            raise ValueError(f"bucket key {self.key} outside [1, {MAX_TOKENS}]")
        if not self.points or len(self.points) > MAX_POINTS:
            raise ValueError(f"bucket {self.key}: 1 to {MAX_POINTS} token counts, got {len(self.points)}")
        for tokens, share in self.points:
            if not 1 <= tokens <= MAX_TOKENS or not share >= 0:
                raise ValueError(f"bucket {self.key}: bad point ({tokens}, {share})")
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"bucket {self.key}: weight must be >= 0, got {self.weight}")


def uniform_buckets(keys: Sequence[int]) -> list[TuneBucket]:
    """vLLM's approach: every key alike, timed at the key itself."""
    return [TuneBucket(k, 1.0 / len(keys), ((k, 1.0),)) for k in sorted(set(keys))]


def traffic_buckets(buckets: Sequence[Any]) -> list[TuneBucket]:
    """From `serving.engine.moe_tables.bucket_steps` output (anything with key, weight, points)."""
    return [TuneBucket(int(b.key), float(b.weight), tuple(b.points)) for b in buckets]


def candidate_pool(limit: int = 400) -> list[dict[str, int]]:
    """Candidate configurations, the likeliest winners first.

    First the curated shapes of `kernels.moe_gemm` (those that win somewhere on Hopper), then a
    grid over the sizes vLLM's tuning script searches, ordered so that a prefix of any length
    still spans small and large tiles. `limit` bounds the pool.
    """
    from kernels.moe_gemm import candidate_configs

    if not 1 <= limit <= 4096:
        raise ValueError(f"limit must be in [1, 4096], got {limit}")
    seen: set[tuple[int, ...]] = set()
    out: list[dict[str, int]] = []

    def add(cfg: dict[str, int]) -> None:
        key = tuple(cfg[k] for k in VLLM_KEYS)
        if key not in seen:
            seen.add(key)
            out.append(cfg)

    for c in candidate_configs():
        add(to_vllm(c))
    grid = itertools.product(
        (1, 16, 32), (4, 3, 5, 2), (4, 8), (64, 128, 256), (64, 128, 32), (16, 32, 64, 128)
    )
    for group_m, stages, warps, bn, bk, bm in grid:
        cfg = {
            "BLOCK_SIZE_M": bm,
            "BLOCK_SIZE_N": bn,
            "BLOCK_SIZE_K": bk,
            "GROUP_SIZE_M": group_m,
            "num_warps": warps,
            "num_stages": stages,
        }
        add(cfg)
    return out[:limit]


def to_vllm(cfg: Mapping[str, int]) -> dict[str, int]:
    """A `kernels.moe_gemm` configuration under vLLM's table keys."""
    return {
        "BLOCK_SIZE_M": int(cfg["block_m"]),
        "BLOCK_SIZE_N": int(cfg["block_n"]),
        "BLOCK_SIZE_K": int(cfg["block_k"]),
        "GROUP_SIZE_M": int(cfg["group_m"]),
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg["num_stages"]),
    }


def from_vllm(cfg: Mapping[str, int]) -> dict[str, int]:
    """A vLLM table entry as a `kernels.moe_gemm` configuration."""
    return {
        "block_m": int(cfg["BLOCK_SIZE_M"]),
        "block_n": int(cfg["BLOCK_SIZE_N"]),
        "block_k": int(cfg["BLOCK_SIZE_K"]),
        "group_m": int(cfg["GROUP_SIZE_M"]),
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg["num_stages"]),
    }


def preferred_block_m(tokens: int, shape: MoEShape) -> int:
    """The row tile a bucket's steps fill: about the tokens each expert receives, 16 to 128.

    The kernel groups token-expert pairs by expert and tiles each group in BLOCK_SIZE_M rows; a
    tile much taller than an expert's share computes padding, a much shorter one re-reads the
    expert's weights once per tile."""
    per_expert = math.ceil(tokens * shape.top_k / shape.num_experts)
    block_m = 16
    while block_m < per_expert and block_m < 128:
        block_m *= 2
    return block_m


def bucket_order(
    candidates: Sequence[Mapping[str, int]], bucket: TuneBucket, shape: MoEShape
) -> tuple[int, ...]:
    """The pool's indices in the order `bucket` tries them: row tiles nearest the bucket's
    preferred one first (`preferred_block_m` at its key), the pool's own order within each."""
    want = math.log2(preferred_block_m(bucket.key, shape))
    return tuple(
        sorted(
            range(len(candidates)),
            key=lambda i: (abs(math.log2(max(1, int(candidates[i]["BLOCK_SIZE_M"]))) - want), i),
        )
    )


@dataclass(frozen=True)
class Plan:
    """How many candidates each bucket gets, and which; decided (and bounded) before anything runs."""

    buckets: tuple[TuneBucket, ...]
    candidates: tuple[dict[str, int], ...] = field(repr=False)
    per_bucket: tuple[int, ...]  # candidates tried in each bucket
    # Per bucket, the pool indices it tries in order (None: every bucket the pool's prefix).
    orders: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)

    def bucket_candidates(self, index: int) -> list[dict[str, int]]:
        """The candidates bucket `index` tries, in order."""
        n = self.per_bucket[index]
        if self.orders is None:
            return [dict(c) for c in self.candidates[:n]]
        return [dict(self.candidates[i]) for i in self.orders[index][:n]]

    @property
    def num_timings(self) -> int:
        """Kernel timings the run makes: a candidate is timed at each of its bucket's points."""
        return sum(n * len(b.points) for b, n in zip(self.buckets, self.per_bucket, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": [
                {
                    "key": b.key,
                    "weight": round(b.weight, 6),
                    "points": [list(p) for p in b.points],
                    "candidates": n,
                    "block_m_tried": sorted({c["BLOCK_SIZE_M"] for c in self.bucket_candidates(i)}),
                }
                for i, (b, n) in enumerate(zip(self.buckets, self.per_bucket, strict=True))
            ],
            "pool": len(self.candidates),
            "timings": self.num_timings,
        }


def plan(
    buckets: Sequence[TuneBucket],
    candidates: Sequence[Mapping[str, int]],
    *,
    budget: int,
    min_per_bucket: int = 4,
    shape: MoEShape | None = None,
) -> Plan:
    """Share `budget` candidate trials over the buckets by weight (uniform buckets: equally).

    With the layer's `shape`, each bucket tries the candidates whose row tile suits its token
    count first (`bucket_order`); without it every bucket tries the same prefix of the pool,
    which at a few candidates per bucket leaves large buckets with small tiles only."""
    if not buckets:
        raise ValueError("nothing to tune: no buckets (the traffic produced no engine steps)")
    if not candidates:
        raise ValueError("no candidate configurations")
    if not 1 <= budget <= MAX_TRIALS:
        raise ValueError(f"budget must be in [1, {MAX_TRIALS}], got {budget}")
    if min_per_bucket < 1:
        raise ValueError(f"min_per_bucket must be >= 1, got {min_per_bucket}")
    keys = [b.key for b in buckets]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate bucket keys in {keys}")
    pool = len(candidates)
    total_w = sum(b.weight for b in buckets)
    if total_w <= 0:
        raise ValueError("every bucket has weight 0")
    floor = min(min_per_bucket, pool)
    if floor * len(buckets) > budget:
        raise ValueError(
            f"a budget of {budget} trials cannot give {len(buckets)} buckets {floor} candidates each"
        )
    # Largest remainder over the budget left after every bucket's floor.
    spare = budget - floor * len(buckets)
    raw = [spare * b.weight / total_w for b in buckets]
    extra = [math.floor(r) for r in raw]
    for i in sorted(range(len(buckets)), key=lambda i: raw[i] - extra[i], reverse=True)[: spare - sum(extra)]:
        extra[i] += 1
    counts = [min(pool, floor + e) for e in extra]
    orders = None if shape is None else tuple(bucket_order(candidates, b, shape) for b in buckets)
    return Plan(
        tuple(buckets),
        tuple(dict(c) for c in candidates),
        tuple(counts),
        orders,
    )


@dataclass(frozen=True)
class Trial:
    config: dict[str, int]
    time_us: float | None  # traffic-weighted over the bucket's points; None when it failed
    error: str | None = None


@dataclass(frozen=True)
class BucketChoice:
    bucket: TuneBucket
    trials: tuple[Trial, ...] = field(repr=False)
    # What the engine runs for this bucket without a table of ours (its shipped table's entry or
    # its generic default), timed like a candidate and eligible like one: a table never holds a
    # configuration slower than the engine's own, as timed. None: no baseline was given.
    baseline: Trial | None = None

    @property
    def best(self) -> Trial | None:
        ok = [t for t in (*self.trials, *([self.baseline] if self.baseline else [])) if t.time_us is not None]
        return min(ok, key=lambda t: t.time_us or 0.0) if ok else None

    @property
    def best_is_baseline(self) -> bool:
        return self.baseline is not None and self.best is self.baseline


@dataclass(frozen=True)
class TuneResult:
    plan: Plan
    choices: tuple[BucketChoice, ...]
    complete: bool  # False when `should_stop` ended the run early

    def table(self) -> dict[int, dict[str, int]]:
        """The winners as a vLLM table (buckets where every candidate failed are left out)."""
        out = {}
        for choice in self.choices:
            best = choice.best
            if best is not None:
                out[choice.bucket.key] = dict(best.config)
        return out

    def weighted_time_us(self) -> float | None:
        """The table's time per step of the traffic (sum of weight x best time), as tuned."""
        num = den = 0.0
        for choice in self.choices:
            best = choice.best
            if best is not None and best.time_us is not None:
                num += choice.bucket.weight * best.time_us
                den += choice.bucket.weight
        return num / den if den else None

    def speedup_vs_baseline(self) -> float | None:
        """The engine's own configurations' weighted time over the table's, on the buckets where
        both were timed (> 1: the table is faster at the kernel level); None without a baseline."""
        num = den = 0.0
        for choice in self.choices:
            best, base = choice.best, choice.baseline
            if best is None or best.time_us is None or base is None or base.time_us is None:
                continue
            num += choice.bucket.weight * base.time_us
            den += choice.bucket.weight * best.time_us
        return num / den if den else None

    def baseline_coverage(self) -> float:
        """The traffic weight of the buckets where the engine's own configuration was timed (the
        share `speedup_vs_baseline` speaks for; an engine configuration that failed to run is
        not timed)."""
        return sum(
            c.bucket.weight
            for c in self.choices
            if c.baseline is not None and c.baseline.time_us is not None and c.best is not None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "plan": self.plan.to_dict(),
            "weighted_time_us": self.weighted_time_us(),
            "kernel_speedup_vs_engine": self.speedup_vs_baseline(),
            "kernel_speedup_vs_engine_weight_covered": round(self.baseline_coverage(), 4),
            "buckets": [
                {
                    "key": c.bucket.key,
                    "weight": round(c.bucket.weight, 6),
                    "best": None if c.best is None else {"config": c.best.config, "time_us": c.best.time_us},
                    "engine": None
                    if c.baseline is None
                    else {
                        "config": c.baseline.config,
                        "time_us": c.baseline.time_us,
                        "error": c.baseline.error,
                    },
                    "best_is_engine": c.best_is_baseline,
                    "tried": len(c.trials),
                    "failed": [{"config": t.config, "error": t.error} for t in c.trials if t.time_us is None][
                        :5
                    ],
                }
                for c in self.choices
            ],
        }


def check_fits(
    the_plan: Plan,
    shape: MoEShape,
    *,
    seconds_per_timing: float,
    time_budget_s: float,
    device_memory_bytes: int | None = None,
) -> float:
    """The run's estimated seconds; `TuningWontFit` when it exceeds the time or memory budget."""
    if seconds_per_timing <= 0 or time_budget_s <= 0:
        raise ValueError("seconds_per_timing and time_budget_s must be > 0")
    estimate = the_plan.num_timings * seconds_per_timing
    if estimate > time_budget_s:
        raise TuningWontFit(
            f"{the_plan.num_timings} timings at ~{seconds_per_timing:g} s each take ~{estimate:.0f} s, "
            f"over the budget of {time_budget_s:.0f} s: lower the budget of trials or give more time"
        )
    if device_memory_bytes is not None:
        largest = max(t for b in the_plan.buckets for t, _ in b.points)
        need = shape.weight_bytes + shape.workspace_bytes(largest)
        if need > device_memory_bytes:
            raise TuningWontFit(
                f"the layer's weights and a {largest}-token step need {need / 2**30:.1f} GiB, "
                f"more than the device's {device_memory_bytes / 2**30:.1f} GiB"
            )
    return estimate


def _timed(cfg: Mapping[str, int], bucket: TuneBucket, bench: Bench, check: Check | None) -> Trial:
    """One candidate checked, then timed over the bucket's points (weighted by their shares)."""
    try:
        if check is not None:
            for tokens, _ in bucket.points:
                check(cfg, tokens)
        t = sum(share * bench(cfg, tokens) for tokens, share in bucket.points)
        if not math.isfinite(t) or t <= 0:
            raise ValueError(f"the benchmark returned {t!r} us")
        return Trial(dict(cfg), float(t))
    except Exception as exc:  # a failing candidate is data, not a failed run
        return Trial(dict(cfg), None, f"{type(exc).__name__}: {str(exc)[:200]}")


def tune(
    the_plan: Plan,
    bench: Bench,
    *,
    check: Check | None = None,
    should_stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
    baseline: Baseline | None = None,
) -> TuneResult:
    """Run the plan: check, then time, each bucket's candidates; heaviest bucket first.

    A candidate that fails its check or its timing (a tile too large for shared memory fails at
    launch) is recorded with the error and never chosen. `should_stop` is asked before every
    bucket; when it answers True the result is partial (`complete=False`). With `baseline` (the
    configuration the engine would run at a token count without our table), each bucket also
    times the engine's configuration for its key, one timing per point more than the plan counts:
    the result says how much faster than the engine the table is, and a bucket where no
    candidate beats the engine keeps the engine's configuration.
    """
    order = sorted(range(len(the_plan.buckets)), key=lambda i: -the_plan.buckets[i].weight)
    choices: dict[int, BucketChoice] = {}
    complete = True
    for i in order:
        if should_stop is not None and should_stop():
            complete = False
            break
        bucket = the_plan.buckets[i]
        trials = [_timed(cfg, bucket, bench, check) for cfg in the_plan.bucket_candidates(i)]
        base = None
        if baseline is not None:
            try:
                engine_cfg = {k: int(v) for k, v in baseline(bucket.key).items() if k in VLLM_KEYS}
                if set(engine_cfg) != set(VLLM_KEYS):
                    raise ValueError(
                        f"the engine's configuration lacks {sorted(set(VLLM_KEYS) - set(engine_cfg))}"
                    )
            except Exception as exc:  # an engine that cannot say: no baseline for this bucket
                base = Trial({}, None, f"{type(exc).__name__}: {str(exc)[:200]}")
            else:
                base = _timed(engine_cfg, bucket, bench, check)
        choice = BucketChoice(bucket, tuple(trials), base)
        choices[i] = choice
        if log is not None:
            best = choice.best
            vs = (
                f" (engine {base.time_us:.1f} us{', kept' if choice.best_is_baseline else ''})"
                if base is not None and base.time_us is not None
                else ""
            )
            log(
                f"bucket {bucket.key:>5d} w={bucket.weight:.3f}: {len(trials)} candidates, best "
                + (f"{best.time_us:.1f} us {best.config}" if best else "none worked")
                + vs
            )
    return TuneResult(the_plan, tuple(choices[i] for i in sorted(choices)), complete)


def evaluate(table: Mapping[int, Mapping[str, int]], buckets: Sequence[TuneBucket], bench: Bench) -> float:
    """A table's traffic-weighted time per step (us): each point timed with the entry vLLM would pick."""
    if not table:
        raise ValueError("an empty table")
    keys = sorted(table)
    total = den = 0.0
    for b in buckets:
        for tokens, share in b.points:
            key = min(keys, key=lambda k: abs(k - tokens))
            total += b.weight * share * bench(table[key], tokens)
            den += b.weight * share
    return total / den


# -- the kernels' own grouped GEMM as the thing checked (and, on a GPU, optionally timed) --------


def moe_gemm_check(shape: MoEShape, *, device: str = "cpu", seed: int = 0, tol: float = 2e-2) -> Check:
    """A `check` that runs `kernels.moe_gemm` with the configuration at the given token count and
    compares it with the torch reference (bf16, relative error under `tol`).

    On a CPU it runs in Triton's interpreter (TRITON_INTERPRET=1 before triton is imported):
    give it a small shape; it proves the configuration launches and computes the right thing.
    """
    import torch

    from kernels.moe_gemm import moe_grouped_gemm, moe_grouped_gemm_ref

    gen = torch.Generator(device=device).manual_seed(seed)
    k_dim, n_dim = shape.hidden_size, 2 * shape.shard_intermediate_size
    w = (
        torch.randn(shape.num_experts, n_dim, k_dim, generator=gen, device=device, dtype=torch.bfloat16)
        * k_dim**-0.5
    )

    def check(cfg: Mapping[str, int], tokens: int) -> None:
        a = torch.randn(tokens, k_dim, generator=gen, device=device, dtype=torch.bfloat16)
        ids = torch.rand(tokens, shape.num_experts, generator=gen, device=device).topk(shape.top_k, dim=1)
        topk_ids = ids.indices.to(torch.int32)
        out = moe_grouped_gemm(a, w, topk_ids, config=from_vllm(cfg))
        ref = moe_grouped_gemm_ref(a, w, topk_ids)
        err = float((out.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30))
        if not err < tol:
            raise ValueError(f"relative error {err:.3g} over {tol:g}")

    return check


def moe_gemm_bench(shape: MoEShape, *, seed: int = 0, rep_ms: int = 25) -> Bench:
    """A `bench` timing `kernels.moe_gemm` (the up projection) on this GPU; needs CUDA."""
    import functools

    import torch

    from kernels.moe_gemm import moe_grouped_gemm
    from kernels.tune import bench_us

    if not torch.cuda.is_available():
        raise RuntimeError("moe_gemm_bench times kernels on a CUDA GPU; this machine has none")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k_dim, n_dim = shape.hidden_size, 2 * shape.shard_intermediate_size
    w = torch.randn(shape.num_experts, n_dim, k_dim, generator=gen, device="cuda", dtype=torch.bfloat16)

    def bench(cfg: Mapping[str, int], tokens: int) -> float:
        a = torch.randn(tokens, k_dim, generator=gen, device="cuda", dtype=torch.bfloat16)
        ids = torch.rand(tokens, shape.num_experts, generator=gen, device="cuda").topk(shape.top_k, dim=1)
        run = functools.partial(moe_grouped_gemm, a, w, ids.indices.to(torch.int32), config=from_vllm(cfg))
        return bench_us(run, rep_ms=rep_ms, graph=True)

    return bench
