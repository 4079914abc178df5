"""`tailguard kernels tune`: autotune the kernels for a model and a workload profile.

Importing this module is cheap: torch and triton are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OPS = ("rmsnorm", "silu_mul", "decode_attention", "moe_gemm")


def register(subparsers: Any) -> None:
    kernels = subparsers.add_parser("kernels", help="Triton kernels tuned to the workload's shapes")
    sub = kernels.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND", required=True)
    tune = sub.add_parser(
        "tune",
        help="autotune every kernel per shape bucket on this GPU and write the configuration table",
        description=(
            "Derive the token-count and decode-attention buckets that carry the workload from its "
            "profile (the JSON of `tailguard profile TRACE --json`), time every candidate "
            "configuration of each kernel on those buckets on this machine's GPU, and write a JSON "
            "table keyed by bucket with the chosen configuration and the measured times. Needs a "
            "CUDA GPU."
        ),
    )
    tune.add_argument(
        "--model", required=True, help="catalog name (e.g. mixtral-8x7b) or path of a config.json"
    )
    tune.add_argument("--profile", required=True, type=Path, help="workload profile JSON")
    tune.add_argument(
        "--out", type=Path, default=Path("kernel-configs.json"), help="table to write (default: %(default)s)"
    )
    tune.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of %(default)s")
    tune.add_argument(
        "--step-s", type=float, default=0.025, help="engine step time assumed (default: %(default)s)"
    )
    tune.add_argument(
        "--max-batched-tokens", type=int, default=8192, help="chunked-prefill budget (default: %(default)s)"
    )
    tune.add_argument(
        "--max-num-seqs", type=int, default=256, help="most running sequences (default: %(default)s)"
    )
    tune.add_argument(
        "--step-histogram",
        type=Path,
        help="JSON object tokens-per-step -> number of steps (e.g. from the simulator); replaces the model",
    )
    tune.add_argument(
        "--rep-ms", type=int, default=40, help="timing budget per configuration (default: %(default)s)"
    )
    tune.add_argument("--seed", type=int, default=0)
    tune.set_defaults(func=tune_command)


def _fail(message: str) -> int:
    print(f"tailguard kernels tune: {message}", file=sys.stderr)
    return 2


def tune_command(args: argparse.Namespace) -> int:
    from kernels.models import resolve_model
    from kernels.workload import EngineAssumptions, ProfileError, buckets_from_profile

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        return _fail(f"unknown op(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
    try:
        model = resolve_model(args.model)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        profile = json.loads(args.profile.read_text(encoding="utf-8"))
    except OSError as exc:
        return _fail(f"cannot read profile {args.profile}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        return _fail(f"{args.profile} line {exc.lineno}: not JSON ({exc.msg})")
    step_tokens = None
    if args.step_histogram:
        try:
            raw = json.loads(args.step_histogram.read_text(encoding="utf-8"))
            step_tokens = {int(k): float(v) for k, v in raw.items()}
        except (OSError, ValueError, AttributeError) as exc:
            return _fail(f"cannot read step histogram {args.step_histogram}: {exc}")
    try:
        buckets = buckets_from_profile(
            profile,
            EngineAssumptions(
                step_s=args.step_s, max_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs
            ),
            step_tokens=step_tokens,
        )
    except ProfileError as exc:
        return _fail(f"{args.profile}: {exc}")

    try:
        import torch
    except ImportError:
        return _fail("needs PyTorch with CUDA and a GPU; PyTorch is not installed here")
    if not torch.cuda.is_available():
        return _fail(
            "needs a CUDA GPU to time the kernels on, and this machine has none "
            f"(torch {torch.__version__}). Run it on the GPU the deployment will use; "
            "a table tuned elsewhere would describe another chip."
        )
    try:
        import triton  # noqa: F401
    except ImportError:
        return _fail("needs Triton, which is not installed here")

    from kernels.tune import table_json, tune

    print(f"tuning {', '.join(ops)} for {model.name} on {torch.cuda.get_device_name()}", flush=True)
    print(f"token buckets (share of steps): {buckets.to_json()['token_buckets']}", flush=True)
    print(f"attention buckets: {buckets.to_json()['attention_buckets']}", flush=True)
    results = tune(
        model, buckets, ops=ops, rep_ms=args.rep_ms, seed=args.seed, log=lambda s: print(s, flush=True)
    )
    table = table_json(model, buckets, results, profile=str(args.profile))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    for op, s in table["summary"].items():
        if s.get("fixed_us"):
            print(
                f"{op:17s} per-bucket {s['tuned_us']:.1f} us vs best fixed {s['fixed_us']:.1f} us "
                f"(gain {100 * s['gain']:.1f}%)"
            )
    print(f"wrote {args.out}")
    return 0
