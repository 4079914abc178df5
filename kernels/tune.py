"""Autotuning per shape bucket: time every candidate configuration of every kernel on the
buckets a workload profile says carry the traffic, on the GPU this runs on, and build the table
(`kernels.config_table`) that deployments carry.

Each candidate is first checked against the kernel's torch reference on the bucket's inputs; a
configuration that fails to compile, to launch or to match is recorded with its error and never
chosen. Times are medians of CUDA-event timings (`triton.testing.do_bench`, which also flushes
the L2 cache between repetitions).
"""

from __future__ import annotations

import datetime as dt
import functools
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels import decode_attention, moe_gemm, rmsnorm, silu_mul
from kernels._common import attention_bucket
from kernels.config_table import SCHEMA_VERSION
from kernels.models import ModelShapes
from kernels.workload import ShapeBuckets

OPS = ("rmsnorm", "silu_mul", "decode_attention", "moe_gemm")
# Relative error (||out - ref|| / ||ref||) a bf16 kernel must stay under to be timed at all.
_BF16_TOL = 2e-2


@dataclass(frozen=True)
class Trial:
    config: dict[str, int]
    time_us: float | None  # None when the configuration failed (see error)
    error: str | None = None


@dataclass(frozen=True)
class BucketResult:
    op: str
    bucket: str
    weight: float  # share of the workload's steps in this bucket
    shape: dict[str, int]  # the representative problem that was timed
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.time_us is not None]
        return min(ok, key=lambda t: t.time_us or 0.0) if ok else None


