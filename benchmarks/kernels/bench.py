"""Kernel benchmark on the GPU it runs on: each kernel against the ceilings measured in the same
run, against its torch reference and against torch.compile of that reference; then the gain of
per-bucket tuning of the MoE grouped GEMM over the single best fixed configuration, on the
token-count distributions of both shared traces, with an ablation of that gain by knob.

    python benchmarks/kernels/bench.py [--out benchmarks/results/kernels.json] [--quick]

The result file is this script's alone: it records its command, commit and machine, and is
never edited by hand (a note belongs in NOTES.md).

Figures (summary of the JSON):
- `*_bw_frac`: bytes the kernel must move (each input read once, each output written once) per
  second, over the measured device-to-device copy bandwidth (bytes read + written per second);
- `moe_gemm_flop_frac`: useful FLOP/s (2 * pairs * N * K) over the measured bf16 matmul rate,
  the best of several matrix shapes (`ceilings.bf16_matmul_by_shape` has each);
- `rmsnorm_vs_compile`: time of torch.compile(reference) / time of ours (> 1: ours is faster);
- `per_bucket_gain`: weighted mean time with the best single configuration / weighted mean
  time with the per-bucket table, minus 1, averaged over the two traces (0.10 = 10% faster).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import git_state  # noqa: E402
from kernels import decode_attention, moe_gemm, rmsnorm, silu_mul  # noqa: E402
from kernels.models import CATALOG  # noqa: E402
from kernels.tune import (  # noqa: E402
    BucketResult,
    Trial,
    bench_us,
    environment,
    fixed_vs_tuned,
    make_decode_inputs,
    make_moe_inputs,
    moe_problem,
    time_problem,
)
from kernels.workload import buckets_from_profile  # noqa: E402

PROFILES = ROOT / "benchmarks" / "kernels" / "profiles"
TRACES = ("azure2023_conv", "mooncake_synthetic")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure_copy_bw(n_bytes: int) -> float:
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = bench_us(lambda: dst.copy_(src), rep_ms=200)
    return 2 * n_bytes / (t * 1e-6)


# The bf16 ceiling is the best of several (M, N, K) products: cuBLAS picks a different kernel per
# shape, and on the H200 the square 8192^3 product alone read 675-690 TFLOP/s where other shapes
# reached ~760, which made every kernel look closer to the ceiling than it is.
MATMUL_SHAPES: tuple[tuple[int, int, int], ...] = (
    (8192, 8192, 8192),
    (4096, 4096, 4096),
    (16384, 8192, 8192),
    (8192, 16384, 8192),
    (8192, 8192, 16384),
    (16384, 16384, 4096),
    (6144, 6144, 6144),
    (12288, 12288, 12288),
)
QUICK_MATMUL_SHAPES = MATMUL_SHAPES[:3]


def measure_matmul_rate(m: int, n: int, k: int) -> float:
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
    t = bench_us(lambda: a @ b, rep_ms=300)
    return 2 * m * n * k / (t * 1e-6)


def matmul_ceiling(shapes: tuple[tuple[int, int, int], ...]) -> tuple[float, list[dict[str, Any]]]:
    """The best bf16 rate over `shapes` (FLOP/s) and every shape's own rate."""
    if not 1 <= len(shapes) <= 16:
        raise ValueError(f"1 to 16 shapes, got {len(shapes)}")
    rates = []
    for m, n, k in shapes:
        rates.append({"m": m, "n": n, "k": k, "flop_per_s": measure_matmul_rate(m, n, k)})
        torch.cuda.empty_cache()
    return max(r["flop_per_s"] for r in rates), rates


def best_of(
    run: Callable[[dict[str, int]], torch.Tensor], ref: torch.Tensor, configs: list[dict[str, int]]
) -> Trial:
    """Time every configuration at this shape (after checking it) and return the fastest."""
    from kernels.tune import Problem

    # Plain event timing with L2 flushes (no graph): the headline shapes move 0.7-1.7 GB per
    # call, far past launch overhead, and the torch baselines are timed the same way.
    trials = time_problem(Problem(shape={}, run=run, reference=lambda: ref), configs, rep_ms=100, graph=False)
    ok = [t for t in trials if t.time_us is not None]
    if not ok:
        raise RuntimeError(f"no configuration ran: {[t.error for t in trials][:3]}")
    return min(ok, key=lambda t: t.time_us or 0.0)


