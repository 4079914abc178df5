"""Operator profile of the catalog models' GEMM and attention shapes on a GPU, and its fit.

Two halves:
- `measure` (runs on the GPU machine, torch only): times bf16 matmuls of every linear layer
  shape of the catalog's models at several token counts, attention (prefill with a causal mask,
  and decode against a KV cache, grouped-query as each model has it) through
  `scaled_dot_product_attention`, and a device-to-device copy; CUDA events, median of repeats
  after warm-up. Writes the raw table as JSON.
- `fit` (runs here): fits, on the shapes of some models, the roofline
  t = max(FLOPs / (peak x e_compute), bytes / (bandwidth x e_memory)) + t_launch per operator
  class, and reports the error on the held-out models' shapes. The fitted efficiencies become
  `serving/perf/data/h200.json`, which the step-latency model uses for the H200 and, as the
  nearest measured accelerator, for the other accelerators.

    python -m serving.perf.h200_profile measure --out h200_ops.json      # on the GPU
    python -m serving.perf.h200_profile fit h200_ops.json                # here
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from serving.catalog.hardware import get_hardware
from serving.catalog.models import MODELS, ModelSpec

PROFILED = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen3-8b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "glm-4.5-air",
    "deepseek-v3",
)
HELD_OUT = ("llama-3.1-70b", "qwen3-8b", "glm-4.5-air")  # fit on the others, report error on these
TOKENS = (1, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DECODE = ((1, 2048), (16, 2048), (64, 1024), (64, 8192), (256, 2048))  # (batch, context)
PREFILL = (512, 2048, 8192)
# CUDA device names (as torch reports them) of the accelerators a profile may be fitted for.
GPU_NAMES = {"H200": "h200", "H100": "h100"}


def linear_shapes(spec: ModelSpec) -> list[tuple[str, int, int]]:
    """(name, K, N) of one layer's matmuls (MoE: one expert's; MLA: its projections)."""
    h = spec.hidden_size
    out: list[tuple[str, int, int]] = []
    if spec.uses_mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out += [
            ("q_a", h, spec.q_lora_rank),
            ("q_b", spec.q_lora_rank, spec.num_heads * qk),
            ("kv_a", h, spec.kv_lora_rank + spec.qk_rope_head_dim),
            ("o", spec.num_heads * spec.v_head_dim, h),
        ]
    else:
        out += [
            ("qkv", h, (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim),
            ("o", spec.num_heads * spec.head_dim, h),
        ]
    inter = spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    out += [("gate_up", h, 2 * inter), ("down", inter, h)]
    return out


def attention_heads(spec: ModelSpec) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) as an unabsorbed kernel sees them."""
    if spec.uses_mla:
        return spec.num_heads, spec.num_heads, spec.qk_nope_head_dim + spec.qk_rope_head_dim
    return spec.num_heads, spec.num_kv_heads, spec.head_dim


# -- measuring (GPU machine) -------------------------------------------------------------------


