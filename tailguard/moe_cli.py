"""`tailguard moe-tables tune`: a tuning job's last step on a GPU pool's host (issue 25).

The job's agent runs it as a process (the portal imports no CLI): from the model folder, the
winner's engine configuration and the job's traffic sample, it tunes vLLM's fused-MoE table for
the traffic (`tailguard.moe_step`) on this host's GPU and prints one JSON object:
`{"tables": {vLLM file name: table JSON}, "note": what it did}`. Exit 0 with a table; 3 when
there is nothing to tune, with the reason as the note (a dense or quantised model, a host
without a CUDA GPU, a run that would not fit its time budget): the endpoint then runs vLLM's
own tables. Bad arguments exit 2 like any command.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernels import moe_tuning
from serving.catalog.models import MODELS, ModelSpec, UnknownModel, model_spec_from_dir
from serving.engine.config import EngineConfig, InvalidEngineConfig
from tailguard import moe_step

NOT_TUNED = 3
MAX_BUDGET = 2000  # timed candidates
MAX_TIME_BUDGET_S = 3600.0
MAX_REQUESTS = 20_000  # of the sample the simulator replays


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("moe-tables", help="tune vLLM's fused-MoE tables for a traffic sample")
    sub = parser.add_subparsers(dest="moe_command", metavar="SUBCOMMAND", required=True)
    tune = sub.add_parser("tune", help="tune one table on this host's GPU; JSON on stdout")
    tune.add_argument("--model-dir", required=True, type=Path, help="folder with the model's config.json")
    tune.add_argument("--config", required=True, type=Path, help="the engine configuration (JSON mapping)")
    tune.add_argument("--trace", required=True, type=Path, help="the traffic sample (trace file)")
    tune.add_argument("--hardware", required=True, help="the pool's catalog accelerator (simulated steps)")
    tune.add_argument("--out", type=Path, help="folder for the table file (default: a temporary one)")
    tune.add_argument("--budget", type=int, default=200, help=f"timed candidates, 1-{MAX_BUDGET}")
    tune.add_argument(
        "--time-budget-s",
        type=float,
        default=420.0,
        help=f"refuse a plan longer than this (<= {MAX_TIME_BUDGET_S:.0f})",
    )
    tune.add_argument("--max-requests", type=int, default=2000, help="sample requests the simulator replays")
    tune.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    if not 1 <= args.budget <= MAX_BUDGET:
        print(f"moe-tables: --budget must be in [1, {MAX_BUDGET}]", file=sys.stderr)
        return 2
    if not 1 <= args.time_budget_s <= MAX_TIME_BUDGET_S:
        print(f"moe-tables: --time-budget-s must be in [1, {MAX_TIME_BUDGET_S:.0f}]", file=sys.stderr)
        return 2
    if not 1 <= args.max_requests <= MAX_REQUESTS:
        print(f"moe-tables: --max-requests must be in [1, {MAX_REQUESTS}]", file=sys.stderr)
        return 2
    try:
        tables, note = tune_tables(args)
    except moe_step.NotTunable as exc:
        print(json.dumps({"tables": {}, "note": f"not tuned: {exc}"}))
        return NOT_TUNED
    except (OSError, ValueError) as exc:  # unreadable inputs: the command's own error
        print(f"moe-tables: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"tables": tables, "note": note}))
    return 0 if tables else NOT_TUNED


def model_spec(model_dir: Path) -> ModelSpec:
    """The model's shape: a dense checkpoint's from its config.json; a MoE checkpoint's from the
    catalog entry of the same MoE dimensions (layers, width, experts, their width and top-k,
    whatever the entry's name). `NotTunable` when neither says."""
    try:
        return model_spec_from_dir(model_dir)
    except UnknownModel as exc:
        try:
            config = json.loads((model_dir / "config.json").read_text())
        except (OSError, ValueError):
            raise moe_step.NotTunable(str(exc).strip('"')) from None
        experts = (
            config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts")
        )
        shape = (
            config.get("num_hidden_layers"),
            config.get("hidden_size"),
            experts,
            config.get("moe_intermediate_size") or config.get("intermediate_size"),
            config.get("num_experts_per_tok"),
        )
        for spec in MODELS.values():
            if spec.is_moe and shape == (
                spec.num_layers,
                spec.hidden_size,
                spec.num_experts,
                spec.moe_intermediate_size,
                spec.num_experts_per_token,
            ):
                return spec
        raise moe_step.NotTunable(
            f"{model_dir}: no catalog MoE model has its dimensions (layers, width, experts, "
            f"expert width, top-k = {shape}), so its fused-MoE shape is unknown"
        ) from None


def tune_tables(args: argparse.Namespace) -> tuple[dict[str, str], str]:
    """(tables, note); `NotTunable` with the reason before any GPU time is spent."""
    spec = model_spec(Path(args.model_dir))
    try:
        config = EngineConfig.from_mapping(json.loads(Path(args.config).read_text()))
    except InvalidEngineConfig as exc:
        raise ValueError(f"{args.config}: {exc}") from exc
    layer = moe_step.layer_shape(spec, config)  # a dense or quantised model is refused here
    import torch

    if not torch.cuda.is_available():
        raise moe_step.NotTunable(
            f"this host ({args.hardware}) has no CUDA GPU: vLLM's fused-MoE kernel and its tables are GPU-only"
        )
    sample = moe_step.step_sample(
        args.trace, model=spec, hardware=args.hardware, config=config, max_requests=args.max_requests
    )
    try:
        planned = moe_step.plan_tables(
            model=spec,
            config=config,
            gpu_name=torch.cuda.get_device_name(),
            sample=sample,
            budget=args.budget,
            time_budget_s=args.time_budget_s,
            device_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
        )
    except moe_tuning.TuningWontFit as exc:
        raise moe_step.NotTunable(str(exc)) from exc
    bench, check, timed, baseline = moe_step.vllm_bench(layer, log=lambda line: print(line, file=sys.stderr))
    out = args.out or Path(tempfile.mkdtemp(prefix="tailguard-moe-"))
    path, result = moe_step.run_tables(planned, bench, out, check=check, baseline=baseline)
    if path is None:
        return {}, f"not tuned: no candidate worked on this GPU ({timed})"
    speedup = result.to_dict().get("kernel_speedup_vs_engine")
    gain = f", {speedup:.3f}x vLLM's own per MoE call in the traffic's weighting" if speedup else ""
    return {path.name: path.read_text()}, (
        f"tuned for the traffic on {torch.cuda.get_device_name()} ({planned.plan.to_dict().get('timings', '?')} "
        f"timings of {timed}{gain})"
    )