def bench_us(
    fn: Callable[[], object], *, rep_ms: int = 40, graph: bool = False, always_graph: bool = False
) -> float:
    """Median time of `fn` in microseconds, timed with CUDA events after a warm-up.

    graph=True (for calls under 0.2 ms) captures repeated calls in a CUDA graph and times its
    replays: for problems of a few microseconds the plain timing measures the Python launch
    path (on the H200: 5 to 65 us for the same 32-token RMSNorm), not the kernel. Graph replays do not flush L2
    between calls; a decode step's activations are that small and that hot in an engine too.
    always_graph=True captures whatever the call takes: for an op whose Python path alone is
    longer than 0.2 ms (vLLM's fused_experts: a sort, two GEMMs, an activation and a sum,
    launched from Python) the 0.2 ms probe would fall back to timing that path, while the
    engine replays the op inside its CUDA graphs. Falls back to plain timing where capture fails.
    """
    from triton.testing import do_bench, do_bench_cudagraph

    graph = graph or always_graph
    if graph and not always_graph:
        # Graph capture costs tens of milliseconds: only worth it where launches dominate.
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            fn()
        end.record()
        torch.cuda.synchronize()
        graph = start.elapsed_time(end) / 3 < 0.2
    if graph:
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")) * 1e3
        except Exception:
            torch.cuda.synchronize()
            if always_graph:  # a plain timing would measure something else: the caller decides
                raise
    return float(do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median")) * 1e3


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


def _cfg_key(cfg: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(cfg.items()))


@dataclass(frozen=True)
class Problem:
    shape: dict[str, int]
    run: Callable[[dict[str, int]], torch.Tensor]  # launch with a configuration, return the output
    reference: Callable[[], torch.Tensor]


def rmsnorm_problem(n: int, model: ModelShapes, gen: torch.Generator, dtype: torch.dtype) -> Problem:
    h = model.hidden_size
    dev = gen.device
    x = torch.randn(n, h, device=dev, dtype=dtype, generator=gen)
    r = torch.randn(n, h, device=dev, dtype=dtype, generator=gen)
    w = torch.randn(h, device=dev, dtype=dtype, generator=gen)
    return Problem(
        shape={"num_tokens": n, "hidden": h},
        run=lambda cfg: rmsnorm.fused_add_rmsnorm(x, r, w, config=cfg).out,
        reference=lambda: rmsnorm.fused_add_rmsnorm_ref(x, r, w).out,
    )


def silu_problem(n: int, model: ModelShapes, gen: torch.Generator, dtype: torch.dtype) -> Problem:
    d = model.mlp_width
    x = torch.randn(n, 2 * d, device=gen.device, dtype=dtype, generator=gen)
    return Problem(
        shape={"num_tokens": n, "d": d},
        run=lambda cfg: silu_mul.silu_and_mul(x, config=cfg).out,
        reference=lambda: silu_mul.silu_and_mul_ref(x).out,
    )


def make_decode_inputs(
    num_seqs: int,
    max_seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    gen: torch.Generator,
    dtype: torch.dtype,
    page: int = 16,
) -> dict[str, Any]:
    """A shuffled paged cache holding `num_seqs` sequences of lengths in [max/2, max]."""
    dev = gen.device
    lens = torch.randint(max(1, max_seq_len // 2), max_seq_len + 1, (num_seqs,), device=dev, generator=gen)
    lens[0] = max_seq_len
    blocks_per_seq = -(-max_seq_len // page)
    num_blocks = num_seqs * blocks_per_seq
    perm = torch.randperm(num_blocks, device=dev, generator=gen).to(torch.int32)
    return {
        "q": torch.randn(num_seqs, num_heads, head_dim, device=dev, dtype=dtype, generator=gen),
        "k_cache": torch.randn(
            num_blocks, page, num_kv_heads, head_dim, device=dev, dtype=dtype, generator=gen
        ),
        "v_cache": torch.randn(
            num_blocks, page, num_kv_heads, head_dim, device=dev, dtype=dtype, generator=gen
        ),
        "block_tables": perm.reshape(num_seqs, blocks_per_seq),
        "seq_lens": lens.to(torch.int32),
    }


def attention_problem(
    num_seqs: int, max_seq_len: int, model: ModelShapes, gen: torch.Generator, dtype: torch.dtype
) -> Problem:
    inp = make_decode_inputs(
        num_seqs, max_seq_len, model.num_heads, model.num_kv_heads, model.head_dim, gen, dtype
    )
    return Problem(
        shape={
            "num_seqs": num_seqs,
            "max_seq_len": max_seq_len,
            "num_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads,
            "head_dim": model.head_dim,
            "context_tokens": int(inp["seq_lens"].sum()),
        },
        run=lambda cfg: decode_attention.paged_decode_attention(**inp, max_seq_len=max_seq_len, config=cfg),
        reference=lambda: decode_attention.paged_decode_attention_ref(**inp),
    )


def make_moe_inputs(
    n: int, k_dim: int, n_dim: int, num_experts: int, top_k: int, gen: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    dev = gen.device
    scores = torch.rand(n, num_experts, device=dev, generator=gen)
    weights, ids = scores.topk(top_k, dim=1)
    return {
        "a": torch.randn(n, k_dim, device=dev, dtype=dtype, generator=gen),
        # 1/sqrt(K) keeps the products near unit scale, as trained weights do.
        "w": torch.randn(num_experts, n_dim, k_dim, device=dev, dtype=dtype, generator=gen) * k_dim**-0.5,
        "topk_ids": ids.to(torch.int32),
        "topk_weights": (weights / weights.sum(dim=1, keepdim=True)).float(),
    }


def moe_problem(n: int, model: ModelShapes, gen: torch.Generator, dtype: torch.dtype) -> Problem:
    n_dim, k_dim = 2 * model.moe_intermediate_size, model.hidden_size
    inp = make_moe_inputs(n, k_dim, n_dim, model.num_experts, model.experts_per_token, gen, dtype)
    return Problem(
        shape={
            "num_tokens": n,
            "n": n_dim,
            "k": k_dim,
            "num_experts": model.num_experts,
            "top_k": model.experts_per_token,
        },
        run=lambda cfg: moe_gemm.moe_grouped_gemm(
            inp["a"], inp["w"], inp["topk_ids"], inp["topk_weights"], config=cfg
        ),
        reference=lambda: moe_gemm.moe_grouped_gemm_ref(
            inp["a"], inp["w"], inp["topk_ids"], inp["topk_weights"]
        ),
    )


def candidates_for(op: str, model: ModelShapes, max_seq_len: int = 0) -> list[dict[str, int]]:
    if op == "rmsnorm":
        return rmsnorm.candidate_configs(model.hidden_size)
    if op == "silu_mul":
        return silu_mul.candidate_configs(model.mlp_width)
    if op == "decode_attention":
        return decode_attention.candidate_configs(max_seq_len)
    if op == "moe_gemm":
        return moe_gemm.candidate_configs()
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def time_problem(
    problem: Problem,
    configs: Iterable[dict[str, int]],
    *,
    rep_ms: int = 40,
    tol: float = _BF16_TOL,
    graph: bool = True,
) -> list[Trial]:
    """Check each configuration against the reference, then time the ones that match
    (calls under 0.2 ms as CUDA-graph replays unless graph=False; see bench_us)."""
    ref = problem.reference()
    trials = []
    for cfg in configs:
        try:
            err = _rel_err(problem.run(cfg), ref)
            if not err < tol:
                trials.append(Trial(cfg, None, f"relative error {err:.3g} over {tol:g}"))
                continue
            trials.append(
                Trial(cfg, bench_us(functools.partial(problem.run, cfg), rep_ms=rep_ms, graph=graph))
            )
        except Exception as exc:  # a tile too large for shared memory fails here, not earlier
            trials.append(Trial(cfg, None, f"{type(exc).__name__}: {str(exc)[:160]}"))
    del ref
    torch.cuda.empty_cache()
    return trials


def tune(
    model: ModelShapes,
    buckets: ShapeBuckets,
    *,
    ops: Iterable[str] = OPS,
    dtype: torch.dtype = torch.bfloat16,
    rep_ms: int = 40,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[BucketResult]:
    """Time every candidate of every op on every bucket of the workload."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    results: list[BucketResult] = []
    for op in ops:
        if op == "moe_gemm" and not model.num_experts:
            log(f"{op}: {model.name} is dense; skipped")
            continue
        if op == "decode_attention":
            # Several load levels can share a bucket; the largest batch of each represents it.
            reps: dict[str, tuple[int, int]] = {}
            for seqs, longest in buckets.decode_batches.values():
                key = attention_bucket(seqs, longest)
                reps[key] = max(reps.get(key, (0, 0)), (seqs, longest))
            items: list[tuple[str, float, Callable[[], Problem]]] = [
                (key, weight, functools.partial(attention_problem, *reps[key], model, gen, dtype))
                for key, weight in sorted(buckets.attention_buckets.items())
            ]
            cand_len = max(longest for _, longest in reps.values())
        else:
            build = {"rmsnorm": rmsnorm_problem, "silu_mul": silu_problem, "moe_gemm": moe_problem}[op]
            items = [
                (str(b), weight, functools.partial(build, b, model, gen, dtype))
                for b, weight in sorted(buckets.token_buckets.items())
            ]
            cand_len = 0
        for key, weight, make in items:
            problem = make()
            configs = candidates_for(op, model, problem.shape.get("max_seq_len", cand_len))
            trials = time_problem(problem, configs, rep_ms=rep_ms)
            res = BucketResult(op, key, weight, problem.shape, trials)
            best = res.best
            log(
                f"{op:17s} bucket {key:>12s} w={weight:.3f}: {len(trials)} configs, best "
                + (f"{best.time_us:.1f} us {_cfg_key(best.config)}" if best else "none succeeded")
            )
            results.append(res)
            del problem
    return results


def fixed_vs_tuned(results: list[BucketResult]) -> dict[str, Any]:
    """Weighted mean time of the per-bucket best against the single best fixed configuration.

    The fixed configuration is the one, among those that ran on every bucket, with the lowest
    weighted mean time over the buckets: the best a table with one entry could do.
    """
    if not results:
        return {}
    per_cfg: dict[str, list[float]] = {}
    cfgs: dict[str, dict[str, int]] = {}
    for res in results:
        for t in res.trials:
            if t.time_us is not None:
                per_cfg.setdefault(_cfg_key(t.config), []).append(res.weight * t.time_us)
                cfgs[_cfg_key(t.config)] = t.config
    complete = {k: sum(v) for k, v in per_cfg.items() if len(v) == len(results)}
    tuned = sum(r.weight * (r.best.time_us if r.best and r.best.time_us else 0.0) for r in results)
    total_w = sum(r.weight for r in results)
    if not complete or tuned <= 0:
        return {"tuned_us": tuned / total_w if total_w else None}
    fixed_key = min(complete, key=lambda k: complete[k])
    return {
        "tuned_us": tuned / total_w,
        "fixed_us": complete[fixed_key] / total_w,
        "fixed_config": cfgs[fixed_key],
        # fractional speed-up of the per-bucket table over the best single configuration
        "gain": complete[fixed_key] / tuned - 1.0,
    }


def environment() -> dict[str, Any]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
    }


def table_json(
    model: ModelShapes, buckets: ShapeBuckets, results: list[BucketResult], *, profile: str = ""
) -> dict[str, Any]:
    """The configuration table file (format in kernels.config_table)."""
    ops: dict[str, dict[str, Any]] = {}
    summary: dict[str, Any] = {}
    for op in OPS:
        op_results = [r for r in results if r.op == op]
        if not op_results:
            continue
        entries = {}
        for r in op_results:
            best = r.best
            if best is None:
                continue
            entries[r.bucket] = {
                "config": best.config,
                "time_us": round(best.time_us or 0.0, 3),
                "weight": round(r.weight, 6),
                "shape": r.shape,
                "candidates": [
                    {"config": t.config, "time_us": None if t.time_us is None else round(t.time_us, 3)}
                    | ({"error": t.error} if t.error else {})
                    for t in r.trials
                ],
            }
        ops[op] = entries
        summary[op] = fixed_vs_tuned(op_results)
    env = environment()
    return {
        "schema": SCHEMA_VERSION,
        "gpu": env["gpu"],
        "date": env["date"],
        "versions": env["versions"],
        "model": model.__dict__,
        "profile": profile,
        "dtype": "bfloat16",
        "buckets": buckets.to_json(),
        "summary": summary,
        "ops": ops,
    }