def measure(
    out_path: Path, *, max_seconds: float = 150.0, device: str = "cuda", models: Sequence[str] = PROFILED
) -> None:
    import time

    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    started = time.monotonic()

    def timed(fn: Any, reps: int = 20) -> float:
        for _ in range(3):
            fn()
        if dev.type != "cuda":  # smoke runs only: wall clock
            begin = time.perf_counter()
            fn()
            return time.perf_counter() - begin
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1000.0)
        return float(np.median(times))

    if dev.type == "cuda":  # bring the clocks up from idle before the first timing
        spin = torch.empty(8192, 8192, dtype=torch.bfloat16, device=dev)
        while time.monotonic() - started < 3.0:
            torch.matmul(spin, spin)
        torch.cuda.synchronize()
        del spin
    rows: list[dict[str, Any]] = []
    n = 1 << 28 if dev.type == "cuda" else 1 << 20
    src = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
    dst = torch.empty_like(src)
    copy_s = timed(lambda a=src, b=dst: b.copy_(a))
    rows.append({"op": "copy", "bytes": 2 * n * 2, "seconds": copy_s})
    src = dst = torch.empty(0, device=dev)
    for name in models:
        spec = MODELS[name]
        for layer, k, n_out in linear_shapes(spec):
            w = torch.empty(k, n_out, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
            for m in TOKENS:
                x = torch.empty(m, k, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
                s = timed(lambda x=x, w=w: torch.matmul(x, w))
                rows.append(
                    {
                        "op": "gemm",
                        "model": name,
                        "layer": layer,
                        "m": m,
                        "k": k,
                        "n": n_out,
                        "flops": 2.0 * m * k * n_out,
                        "bytes": 2.0 * (m * k + k * n_out + m * n_out),
                        "seconds": s,
                    }
                )
        hq, hkv, d = attention_heads(spec)
        for seq in PREFILL:
            q = torch.empty(1, hq, seq, d, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
            # Distinct K and V tensors: the same tensor for both would let V's reads hit in L2.
            key = torch.empty(1, hkv, seq, d, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
            value = torch.empty_like(key).normal_(generator=gen)
            s = timed(
                lambda q=q, k=key, v=value, g=hq != hkv: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=g
                )
            )
            rows.append(
                {
                    "op": "attn_prefill",
                    "model": name,
                    "seq": seq,
                    "heads": hq,
                    "kv_heads": hkv,
                    "d": d,
                    "flops": 4.0 * hq * d * seq * (seq + 1) / 2,
                    "bytes": 2.0 * seq * d * (2 * hq + 2 * hkv),
                    "seconds": s,
                }
            )
        for batch, ctx in DECODE:
            q = torch.empty(batch, hq, 1, d, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
            key = torch.empty(batch, hkv, ctx, d, dtype=torch.bfloat16, device=dev).normal_(generator=gen)
            value = torch.empty_like(key).normal_(generator=gen)
            s = timed(
                lambda q=q, k=key, v=value, g=hq != hkv: F.scaled_dot_product_attention(q, k, v, enable_gqa=g)
            )
            rows.append(
                {
                    "op": "attn_decode",
                    "model": name,
                    "batch": batch,
                    "ctx": ctx,
                    "heads": hq,
                    "kv_heads": hkv,
                    "d": d,
                    "flops": 4.0 * batch * hq * d * ctx,
                    "bytes": 2.0 * batch * (2 * hkv * ctx * d + 2 * hq * d),
                    "seconds": s,
                }
            )
            del q, key, value
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if time.monotonic() - started > max_seconds:
            print(f"stopping after {name}: time limit", flush=True)
            break
    from serving.perf.calibrate import code_state

    data = {
        # The commit the profile was measured at, and whether this script differed from it.
        **code_state(("h200_profile.py",)),
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (smoke run)",
        "torch": torch.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "how": "torch bf16 matmul and scaled_dot_product_attention, CUDA events, median of 20 after 3 warm-ups, clocks brought up by 3 s of matmuls first",
        "rows": rows,
    }
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(rows)} timings in {time.monotonic() - started:.0f} s -> {out_path}")


# -- fitting (here) ----------------------------------------------------------------------------


def _predict(
    rows: list[dict[str, Any]], e_c: float, e_m: float, t0: float, peak: float, bw: float
) -> np.ndarray:
    flops = np.array([r["flops"] for r in rows])
    data = np.array([r["bytes"] for r in rows])
    return np.maximum(flops / (peak * e_c), data / (bw * e_m)) + t0


def _fit_class(rows: list[dict[str, Any]], peak: float, bw: float) -> tuple[float, float, float]:
    """Grid search of (compute eff, memory eff, launch s) minimising mean |log error|."""
    measured = np.array([r["seconds"] for r in rows])
    best = (1.0, 1.0, 0.0)
    best_err = np.inf
    for e_c in np.linspace(0.01, 1.0, 100):
        for e_m in np.linspace(0.05, 1.0, 39):
            base = _predict(rows, e_c, e_m, 0.0, peak, bw)
            for t0 in np.linspace(0.0, 8e-5, 41):
                err = float(np.mean(np.abs(np.log((base + t0) / measured))))
                if err < best_err:
                    best_err, best = err, (float(e_c), float(e_m), float(t0))
    return best


def _class_rows(rows: list[dict[str, Any]], op: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One operator class's (train, held-out) rows. MLA models' attention is profiled unabsorbed
    through SDPA (head dim 192, 128 KV heads), which is not the kernel the engine runs for them
    (absorbed MLA): kept out of the attention fit, its error reported on its own."""
    fitted = [r for r in rows if r["op"] == op and not (op != "gemm" and MODELS[r["model"]].uses_mla)]
    return (
        [r for r in fitted if r["model"] not in HELD_OUT],
        [r for r in fitted if r["model"] in HELD_OUT],
    )


def held_out_errors(stored: dict[str, Any]) -> list[float]:
    """Every held-out operator's absolute percentage error under a stored fit (the contents of
    `h200.json`, `h100.json`), recomputed from its profile rows and fitted classes: what
    `held_out_mape` averages, one value per operator, for an interval."""
    hw = get_hardware(str(stored["efficiency"]["hardware"]))
    peak, bw = hw.peak_flops("bf16"), hw.memory_bandwidth_bytes_per_s
    errors: list[float] = []
    for op, entry in stored["fit"]["classes"].items():
        _, test = _class_rows(stored["profile"], op)
        if not test:
            continue
        pred = _predict(
            test, entry["compute_efficiency"], entry["memory_efficiency"], entry["launch_us"] / 1e6, peak, bw
        )
        meas = np.array([r["seconds"] for r in test])
        errors += [float(x) for x in np.abs(pred - meas) / meas]
    return errors


def profiled_hardware(device: str) -> str:
    """The catalog accelerator a profile's CUDA device name is (`NVIDIA H100 80GB HBM3` is
    `h100`); a device the catalog does not list is refused, not fitted against another's datasheet."""
    for marker, name in GPU_NAMES.items():
        if marker in device:
            return name
    raise ValueError(
        f"the profile was measured on {device!r}, which is none of the catalog's profiled GPUs "
        f"({', '.join(GPU_NAMES)}): its efficiencies would be fitted against the wrong datasheet"
    )


def fit(profile: Path, out: Path | None = None) -> dict[str, Any]:
    """Fits `profile` (what `measure` wrote) and writes the calibration to `out`, by default
    `serving/perf/data/<the profiled GPU>.json`."""
    data = json.loads(profile.read_text())
    rows = data["rows"]
    hardware = profiled_hardware(str(data["device"]))
    out = out or Path(__file__).resolve().parent / "data" / f"{hardware}.json"
    hw = get_hardware(hardware)
    peak, bw = hw.peak_flops("bf16"), hw.memory_bandwidth_bytes_per_s
    copy = [r for r in rows if r["op"] == "copy"]
    result: dict[str, Any] = {"classes": {}}
    errors: list[float] = []
    for op in ("gemm", "attn_prefill", "attn_decode"):
        train, test = _class_rows(rows, op)
        if not train:
            continue
        e_c, e_m, t0 = _fit_class(train, peak, bw)
        entry: dict[str, Any] = {
            "compute_efficiency": e_c,
            "memory_efficiency": e_m,
            "launch_us": t0 * 1e6,
            "num_train": len(train),
            "num_held_out": len(test),
        }
        if test:
            pred = _predict(test, e_c, e_m, t0, peak, bw)
            meas = np.array([r["seconds"] for r in test])
            ape = np.abs(pred - meas) / meas
            entry["held_out_mape"] = float(ape.mean())
            errors += [float(x) for x in ape]
        mla = [r for r in rows if r["op"] == op and op != "gemm" and MODELS[r["model"]].uses_mla]
        if mla:
            pred = _predict(mla, e_c, e_m, t0, peak, bw)
            meas = np.array([r["seconds"] for r in mla])
            entry["mla_unabsorbed_mape_not_fitted"] = float((np.abs(pred - meas) / meas).mean())
        result["classes"][op] = entry
    gemm = result["classes"].get("gemm", {})
    attn = result["classes"].get("attn_prefill", result["classes"].get("attn_decode", {}))
    decode = result["classes"].get("attn_decode", {})
    copy_eff = (copy[0]["bytes"] / copy[0]["seconds"]) / bw if copy else None
    memory_eff = gemm.get("memory_efficiency", 0.7)
    if decode:
        memory_eff = min(memory_eff, decode["memory_efficiency"])
    efficiency = {
        "hardware": hardware,
        "gemm_efficiency": gemm.get("compute_efficiency", 0.6),
        "attention_efficiency": attn.get("compute_efficiency", 0.35),
        "memory_efficiency": memory_eff,
        "comm_efficiency": 0.6,
        "comm_latency_us": 10.0,
        "step_overhead_ms": 3.0,
        "seq_overhead_ms": 0.01,
        "token_overhead_ms": 0.0,
        "request_overhead_ms": 5.0,
        "measured": True,
        "how": (
            f"GEMM/attention/memory efficiencies fitted to a torch operator profile on {data['device']} "
            f"({data['measured_at'][:10]}); step, request and communication costs are priors, not measured"
        ),
    }
    out_data = {
        "machine": data["device"],
        "measured_at": data["measured_at"],
        # The commit the profile was measured at (None: measured before `measure` recorded it).
        "measured_commit": data.get("commit"),
        "measured_dirty": data.get("dirty"),
        "how": data["how"] + "; fitted by `python -m serving.perf.h200_profile fit`",
        "versions": {"torch": data["torch"]},
        "held_out_models": list(HELD_OUT),
        "held_out_mape": float(np.mean(errors)) if errors else None,
        "copy_bandwidth_efficiency": copy_eff,
        "fit": result,
        "efficiency": efficiency,
        "profile": rows,
    }
    out.write_text(json.dumps(out_data, indent=1) + "\n")
    return out_data


def from_kernel_benchmark(kernels_result: Path, out: Path) -> dict[str, Any]:
    """Efficiencies from the kernels benchmark's H200 ceilings, when no operator profile was run.

    `benchmarks/results/kernels.json` (the Triton kernels' benchmark, run on an H200) records the
    measured bf16 matmul rate and copy bandwidth, and its paged decode attention's share of that
    bandwidth. Those give the GEMM and memory efficiencies against the datasheet; attention's
    compute efficiency and the per-step costs stay priors, and the file says so. No held-out
    error can come from it (`held_out_mape` is null).
    """
    data = json.loads(kernels_result.read_text())
    hw = get_hardware("h200")
    ceilings = data["ceilings"]
    gemm_eff = float(ceilings["bf16_matmul_flop_per_s"]) / hw.peak_flops("bf16")
    copy_eff = float(ceilings["copy_bytes_per_s"]) / hw.memory_bandwidth_bytes_per_s
    attn_bw = [
        float(c["bw_frac"]) for c in data["cases"] if c.get("case") == "decode_attention" and "bw_frac" in c
    ]
    memory_eff = copy_eff * (min(attn_bw) if attn_bw else 1.0)
    how = (
        f"GEMM and memory efficiencies from the H200 ceilings in {kernels_result.name} ({data['date']}, "
        f"{data['machine']}: bf16 matmul {ceilings['bf16_matmul_flop_per_s'] / 1e12:.0f} TFLOP/s, copy "
        f"{ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, paged decode attention at {min(attn_bw, default=1.0):.2f} "
        "of copy); attention compute efficiency, step, request and communication costs are priors, not measured"
    )
    efficiency = {
        "hardware": "h200",
        "gemm_efficiency": gemm_eff,
        "attention_efficiency": 0.35,
        "memory_efficiency": memory_eff,
        "comm_efficiency": 0.6,
        "comm_latency_us": 10.0,
        "step_overhead_ms": 3.0,
        "seq_overhead_ms": 0.01,
        "token_overhead_ms": 0.0,
        "request_overhead_ms": 5.0,
        "measured": True,
        "how": how,
    }
    out_data = {
        "machine": data["machine"],
        "measured_at": data["date"],
        "how": f"python -m serving.perf.h200_profile from-kernels {kernels_result}",
        "versions": data.get("versions", {}),
        "held_out_models": [],
        "held_out_mape": None,
        "note": "no operator profile of the catalog's shapes was run (device time was spent); see the docstring",
        "efficiency": efficiency,
    }
    out.write_text(json.dumps(out_data, indent=1) + "\n")
    return out_data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--max-seconds", type=float, default=150.0)
    m.add_argument("--device", default="cuda")
    m.add_argument("--models", default=",".join(PROFILED))
    f = sub.add_parser("fit")
    f.add_argument("profile", type=Path)
    f.add_argument(
        "--out", type=Path, default=None, help="default: serving/perf/data/<the profiled GPU>.json"
    )
    k = sub.add_parser("from-kernels")
    k.add_argument("kernels_result", type=Path)
    k.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data" / "h200.json")
    args = parser.parse_args(argv)
    if args.action == "from-kernels":
        print(json.dumps(from_kernel_benchmark(args.kernels_result, args.out)["efficiency"], indent=1))
        return 0
    if args.action == "measure":
        measure(args.out, max_seconds=args.max_seconds, device=args.device, models=args.models.split(","))
        return 0
    result = fit(args.profile, args.out)
    print(
        json.dumps(
            {
                "held_out_mape": result["held_out_mape"],
                **{k: v.get("held_out_mape") for k, v in result["fit"]["classes"].items()},
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
