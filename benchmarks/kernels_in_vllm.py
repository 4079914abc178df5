"""Our kernels against what vLLM runs for the same op, on the GPU this runs on (issue 25, item 3).

Two parts, each written to the result as soon as it is measured:

`ops`: per op and token count, three implementations timed as CUDA-graph replays, in interleaved
rounds (A B C, A B C, ...) so that drift of the GPU moves every arm alike:
- `native_compiled`: vLLM's own torch code for the op (its IR op's "native" implementation, or
  `SiluAndMul.forward_native`) through torch.compile: what a compiled vLLM engine runs by default
  (the CUDA platform picks "native" whenever Inductor compiles the model);
- `vllm_c`: vLLM's CUDA kernel for the op (what it runs without Inductor);
- `tailguard`: ours (`kernels/`), called the way the plugin calls it (`kernels.vllm_plugin`).
Decode attention is timed against vLLM's FlashAttention (`vllm.vllm_flash_attn`) on the same
paged cache (page size 16, vLLM's layout), where it imports. A ratio is vLLM's time over ours
(> 1: ours is faster), with a 95% bootstrap interval over the rounds (both arms resampled with
the same picks).

`engine`: the plugin inside a real engine, torch.compile and CUDA graphs on: one dense model with
random weights (`--model-dir`, a config.json and tokenizer), fresh engines alternating `default`
(vLLM's own choice) and `tailguard` (`--ir-op-priority` putting our RMSNorm first, loaded as a
vLLM general plugin), for `--engine-rounds` rounds each. Per engine: steady decode (batch requests
sent at once, fixed lengths: TPOT is the decode step time at that batch), and greedy outputs of a
fixed prompt set, compared across the arms (first-token agreement; random weights make logits
nearly flat, so this is a weak check that the kernel computes the same norm, not a quality test).
`tpot_ratio_plugin_vs_default_b<B>` pools each arm's blocks (blocks resampled whole).

    python benchmarks/kernels_in_vllm.py --out benchmarks/results/kernels_in_vllm.json \\
        --model-dir /tmp/tgpu/models/llama-3.1-8b [--parts ops,engine] [--deadline-s 540]

A device call lasts at most 10 minutes, three or four engines: `--pool A.json B.json ...` writes
the engine figures over the blocks of several such runs (same commit, clean tree, same GPU; each
block keeps the file and order it came from), on any machine, without a GPU.

The result file is this script's alone; notes belong in benchmarks/kernels/NOTES.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._stats import pooled_ratio_interval, ratio_interval, summary_figures  # noqa: E402

TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 8192)
# (hidden, intermediate): Llama-3.1-8B's; RMSNorm also at Qwen3-30B-A3B's hidden size
DENSE = (4096, 14336)
MOE_HIDDEN = 2048
# decode attention cases (sequences, context): Llama-3.1-8B's heads (32 query, 8 KV, 128 wide)
DECODE_CASES = ((1, 2048), (16, 2048), (64, 2048), (256, 1024), (32, 8192))
STEADY_BATCHES = (1, 32, 128)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- ops ------------------------------------------------------------------------------------


def _timer() -> Callable[[Callable[[], object]], float]:
    from kernels.tune import bench_us

    return lambda fn: bench_us(fn, rep_ms=25, always_graph=True)


def _arms_rms(ir_op: Any, args: tuple[Any, ...]) -> dict[str, Callable[[], object]]:
    import torch

    native = torch.compile(ir_op.impls["native"].impl_fn, dynamic=False)
    arms: dict[str, Callable[[], object]] = {"native_compiled": lambda: native(*args)}
    if "vllm_c" in ir_op.impls and ir_op.impls["vllm_c"].supported:
        vllm_c = ir_op.impls["vllm_c"].impl_fn
        if ir_op.impls["vllm_c"].inplace:  # it writes its inputs: give it copies once, outside the timing
            copies = tuple(a.clone() if isinstance(a, torch.Tensor) and a.dim() == 2 else a for a in args)
            arms["vllm_c"] = lambda: vllm_c(*copies)
        else:
            arms["vllm_c"] = lambda: vllm_c(*args)
    ours = ir_op.impls["tailguard"].impl_fn
    arms["tailguard"] = lambda: ours(*args)
    return arms


def _arms_silu(x: Any) -> dict[str, Callable[[], object]]:
    import torch
    from vllm.model_executor.layers.activation import SiluAndMul

    from kernels import silu_mul

    native = torch.compile(SiluAndMul.forward_native, dynamic=False)
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    return {
        "native_compiled": lambda: native(x),
        "vllm_c": lambda: torch.ops._C.silu_and_mul(out, x),
        "tailguard": lambda: silu_mul.silu_and_mul(x, out=out),
    }


def _arms_decode(seqs: int, ctx: int) -> dict[str, Callable[[], object]]:
    import torch

    from kernels import decode_attention

    heads, kv_heads, dim, page = 32, 8, 128, 16
    gen = torch.Generator(device="cuda").manual_seed(seqs * 100_003 + ctx)
    pages_per_seq = -(-ctx // page)
    k = torch.randn(
        seqs * pages_per_seq, page, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    v = torch.randn_like(k)
    q = torch.randn(seqs, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    tables = torch.randperm(seqs * pages_per_seq, device="cuda", generator=gen).to(torch.int32)
    tables = tables.view(seqs, pages_per_seq)
    lens = torch.full((seqs,), ctx, device="cuda", dtype=torch.int32)
    scale = dim**-0.5
    out = torch.empty_like(q)
    arms: dict[str, Callable[[], object]] = {
        "tailguard": lambda: decode_attention.paged_decode_attention(
            q, k, v, tables, lens, scale=scale, max_seq_len=ctx, out=out
        )
    }
    try:
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        fa_version = get_flash_attn_version(head_size=dim) or 2  # what vLLM's backend would pick here
        cu_q = torch.arange(seqs + 1, device="cuda", dtype=torch.int32)
        fa_out = torch.empty_like(q)

        def fa() -> object:
            return flash_attn_varlen_func(
                q,
                k,
                v,
                max_seqlen_q=1,
                cu_seqlens_q=cu_q,
                max_seqlen_k=ctx,
                seqused_k=lens,
                softmax_scale=scale,
                causal=True,
                block_table=tables,
                out=fa_out,
                fa_version=fa_version,
            )

        fa()
        torch.cuda.synchronize()
        ref = decode_attention.paged_decode_attention(q, k, v, tables, lens, scale=scale, max_seq_len=ctx)
        err = float((fa_out.float() - ref.float()).norm() / ref.float().norm())
        if err > 2e-2:
            raise RuntimeError(f"FlashAttention and ours disagree (relative error {err:.3g})")
        arms[f"vllm_flash_attn{fa_version}"] = fa
    except Exception as exc:  # recorded: the comparison is then missing, not faked
        log(f"decode attention {seqs}x{ctx}: vLLM FlashAttention not timed ({type(exc).__name__}: {exc})")
    return arms


def _rounds(name: str, arms: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    time_us = _timer()
    for fn in arms.values():  # compile and warm every arm before the first timed round
        fn()
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for arm, fn in arms.items():
            times[arm].append(round(time_us(fn), 4))
    log(f"{name}: " + ", ".join(f"{a} {np.median(t):.2f} us" for a, t in times.items()))
    return times


def _case(op: str, shape: Mapping[str, int], times: Mapping[str, list[float]]) -> dict[str, Any]:
    ours = times["tailguard"]
    others = {a: t for a, t in times.items() if a != "tailguard"}
    ratios = {f"{a}_over_ours": ratio_interval(t, ours) for a, t in others.items()}
    # what vLLM would run at its best for this shape: the faster of its implementations
    best = min(others, key=lambda a: float(np.median(others[a]))) if others else None
    return {
        "op": op,
        **shape,
        "times_us": dict(times),
        "median_us": {a: float(np.median(t)) for a, t in times.items()},
        "ratios": ratios,
        "vllm_best": best,
        "vllm_best_over_ours": ratios[f"{best}_over_ours"] if best else None,
    }


def run_ops(args: argparse.Namespace, emit: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    import torch
    import torch._dynamo
    from vllm import ir
    from vllm.platforms import current_platform

    from kernels import vllm_plugin

    for limit in ("recompile_limit", "cache_size_limit"):  # one graph per shape, never an eager fallback
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)
    current_platform.import_ir_kernels()  # vLLM's own providers (vllm_c)
    vllm_plugin.register()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases: list[dict[str, Any]] = []
    hidden, inter = DENSE
    for n in args.tokens:
        for h in (hidden, MOE_HIDDEN):
            x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen)
            r = torch.randn_like(x)
            w = torch.rand(h, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
            for op, op_args in (
                ("rms_norm", (x, w, 1e-6, None)),
                ("fused_add_rms_norm", (x, r, w, 1e-6, None)),
            ):
                ir_op = getattr(ir.ops, op)
                times = _rounds(f"{op} {n}x{h}", _arms_rms(ir_op, op_args), args.rounds)
                cases.append(_case(op, {"tokens": n, "hidden": h}, times))
        xs = torch.randn(n, 2 * inter, device="cuda", dtype=torch.bfloat16, generator=gen)
        cases.append(
            _case(
                "silu_and_mul",
                {"tokens": n, "d": inter},
                _rounds(f"silu_and_mul {n}x{inter}", _arms_silu(xs), args.rounds),
            )
        )
        emit(cases)
    for seqs, ctx in DECODE_CASES:
        arms = _arms_decode(seqs, ctx)
        cases.append(
            _case(
                "decode_attention",
                {"seqs": seqs, "ctx": ctx},
                _rounds(f"decode {seqs}x{ctx}", arms, args.rounds),
            )
        )
        emit(cases)
    return cases


# --- engine ---------------------------------------------------------------------------------


def _engine_config(arm: str, plugin_dir: Path) -> Any:
    """Both arms' shared serving configuration; the plugin arm adds our provider first."""
    import dataclasses

    from kernels import vllm_plugin
    from serving.engine.config import EngineConfig

    base = EngineConfig(load_format="dummy", max_model_len=4096, seed=0)
    if arm == "default":
        return base
    path = os.pathsep.join(p for p in (str(plugin_dir), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dataclasses.replace(
        base,
        extra_args=("--ir-op-priority", vllm_plugin.priority_json()),
        extra_env=(("VLLM_PLUGINS", vllm_plugin.PLUGIN_NAME), ("PYTHONPATH", path)),
    )


PROMPTS = tuple(
    f"Item {i}: the list of things to check before the release of version {i}.{i % 7} is" for i in range(16)
)


def _greedy(url: str, model: str) -> list[list[int]]:
    """Each fixed prompt's greedy continuation (token ids via logprobs)."""
    import urllib.request
    from urllib.parse import urlsplit

    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"only http(s) endpoints, not {url!r}")
    outs = []
    for prompt in PROMPTS:
        body = json.dumps(
            {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1, "seed": 0}
        ).encode()
        req = urllib.request.Request(  # noqa: S310 (scheme checked above)
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 (scheme checked above)
            choice = json.loads(resp.read())["choices"][0]
        outs.append(list(choice["logprobs"]["tokens"]))
    return outs


def run_engine_block(arm: str, round_: int, args: argparse.Namespace, plugin_dir: Path) -> dict[str, Any]:
    from benchmarks._engine import steady_decode_tpots
    from serving.engine.launcher import served_models, start_engine
    from tuning.search.trial import warm_up

    log_path = args.work / f"engine-{arm}-r{round_}.log"
    started = time.monotonic()
    with start_engine(
        model=str(args.model_dir),
        config=_engine_config(arm, plugin_dir),
        startup_timeout_s=900,
        log_path=log_path,
    ) as engine:
        ready_s = time.monotonic() - started
        model = served_models(engine.base_url)[0]["id"]
        warm_up(engine.base_url, seed=round_)
        greedy = _greedy(engine.base_url, str(model))
        steady: dict[str, list[float]] = {}
        for batch in args.steady_batches:
            tpots = steady_decode_tpots(
                engine.base_url,
                batch=batch,
                bursts=args.bursts,
                prompt_tokens=64,
                output_tokens=args.output_tokens,
                seed=5_000_000 + 1000 * round_ + 10 * batch,
            )
            steady[str(batch)] = tpots
            log(f"[{arm} r{round_}] steady decode at {batch}: TPOT p50 {np.median(tpots):.3f} ms")
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    return {
        "arm": arm,
        "round": round_,
        "engine_ready_s": round(ready_s, 1),
        "plugin_registered": "tailguard kernels: provider" in text,
        "plugin_ops_used": sorted(
            op for op in ("rms_norm", "fused_add_rms_norm") if f"tailguard kernels: {op} runs" in text
        ),
        "steady_tpot_ms": steady,
        "greedy_tokens": greedy,
    }


def engine_figures(blocks: Sequence[Mapping[str, Any]], batches: Sequence[int]) -> dict[str, Any]:
    by_arm: dict[str, list[Mapping[str, Any]]] = {}
    for b in blocks:
        if "error" in b:
            continue
        by_arm.setdefault(b["arm"], []).append(b)
    out: dict[str, Any] = {}
    if not {"default", "tailguard"} <= set(by_arm):
        return out
    for batch in batches:
        ours = [b["steady_tpot_ms"].get(str(batch), []) for b in by_arm["tailguard"]]
        theirs = [b["steady_tpot_ms"].get(str(batch), []) for b in by_arm["default"]]
        out[f"tpot_ratio_plugin_vs_default_b{batch}"] = pooled_ratio_interval(ours, theirs, np.median)
    first = [
        a[0] == b[0]
        for x in by_arm["tailguard"]
        for y in by_arm["default"]
        for a, b in zip(x["greedy_tokens"], y["greedy_tokens"], strict=True)
        if a and b
    ]
    out["greedy_first_token_agreement"] = {
        "value": float(np.mean(first)) if first else None,
        "ci_low": None,
        "ci_high": None,
    }
    return out


# --- the run ----------------------------------------------------------------------------------


def ops_summary(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per op, the largest and smallest advantage of ours over vLLM's best implementation."""
    out: dict[str, Any] = {}
    for op in sorted({c["op"] for c in cases}):
        figs = [c["vllm_best_over_ours"] for c in cases if c["op"] == op and c["vllm_best_over_ours"]]
        if not figs:
            continue
        best = max(figs, key=lambda f: f["value"] or 0.0)
        worst = min(figs, key=lambda f: f["value"] or 0.0)
        out[f"{op}_vllm_best_over_ours_max"] = best
        out[f"{op}_vllm_best_over_ours_min"] = worst
        # faster somewhere: the interval's lower end above 1 at some shape
        out[f"{op}_ours_faster_shapes"] = {
            "value": float(sum(1 for f in figs if (f["ci_low"] or 0) > 1.0)),
            "ci_low": None,
            "ci_high": None,
        }
    return out


def pool(paths: Sequence[Path], out: Path, batches: Sequence[int]) -> int:
    """The engine figures over the blocks of several runs of this script (see the docstring)."""
    runs = [json.loads(p.read_text()) for p in paths]
    keys = {(r.get("commit"), r.get("dirty"), r.get("gpu")) for r in runs}
    if len(keys) != 1 or next(iter(keys))[1] is not False:
        raise SystemExit(
            f"--pool: the runs must share one commit, a clean tree and one GPU; they have {sorted(map(str, keys))}"
        )
    blocks = [
        {**b, "source": p.name, "order": i}
        for p, r in zip(paths, runs, strict=True)
        for i, b in enumerate(r["engine_blocks"])
    ]
    commit, _, gpu = next(iter(keys))
    result = {
        "commit": commit,
        "dirty": False,
        "pooled_by": git_state(ROOT),
        "gpu": gpu,
        "machine": runs[0].get("machine"),
        "versions": runs[0].get("versions"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "sources": [
            {"file": p.name, "date": r.get("date"), "command": r.get("command")}
            for p, r in zip(paths, runs, strict=True)
        ],
        "complete": all("error" not in b for b in blocks),
        "summary": summary_figures(engine_figures(blocks, batches))
        | {"device_minutes": round(sum(r["summary"].get("device_minutes", 0.0) for r in runs), 2)},
        "blocks_per_arm": {
            arm: sum(1 for b in blocks if b["arm"] == arm and "error" not in b)
            for arm in ("default", "tailguard")
        },
        "engine_blocks": blocks,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out}: {json.dumps(result['summary'])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="ops,engine", help="comma-separated: ops, engine")
    parser.add_argument(
        "--model-dir", type=Path, help="dense model folder (config.json + tokenizer) for `engine`"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per op and shape (2-50)")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--engine-rounds", type=int, default=2, help="engines per arm (1-6)")
    parser.add_argument("--steady-batches", type=int, nargs="+", default=list(STEADY_BATCHES))
    parser.add_argument("--bursts", type=int, default=2, help="steady-decode bursts per batch size (1-10)")
    parser.add_argument(
        "--output-tokens", type=int, default=192, help="steady decode's output length (16-1024)"
    )
    parser.add_argument("--deadline-s", type=float, default=540.0, help="no new engine block after this")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--pool", type=Path, nargs="+", help="engine result files to pool (no GPU needed)")
    args = parser.parse_args(argv)
    if args.pool:
        return pool(args.pool, args.out, args.steady_batches)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"ops", "engine"}:
        parser.error("--parts takes ops and/or engine")
    if not 2 <= args.rounds <= 50 or not 1 <= args.engine_rounds <= 6 or not 1 <= args.bursts <= 10:
        parser.error("--rounds 2-50, --engine-rounds 1-6, --bursts 1-10")
    if not 16 <= args.output_tokens <= 1024 or not all(1 <= t <= 65536 for t in args.tokens):
        parser.error("--output-tokens 16-1024, --tokens 1-65536")
    if not all(1 <= b <= 512 for b in args.steady_batches):
        parser.error("--steady-batches 1-512")
    if "engine" in parts and (args.model_dir is None or not (args.model_dir / "config.json").is_file()):
        parser.error("engine: --model-dir must hold a config.json")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("kernels_in_vllm: no CUDA GPU here; this benchmark compares GPU kernels")
    start = time.monotonic()
    args.work = args.work or Path(tempfile.mkdtemp(prefix="kiv-"))
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        **git_state(ROOT),
        "machine": machine_facts(),
        "gpu": torch.cuda.get_device_name(),
        "versions": versions("torch", "triton", "vllm"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "rounds": args.rounds,
        "complete": False,
        "summary": {},
        "ops": [],
        "engine_blocks": [],
    }

    def write() -> None:
        figures = ops_summary(result["ops"]) | engine_figures(result["engine_blocks"], args.steady_batches)
        result["summary"] = summary_figures(figures) | {
            "device_minutes": round((time.monotonic() - start) / 60, 2)
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    if "ops" in parts:

        def emit(cases: list[dict[str, Any]]) -> None:
            result["ops"] = cases
            write()

        run_ops(args, emit)
    if "engine" in parts:
        from kernels import vllm_plugin

        plugin_dir = args.work / "plugin"
        vllm_plugin.entry_point_dir(plugin_dir)
        order = [arm for _ in range(args.engine_rounds) for arm in ("default", "tailguard")]
        for i, arm in enumerate(order):
            if time.monotonic() - start > args.deadline_s:
                log(f"deadline: {len(order) - i} engine blocks not run")
                break
            try:
                block = run_engine_block(arm, i // 2, args, plugin_dir)
            except Exception as exc:
                block = {"arm": arm, "round": i // 2, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                log(f"[{arm}] failed: {block['error']}")
                result["engine_blocks"].append(block)
                write()
                break
            result["engine_blocks"].append(block)
            write()
        result["complete"] = (
            len(result["engine_blocks"]) == len(order) and "error" not in result["engine_blocks"][-1]
        )
    else:
        result["complete"] = True
    write()
    log(f"wrote {args.out}: {json.dumps(result['summary'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