def compiled_or_none(
    fn: Callable[..., Any], *args: Any, graph: bool = False
) -> tuple[float | None, str | None]:
    try:
        cfn = torch.compile(fn, dynamic=False)
        cfn(*args)
        return bench_us(lambda: cfn(*args), rep_ms=100, graph=graph), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


# --- plain-torch baselines, written the way a user of torch would (no float64 detours) --------


def rms_torch(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.float() + r.float()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return y.to(x.dtype), s.to(x.dtype)


def silu_torch(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[:, :d]) * x[:, d:]


def decode_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, bt: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """Gather the paged cache into dense [B, L, Hkv, D], then masked GQA attention."""
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    k = k_cache[bt.long()].flatten(1, 2)
    v = v_cache[bt.long()].flatten(1, 2)
    qg = q.view(b, hkv, h // hkv, d)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k).float() * d**-0.5
    mask = torch.arange(k.shape[1], device=q.device)[None, :] < lens[:, None]
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.einsum("bhgl,blhd->bhgd", p, v).reshape(b, h, d)


def moe_torch(a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor) -> torch.Tensor:
    """One cuBLAS bf16 product per expert over its tokens (how an eager MoE layer does it)."""
    n, top_k = ids.shape
    out = torch.empty((n * top_k, w.shape[1]), dtype=a.dtype, device=a.device)
    flat = ids.reshape(-1)
    order = torch.argsort(flat)
    counts = torch.bincount(flat, minlength=w.shape[0]).tolist()
    start = 0
    for e, c in enumerate(counts):
        if c:
            pairs = order[start : start + c]
            out[pairs] = (a[pairs // top_k] @ w[e].T) * tw.reshape(-1)[pairs, None].to(a.dtype)
        start += c
    return out.view(n, top_k, -1)


# --- sections ---------------------------------------------------------------------------------


def bench_rmsnorm(gen: torch.Generator, copy_bw: float, quick: bool) -> dict[str, Any]:
    n, h = (4096, 8192) if quick else (16384, 8192)
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    r = torch.randn_like(x)
    w = torch.rand(h, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
    nbytes = 4 * n * h * 2 + h * 2  # x, residual in; out, residual_out out; weight
    ref = rmsnorm.fused_add_rmsnorm_ref(x, r, w).out
    best = best_of(
        lambda c: rmsnorm.fused_add_rmsnorm(x, r, w, config=c).out, ref, rmsnorm.candidate_configs(h)
    )
    t_default = bench_us(lambda: rmsnorm.fused_add_rmsnorm(x, r, w), rep_ms=100)
    t_torch = bench_us(lambda: rms_torch(x, r, w), rep_ms=100)
    t_comp, comp_err = compiled_or_none(rms_torch, x, r, w)
    t_fp8 = bench_us(lambda: rmsnorm.fused_add_rmsnorm(x, r, w, fp8=True, config=best.config), rep_ms=100)
    fp8_bytes = 2 * n * h * 2 + n * h * 2 + n * h + n * 4 + h * 2
    t = best.time_us or 0.0
    return {
        "case": "rmsnorm",
        "shape": {"tokens": n, "hidden": h, "dtype": "bfloat16", "residual": True},
        "bytes": nbytes,
        "config": best.config,
        "ours_us": t,
        "ours_default_config_us": t_default,
        "torch_us": t_torch,
        "compile_us": t_comp,
        "compile_error": comp_err,
        "bw_frac": nbytes / (t * 1e-6) / copy_bw,
        "vs_torch": t_torch / t,
        "vs_compile": (t_comp / t) if t_comp else None,
        "fp8_us": t_fp8,
        "fp8_bw_frac": fp8_bytes / (t_fp8 * 1e-6) / copy_bw,
    }


def bench_silu(gen: torch.Generator, copy_bw: float, quick: bool) -> dict[str, Any]:
    n, d = (4096, 14336) if quick else (16384, 14336)
    x = torch.randn(n, 2 * d, device="cuda", dtype=torch.bfloat16, generator=gen)
    nbytes = 3 * n * d * 2
    ref = silu_mul.silu_and_mul_ref(x).out
    best = best_of(lambda c: silu_mul.silu_and_mul(x, config=c).out, ref, silu_mul.candidate_configs(d))
    t_torch = bench_us(lambda: silu_torch(x), rep_ms=100)
    t_comp, comp_err = compiled_or_none(silu_torch, x)
    fp8_cfg = {"block_n": 2048, "num_warps": 8}
    t_fp8 = bench_us(lambda: silu_mul.silu_and_mul(x, fp8=True, config=fp8_cfg), rep_ms=100)
    t = best.time_us or 0.0
    return {
        "case": "silu_mul",
        "shape": {"tokens": n, "d": d, "dtype": "bfloat16"},
        "bytes": nbytes,
        "config": best.config,
        "ours_us": t,
        "torch_us": t_torch,
        "compile_us": t_comp,
        "compile_error": comp_err,
        "bw_frac": nbytes / (t * 1e-6) / copy_bw,
        "vs_torch": t_torch / t,
        "vs_compile": (t_comp / t) if t_comp else None,
        "fp8_us": t_fp8,
        "fp8_bw_frac": (2 * n * d * 2 + n * d + n * 4) / (t_fp8 * 1e-6) / copy_bw,
    }


def bench_decode(gen: torch.Generator, copy_bw: float, quick: bool, seqs: int, ctx: int) -> dict[str, Any]:
    m = CATALOG["llama-3.1-8b"]
    inp = make_decode_inputs(seqs, ctx, m.num_heads, m.num_kv_heads, m.head_dim, gen, torch.bfloat16)
    tokens = int(inp["seq_lens"].sum())
    nbytes = (
        tokens * m.num_kv_heads * m.head_dim * 2 * 2
        + 2 * inp["q"].numel() * 2
        + inp["block_tables"].numel() * 4
    )
    ref = decode_attention.paged_decode_attention_ref(**inp)

    def run(c: dict[str, int]) -> torch.Tensor:
        return decode_attention.paged_decode_attention(**inp, max_seq_len=ctx, config=c)

    best = best_of(run, ref, decode_attention.candidate_configs(ctx))
    args = (inp["q"], inp["k_cache"], inp["v_cache"], inp["block_tables"], inp["seq_lens"])
    t_torch = bench_us(lambda: decode_torch(*args), rep_ms=100)
    t_comp, comp_err = compiled_or_none(decode_torch, *args)
    t_default = bench_us(lambda: decode_attention.paged_decode_attention(**inp, max_seq_len=ctx), rep_ms=100)
    t = best.time_us or 0.0
    return {
        "case": "decode_attention",
        "shape": {
            "num_seqs": seqs,
            "max_seq_len": ctx,
            "context_tokens": tokens,
            "num_heads": m.num_heads,
            "num_kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim,
            "page_size": 16,
            "dtype": "bfloat16",
        },
        "bytes": nbytes,
        "config": best.config,
        "ours_us": t,
        "ours_default_config_us": t_default,
        "torch_us": t_torch,
        "compile_us": t_comp,
        "compile_error": comp_err,
        "bw_frac": nbytes / (t * 1e-6) / copy_bw,
        "vs_torch": t_torch / t,
        "vs_compile": (t_comp / t) if t_comp else None,
    }


def bench_moe(gen: torch.Generator, mm_rate: float, quick: bool, n: int) -> dict[str, Any]:
    m = CATALOG["mixtral-8x7b"]
    k_dim, n_dim = m.hidden_size, 2 * m.moe_intermediate_size
    inp = make_moe_inputs(n, k_dim, n_dim, m.num_experts, m.experts_per_token, gen, torch.bfloat16)
    a, w, ids, tw = inp["a"], inp["w"], inp["topk_ids"], inp["topk_weights"]
    flops = 2 * n * m.experts_per_token * n_dim * k_dim
    ref = moe_gemm.moe_grouped_gemm_ref(a, w, ids, tw)
    best = best_of(
        lambda c: moe_gemm.moe_grouped_gemm(a, w, ids, tw, config=c), ref, moe_gemm.candidate_configs()
    )
    del ref
    # The same GEMM with the alignment precomputed: the kernel alone, as a layer reusing it sees.
    al = moe_gemm.moe_align(ids, m.num_experts, best.config["block_m"])
    t_kernel = bench_us(lambda: moe_gemm.moe_grouped_gemm(a, w, ids, tw, config=best.config, alignment=al))
    t_align = bench_us(lambda: moe_gemm.moe_align(ids, m.num_experts, best.config["block_m"]))
    t_torch = bench_us(lambda: moe_torch(a, w, ids, tw), rep_ms=100)
    t = best.time_us or 0.0
    return {
        "case": "moe_gemm",
        "shape": {
            "tokens": n,
            "top_k": m.experts_per_token,
            "experts": m.num_experts,
            "n": n_dim,
            "k": k_dim,
            "dtype": "bfloat16",
        },
        "flops": flops,
        "config": best.config,
        "ours_us": t,
        "ours_kernel_only_us": t_kernel,
        "align_us": t_align,
        "torch_us": t_torch,
        "flop_frac": flops / (t * 1e-6) / mm_rate,
        "kernel_only_flop_frac": flops / (t_kernel * 1e-6) / mm_rate,
        "vs_torch": t_torch / t,
    }


def bench_small(gen: torch.Generator, n: int) -> dict[str, Any]:
    """Decode-sized steps (the buckets that carry most steps): ours vs torch vs torch.compile."""
    h, d = 4096, 14336
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    r = torch.randn_like(x)
    w = torch.rand(h, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
    xs = torch.randn(n, 2 * d, device="cuda", dtype=torch.bfloat16, generator=gen)
    rms_c, _ = compiled_or_none(rms_torch, x, r, w, graph=True)
    silu_c, _ = compiled_or_none(silu_torch, xs, graph=True)
    rms_t = bench_us(lambda: rmsnorm.fused_add_rmsnorm(x, r, w), graph=True)
    silu_t = bench_us(lambda: silu_mul.silu_and_mul(xs), graph=True)
    return {
        "case": "small_steps",
        "tokens": n,
        "rmsnorm_us": rms_t,
        "timing": "CUDA graph replay (launch overhead excluded)",
        "rmsnorm_torch_us": bench_us(lambda: rms_torch(x, r, w), graph=True),
        "rmsnorm_compile_us": rms_c,
        "silu_mul_us": silu_t,
        "silu_mul_torch_us": bench_us(lambda: silu_torch(xs), graph=True),
        "silu_mul_compile_us": silu_c,
    }


KNOBS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")


def bench_per_bucket(gen: torch.Generator, quick: bool, deadline: float, model: str) -> dict[str, Any]:
    """Tune the MoE GEMM on the union of both traces' token buckets, then score each trace."""
    m = CATALOG[model]
    per_trace = {
        name: buckets_from_profile(json.loads((PROFILES / f"{name}.json").read_text())) for name in TRACES
    }
    union = sorted({b for sb in per_trace.values() for b in sb.token_buckets})
    configs = moe_gemm.candidate_configs()
    if quick:
        configs = configs[::4]
    results: dict[int, BucketResult] = {}
    problems = {}
    for b in union:
        problem = moe_problem(b, m, gen, torch.bfloat16)
        trials = time_problem(problem, configs, rep_ms=40)
        results[b] = BucketResult("moe_gemm", str(b), 0.0, problem.shape, trials)
        problems[b] = problem
        best = results[b].best
        log(f"{model} moe bucket {b}: best {best.time_us if best else None} {best.config if best else None}")
    out: dict[str, Any] = {"buckets": {}, "traces": {}}
    for b, res in results.items():
        out["buckets"][str(b)] = {
            "best": res.best.config if res.best else None,
            "times_us": {json.dumps(t.config, sort_keys=True): t.time_us for t in res.trials},
        }
    gains = []
    for name, sb in per_trace.items():
        weighted = [
            BucketResult("moe_gemm", str(b), w, results[b].shape, results[b].trials)
            for b, w in sb.token_buckets.items()
        ]
        s = fixed_vs_tuned(weighted)
        entry: dict[str, Any] = {"weights": {str(b): w for b, w in sb.token_buckets.items()}, **s}
        if "gain" in s:
            gains.append(s["gain"])
            entry["ablation"] = ablate(weighted, s, problems, deadline)
        out["traces"][name] = entry
    out["per_bucket_gain"] = sum(gains) / len(gains) if gains else None
    return out


def ablate(
    weighted: list[BucketResult], s: dict[str, Any], problems: dict[int, Any], deadline: float
) -> dict[str, Any]:
    """Revert each knob of each bucket's tuned config to the fixed config's value, one at a time,
    and report the share of the total gain (weighted time saved) each knob carries."""
    fixed = s["fixed_config"]
    saved_total = (s["fixed_us"] - s["tuned_us"]) * sum(r.weight for r in weighted)
    lost: dict[str, float] = dict.fromkeys(KNOBS, 0.0)
    skipped = []
    for r in weighted:
        best = r.best
        if best is None or best.time_us is None or best.config == fixed:
            continue
        for knob in KNOBS:
            if best.config[knob] == fixed[knob]:
                continue
            if time.time() > deadline:
                skipped.append(f"{r.bucket}:{knob}")
                continue
            cfg = dict(best.config, **{knob: fixed[knob]})
            trial = time_problem(problems[int(r.bucket)], [cfg], rep_ms=40)[0]
            if trial.time_us is None:
                skipped.append(f"{r.bucket}:{knob} ({trial.error})")
                continue
            lost[knob] += r.weight * (trial.time_us - best.time_us)
    shares = {k: (v / saved_total if saved_total > 0 else None) for k, v in lost.items()}
    return {"share_of_gain_by_knob": shares, "skipped": skipped}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kernels.json")
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer configurations")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop optional work after this long")
    parser.add_argument("--sections", default="ceil,rmsnorm,silu,decode,small,moe,buckets")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    sections = set(args.sections.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    env = environment()
    result: dict[str, Any] = {
        "machine": f"{env['gpu']}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs",
        "date": env["date"],
        "versions": env["versions"],
        # Everything in this file is written here; nothing is added by hand afterwards.
        "written_by": "benchmarks/kernels/bench.py",
        "command": " ".join(["python", *sys.argv]),
        **git_state(ROOT),  # commit and dirty flag at the top level
        "summary": {},
        "ceilings": {},
        "cases": [],
        "errors": [],
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    copy_bw = measure_copy_bw(2 << 30)
    mm_rate, mm_shapes = matmul_ceiling(QUICK_MATMUL_SHAPES if args.quick else MATMUL_SHAPES)
    result["ceilings"] = {
        "copy_bytes_per_s": copy_bw,
        "bf16_matmul_flop_per_s": mm_rate,
        "bf16_matmul_method": "best of the bf16 products below (torch.matmul, median of CUDA-event timings)",
        "bf16_matmul_by_shape": mm_shapes,
    }
    log(
        f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s "
        f"(best of {len(mm_shapes)} shapes)"
    )
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if "rmsnorm" in sections:
        steps.append(("rmsnorm", lambda: bench_rmsnorm(gen, copy_bw, args.quick)))
    if "silu" in sections:
        steps.append(("silu", lambda: bench_silu(gen, copy_bw, args.quick)))
    if "decode" in sections:
        for seqs, ctx in ((64, 4096), (16, 32768)) if not args.quick else ((32, 2048),):
            steps.append(("decode", functools.partial(bench_decode, gen, copy_bw, args.quick, seqs, ctx)))
    if "small" in sections:
        for n in (32, 64, 512):
            steps.append(("small", functools.partial(bench_small, gen, n)))
    if "moe" in sections:
        for n in (8192, 2048) if not args.quick else (2048,):
            steps.append(("moe", functools.partial(bench_moe, gen, mm_rate, args.quick, n)))
    for name, fn in steps:
        try:
            case = fn()
            result["cases"].append(case)
            log(json.dumps(case))
        except Exception:
            result["errors"].append({"section": name, "error": traceback.format_exc()[-2000:]})
            log(f"{name} failed:\n{traceback.format_exc()}")
        torch.cuda.empty_cache()
        save()
    # The summary's per_bucket_gain is Mixtral's (chosen before any result was seen); the
    # 128-expert model is recorded beside it as a second case, not averaged in.
    for model, case in (
        ("mixtral-8x7b", "per_bucket_moe_gemm"),
        ("qwen3-30b-a3b", "per_bucket_moe_gemm_qwen3"),
    ):
        if "buckets" not in sections:
            break
        try:
            pb = bench_per_bucket(gen, args.quick, start + args.budget_s, model)
            result["cases"].append({"case": case, "model": model, **pb})
        except Exception:
            result["errors"].append({"section": case, "error": traceback.format_exc()[-2000:]})
            log(f"{case} failed:\n{traceback.format_exc()}")
        torch.cuda.empty_cache()
        save()

    by = {c["case"]: c for c in result["cases"]}
    decode = [c for c in result["cases"] if c["case"] == "decode_attention"]
    moe = [c for c in result["cases"] if c["case"] == "moe_gemm"]
    result["summary"] = {
        "rmsnorm_bw_frac": by.get("rmsnorm", {}).get("bw_frac"),
        "silu_mul_bw_frac": by.get("silu_mul", {}).get("bw_frac"),
        "decode_attn_bw_frac": decode[0]["bw_frac"] if decode else None,
        # The GEMM kernel alone: the expert sort (moe_align) is shared by both GEMMs of a
        # layer and is reported beside it in the case (align_us, flop_frac with it included).
        "moe_gemm_flop_frac": moe[0]["kernel_only_flop_frac"] if moe else None,
        "rmsnorm_vs_compile": by.get("rmsnorm", {}).get("vs_compile"),
        "per_bucket_gain": by.get("per_bucket_moe_gemm", {}).get("per_bucket_gain"),
    }
    result["wall_s"] = round(time.time() - start, 1)
    save()
    log("summary " + json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
