"""End to end on an H200 with real vLLM: does tuning the fused-MoE kernel's tables move latency?

One MoE architecture with random weights (`--load-format dummy`: only config.json and a
tokenizer), in two shapes written here: Qwen3-30B-A3B's own (128 experts, expert width 768: vLLM
ships an H200 table for E=128,N=768) and the same model with 64 experts (E=64,N=768: no H200
table in vLLM 0.32, so vLLM runs its generic default and warns "sub-optimal"). Whether the
host's vLLM ships a table for each shape is checked on the host, not assumed. The device tool may
lend an H100 for an H200: `--hardware auto` simulates the loads and plans the tables for the GPU
torch sees there (its memory, its table file names), and the result says which.

Three arms per shape, each a fresh engine per block:
- `default`: no VLLM_TUNED_CONFIG_FOLDER (vLLM's shipped table, or its generic default);
- `uniform`: tables tuned the way vLLM's own tuning script does, every key of its batch-size
  grid alike, timed at the key itself;
- `traffic`: tables tuned for the trace (`tailguard.moe_step`): the simulator replays the trace
  at both loads under the serving configuration, the engine steps' token counts are bucketed by
  vLLM's keys and weighted by the time each bucket runs, and the same number of timed trials as
  `uniform` is spent where the traffic spends its time.
Both tuned arms time vLLM's own fused-MoE kernel on this GPU (through `override_config`; where
this vLLM does not expose it, `kernels.moe_gemm`, a kernel of the same tiling, is timed instead
and the result says so). Every block's engine log is read back for the table vLLM really used.

Per (shape, trace): `--warmup-rounds` discarded rounds first (run 5 found the first round of
every arm slower, its first requests waiting over a second: the first engine to run a table's
kernels compiles them, later ones read the compiled cache), then rounds of the three arms in
rotated order, `--repeats` rounds; each block
replays the trace at two loads (fractions of the simulated saturation rate, the trace's own
arrivals scaled), with the same prompts for the three arms of a round and fresh ones per round.
Figures per load: TPOT p50 and TTFT p95 ratios with 95% intervals from the two-level bootstrap
of `tuning.search.confirm` (blocks, then requests): `tpot_ratio_vs_default`,
`ttft_p95_ratio_vs_default`, `tpot_ratio_vs_uniform_tuned` (traffic arm over the other).

Device time is scarce: `--deadline-s` stops before a step that would not finish in time, every
step is kept in `--state`, and the result file (`--out`, written by this script only) is
rewritten after each step with `"complete": false` until everything ran; the next command
resumes. `--dry-run` checks the whole plan on a CPU (shapes and their table file names, shipped
tables, simulated loads and step distributions, tuning plans against their time budget, the
engine's flags through vLLM's own parser) and writes it to `--plan-out`, starting nothing.

    python3 benchmarks/kernels_e2e.py --dry-run --plan-out /tmp/kernels_e2e_plan.json
    python3 benchmarks/kernels_e2e.py --tokenizer-from /tmp/tgpu/tokenizer \\
        --out $OUT/kernels_e2e.json --state $OUT/kernels_e2e_state.json --deadline-s 540
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._resumable import Clock, load_state, log, save_state  # noqa: E402
from kernels import moe_tuning  # noqa: E402
from serving.catalog.models import ModelSpec, get_model  # noqa: E402
from serving.engine import moe_tables  # noqa: E402
from serving.engine.config import EngineConfig  # noqa: E402
from serving.loadgen.arrivals import trace_offsets_s  # noqa: E402
from serving.sim.api import load_requests, simulate_trace  # noqa: E402
from tailguard import moe_step  # noqa: E402
from tuning.search.confirm import Block, ratio  # noqa: E402

TRACES_DIR = REPO / "data" / "traces"
TRACES = {"azure_conv": "azure2023_conv.csv", "mooncake": "mooncake_synthetic.jsonl"}
ARMS = ("default", "uniform", "traffic")
# The simulator's hardware for each GPU the device tool may lend, and the memory a process gets
# there (torch's total_memory): the loads and the tuning plans are simulated for the GPU that runs.
HARDWARE_BY_GPU = {"H200": "h200", "H100": "h100"}
USABLE_MEMORY_GIB = {"h200": 139.8, "h100": 79.1}
# Qwen3-30B-A3B's published config.json fields that decide its shapes and the engine's behaviour.
_QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "initializer_range": 0.02,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": _QWEN3_MOE,
    # The same architecture with half the experts (a pruned or differently trained variant):
    # a fused-MoE shape vLLM 0.32 ships no H200 table for.
    "qwen3-30b-a3b-e64": _QWEN3_MOE | {"num_experts": 64},
}
MAX_BLOCK_REQUESTS = 1500  # requests in one replay, whatever the rate and duration
MAX_REPEATS = 10
MAX_WARMUP_ROUNDS = 3
MAX_SIM_REQUESTS = 4000  # one simulated replay (a few seconds of CPU)
MAX_STEADY_BATCHES = 6
MAX_STEADY_BATCH = 512  # vLLM's largest CUDA-graph capture size by default


# -- the plan (CPU) ------------------------------------------------------------------------------


def gpu_name(hardware: str) -> str:
    """The name torch gives the GPU of a catalog hardware (table file names are made from it)."""
    return {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}[hardware]


def hardware_of(device_name: str) -> str:
    """The catalog hardware of the GPU torch names; refused for one the simulator does not know."""
    for key, hardware in HARDWARE_BY_GPU.items():
        if key in device_name:
            return hardware
    raise ValueError(
        f"GPU {device_name!r} is none of {', '.join(HARDWARE_BY_GPU)}: no simulated loads for it"
    )


def model_spec(shape: str) -> ModelSpec:
    """The catalog's Qwen3-30B-A3B with this shape's expert count (what the simulator needs)."""
    cfg = SHAPES[shape]
    base = get_model("qwen3-30b-a3b")
    if cfg["num_experts"] == base.num_experts:
        return base
    return dataclasses.replace(base, name=shape, num_experts=cfg["num_experts"], published_params_b=None)


def write_model(shape: str, out: Path, tokenizer_from: Path | None) -> Path:
    """config.json for `--load-format dummy`, plus the tokenizer files when given."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SHAPES[shape], indent=1))
    if tokenizer_from is not None:
        tok = tokenizer_from / "tokenizer.json"
        if not tok.is_file():
            raise SystemExit(f"{tokenizer_from} has no tokenizer.json")
        vocab = len(json.loads(tok.read_text()).get("model", {}).get("vocab", {}))
        if vocab > SHAPES[shape]["vocab_size"]:
            raise SystemExit(f"the tokenizer's {vocab:,} ids exceed the model's vocabulary")
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tokenizer_from / name).is_file():
                shutil.copy(tokenizer_from / name, out / name)
    return out


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The serving configuration every arm shares (the arms differ only in their tables)."""
    return EngineConfig(load_format="dummy", max_model_len=args.max_model_len, seed=0)


def shipped_tables_dir() -> Path | None:
    """The fused-MoE tables of the vLLM importable here, without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model_executor/layers/fused_moe/configs"
    return folder if folder.is_dir() else None


def trace_rate_rps(trace: Path, max_requests: int) -> float:
    offsets = trace_offsets_s(load_requests(trace, max_requests=max_requests))
    span = max(offsets) - min(offsets) if offsets else 0.0
    return (len(offsets) - 1) / span if span > 0 else 0.0


def find_loads(
    trace: Path, spec: ModelSpec, config: EngineConfig, args: argparse.Namespace
) -> dict[str, Any]:
    """Two loads as rate scales of the trace's own arrivals: fractions of the highest scale at which
    the simulated engine's p95 TTFT stays under `--saturation-ttft-ms` over an arrival window of
    `--sim-window-s` (an overloaded engine's queue grows through the window, so its TTFT passes
    any such bound), on a geometric ladder of at most 16 rungs."""
    rate = trace_rate_rps(trace, args.sim_requests)
    best = 0.0
    points = []
    for scale in (0.25 * 1.5**i for i in range(16)):
        # Enough requests to fill the window at this rate: a short burst never saturates.
        n = min(MAX_SIM_REQUESTS, max(args.sim_requests, math.ceil(rate * scale * args.sim_window_s)))
        res = simulate_trace(
            trace,
            model=spec,
            hardware=args.hardware,
            config=config,
            rate_scale=scale,
            max_requests=n,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
        )
        s = res.summary
        p95 = s.ttft_ms.p95
        points.append(
            {
                "rate_scale": round(scale, 4),
                "requests": n,
                "ttft_p95_ms": None if math.isnan(p95) else round(p95, 1),
                "throughput_over_offered": round(s.request_throughput_rps / s.offered_rate_rps, 3)
                if s.offered_rate_rps > 0
                else None,
            }
        )
        if math.isnan(p95) or p95 > args.saturation_ttft_ms:
            break
        best = scale
    if best <= 0:
        raise SystemExit(f"{trace.name}: even a quarter of the trace's rate saturates the simulated engine")
    fractions = [float(f) for f in args.load_fractions.split(",")]
    if not fractions or not all(0 < f <= 1 for f in fractions) or len(fractions) > 4:
        raise SystemExit("--load-fractions: one to four fractions in (0, 1]")
    return {
        "saturation_rate_scale": best,
        "ladder": points,
        "loads": {f"{f:g}x": round(best * f, 4) for f in fractions},
    }


def merged_steps(samples: Sequence[moe_step.StepSample]) -> moe_step.StepSample:
    """The step histograms of several loads, each given the same total weight (time share)."""
    merged: dict[int, list[float]] = {}
    for s in samples:
        total = sum(sec for _, sec in s.step_tokens.values()) or 1.0
        for tokens, (steps, sec) in s.step_tokens.items():
            entry = merged.setdefault(tokens, [0.0, 0.0])
            entry[0] += steps
            entry[1] += sec / total
    return moe_step.StepSample(
        {t: (int(c), s) for t, (c, s) in sorted(merged.items())},
        sum(s.num_requests for s in samples),
        sum(s.busy_s for s in samples),
        0.0,
    )


def build_plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything decided before device time is spent; refuses what would not fit."""
    config = engine_config(args)
    shipped_dir = shipped_tables_dir()
    shipped = {p.name for p in shipped_dir.glob("*.json")} if shipped_dir else set()
    gib = USABLE_MEMORY_GIB[args.hardware]
    plan: dict[str, Any] = {
        "engine_config": config.to_mapping(),
        "hardware": args.hardware,
        "shapes": {},
        "device_memory_gib": gib,
    }
    memory = int(gib * 2**30)
    for shape in args.shapes:
        spec = model_spec(shape)
        table_plans: dict[str, Any] = {}
        uniform = moe_step.plan_tables(
            model=spec,
            config=config,
            gpu_name=gpu_name(args.hardware),
            sample=None,
            budget=args.tune_trials,
            time_budget_s=args.tune_budget_s,
            seconds_per_timing=args.seconds_per_timing,
            device_memory_bytes=memory,
            pool_size=args.pool_size,
            min_per_bucket=max(1, args.tune_trials // len(moe_tables.BATCH_SIZE_KEYS)),
        )
        table_plans["uniform"] = uniform.to_dict()
        traces: dict[str, Any] = {}
        for name in args.traces:
            trace = TRACES_DIR / TRACES[name]
            loads = find_loads(trace, spec, config, args)
            samples = [
                moe_step.step_sample(
                    trace,
                    model=spec,
                    hardware=args.hardware,
                    config=config,
                    rate_scale=scale,
                    max_requests=args.sim_requests,
                    max_prompt_tokens=args.max_prompt_tokens,
                    max_output_tokens=args.max_output_tokens,
                )
                for scale in loads["loads"].values()
            ]
            traffic = moe_step.plan_tables(
                model=spec,
                config=config,
                gpu_name=gpu_name(args.hardware),
                sample=merged_steps(samples),
                budget=args.tune_trials,
                time_budget_s=args.tune_budget_s,
                seconds_per_timing=args.seconds_per_timing,
                device_memory_bytes=memory,
                pool_size=args.pool_size,
                min_per_bucket=args.min_per_bucket,
                max_points=args.max_points,
            )
            rate = trace_rate_rps(trace, args.sim_requests)
            traces[name] = {
                **loads,
                "trace_rate_rps": round(rate, 3),
                "requests_per_replay": {
                    k: replay_requests(rate * v, args.duration_s) for k, v in loads["loads"].items()
                },
                "traffic_table": traffic.to_dict(),
            }
        file_name = uniform.table.file_name
        plan["shapes"][shape] = {
            "experts": spec.num_experts,
            "table_file_name": file_name,
            "vllm_ships_table": (file_name in shipped) if shipped_dir else None,
            "checked_against": str(shipped_dir) if shipped_dir else None,
            "uniform_table": table_plans["uniform"],
            "traces": traces,
        }
    arms = {}
    for arm in args.arms:
        cfg = config if arm == "default" else moe_tables.with_tables(config, f"/WORK/tables/{arm}/<shape>")
        arms[arm] = {"args": cfg.to_args(model="/WORK/models/<shape>"), "env": cfg.to_env()}
    plan["arms"] = arms
    rounds = args.repeats + args.warmup_rounds
    blocks = len(args.shapes) * len(args.traces) * len(args.arms) * rounds
    replays_s = (
        sum(
            (args.duration_s + 30.0) * len(t["loads"])
            for s in plan["shapes"].values()
            for t in s["traces"].values()
        )
        * len(args.arms)
        * rounds
    )
    # Per block: the unmeasured warm replay and the steady-decode bursts (each about its
    # outputs' length of 10-20 ms decode steps, plus the connection set-up).
    replays_s += blocks * (
        1.5 * args.warm_replay_s
        + len(args.steady_batches) * args.steady_bursts * (0.02 * args.steady_output_tokens + 1.0)
    )
    tuning_s = sum(
        s["uniform_table"]["estimate_s"] * ("uniform" in args.arms)
        + sum(t["traffic_table"]["estimate_s"] for t in s["traces"].values())
        for s in plan["shapes"].values()
    )
    plan["estimate"] = {
        "blocks": blocks,
        "engine_starts_s": blocks * args.engine_start_s,
        "replays_s": round(replays_s),
        "tuning_s": round(tuning_s),
        "device_minutes": round((blocks * args.engine_start_s + replays_s + tuning_s) / 60.0, 1),
        "commands_of_deadline": math.ceil(
            (blocks * args.engine_start_s + replays_s + tuning_s) / max(1.0, args.deadline_s)
        ),
    }
    return plan


def _covers(plan: Mapping[str, Any] | None, args: argparse.Namespace) -> bool:
    """Whether a kept plan has every shape and trace this command asks for."""
    if not plan or plan.get("hardware", "h200") != args.hardware:
        return False
    shapes = plan.get("shapes", {})
    return all(s in shapes and all(t in shapes[s]["traces"] for t in args.traces) for s in args.shapes)


def _merge(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A new plan that keeps the kept plan's entries (blocks measured under them keep their loads)."""
    if not old or old.get("hardware", "h200") != new["hardware"]:
        return new  # a plan for another GPU: its loads and tables do not apply here
    merged = json.loads(json.dumps(new))
    for shape, entry in old.get("shapes", {}).items():
        target = merged["shapes"].setdefault(shape, entry)
        target["traces"].update(entry["traces"])
    return merged


def replay_requests(rate_rps: float, duration_s: float) -> int:
    return max(16, min(MAX_BLOCK_REQUESTS, math.ceil(rate_rps * duration_s)))


def validate_plan(plan: Mapping[str, Any]) -> None:
    """The arms' flags through vLLM's own parser (needs vLLM importable here; nothing starts)."""
    from serving.engine.config import validate_args

    for arm, spec in plan["arms"].items():
        try:
            validate_args(spec["args"])
        except ValueError as exc:
            raise SystemExit(f"arm {arm}: {exc}") from exc


# -- on the GPU ----------------------------------------------------------------------------------


def vllm_file_name(table: moe_tables.TableShape) -> str | None:
    """The file name this host's vLLM looks for (None where vLLM cannot say, e.g. no GPU)."""
    try:
        from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

        return str(get_config_file_name(table.num_experts, table.shard_intermediate_size, None))
    except Exception as exc:  # an older vLLM's signature, or no CUDA platform
        log(f"vLLM's get_config_file_name unavailable: {exc}")
        return None


_USED = re.compile(r"Using configuration from (\S+) for MoE layer")
_DEFAULT = re.compile(r"Using default MoE config")


def table_used(log_path: Path) -> str:
    """What the engine's log says its MoE layers read: a table's path, or "default"."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    used = _USED.findall(text)
    if used:
        return used[-1]
    return "default (vLLM's generic heuristic)" if _DEFAULT.search(text) else "unknown (no MoE log line)"


def tune_step(
    args: argparse.Namespace,
    key: str,
    planned: moe_step.TablePlan,
    folder: Path,
    state: dict[str, Any],
    clock: Clock,
) -> dict[str, Any] | None:
    if key in state:
        record = dict(state[key])
        if record.get("table") and not (folder / planned.table.file_name).exists():
            # A resumed run on a fresh machine: the state came back, the tables folder did not.
            moe_tables.write_table(folder, planned.table, {int(k): v for k, v in record["table"].items()})
            if record.get("vllm_file_name") and record["vllm_file_name"] != planned.table.file_name:
                shutil.copy(folder / planned.table.file_name, folder / record["vllm_file_name"])
        return record
    if not clock.fits(planned.estimate_s + 30):
        return None
    started = time.monotonic()
    bench, check, timed, engine_config_at = moe_step.vllm_bench(
        planned.layer, seed=args.seed, rep_ms=args.rep_ms, log=log
    )
    vllm_name = vllm_file_name(planned.table)
    path, result = moe_step.run_tables(
        planned,
        bench,
        folder,
        check=check,
        should_stop=lambda: clock.left() < 30,
        log=log,
        baseline=engine_config_at,
    )
    if path is not None and vllm_name and vllm_name != path.name:
        # Write it where this vLLM looks; ours mirrors vLLM 0.32's naming.
        shutil.copy(path, folder / vllm_name)
    record = {
        "timed": timed,
        "table": {str(k): v for k, v in result.table().items()},
        "file": None if path is None else str(path),
        "vllm_file_name": vllm_name,
        "seconds": round(time.monotonic() - started, 1),
        **result.to_dict(),
    }
    state[key] = record
    return record


def run_block(
    args: argparse.Namespace,
    shape: str,
    trace_name: str,
    arm: str,
    round_: int,
    loads: Mapping[str, float],
    tables: Path | None,
) -> dict[str, Any]:
    """One fresh engine of `arm`, replaying the trace at each load; the engine's log says which table it read."""
    from benchmarks._engine import steady_decode_tpots
    from serving.engine.launcher import start_engine
    from serving.loadgen.api import replay_trace
    from tuning.search.trial import warm_up

    config = engine_config(args)
    if tables is not None:
        config = moe_tables.with_tables(config, str(tables))
    log_path = args.work / "logs" / f"{shape}-{trace_name}-{arm}-r{round_}.log"
    trace = TRACES_DIR / TRACES[trace_name]
    rate = trace_rate_rps(trace, args.sim_requests)
    started = time.monotonic()
    replays = {}
    with start_engine(
        model=str(args.work / "models" / shape), config=config, startup_timeout_s=1200, log_path=log_path
    ) as engine:
        ready_s = time.monotonic() - started

        def replay_at(scale: float, duration_s: float, seed: int) -> Any:
            return replay_trace(
                endpoint=engine.base_url,
                trace=trace,
                rate_scale=scale,
                max_requests=replay_requests(rate * scale, duration_s),
                max_prompt_tokens=args.max_prompt_tokens,
                max_output_tokens=args.max_output_tokens,
                seed=seed,
                progress=False,
            )

        warm_up(engine.base_url, seed=round_ + MAX_WARMUP_ROUNDS)  # warm-up rounds are negative
        if args.warm_replay_s > 0:
            # The trace at the highest load with prompts of its own, not measured: the prefill
            # sizes the engine did not capture at start compile their Triton kernels here (the
            # first engine of a table's arm would otherwise pay it inside the measurement).
            replay_at(max(loads.values()), args.warm_replay_s, 7_000_000 + 1000 * round_)
        steady = {}
        for batch in args.steady_batches:
            # Steady decode: `batch` requests sent at once, short prompts, outputs of a fixed
            # length: after the first token every step is a decode step of `batch` sequences,
            # so TPOT is the step time at that batch (the MoE call at `batch` tokens inside it).
            tpots = steady_decode_tpots(
                engine.base_url,
                batch=batch,
                bursts=args.steady_bursts,
                prompt_tokens=args.steady_prompt_tokens,
                output_tokens=args.steady_output_tokens,
                seed=9_000_000 + 1000 * round_ + 10 * batch,
            )
            steady[str(batch)] = {
                "tpot_ms": tpots,
                "tpot_p50_ms": float(np.median(tpots)) if tpots else None,
                "bursts": args.steady_bursts,
            }
            if tpots:
                log(f"[{shape} {arm} r{round_}] steady decode at {batch}: TPOT p50 {np.median(tpots):.3f} ms")
        for i, (load, scale) in enumerate(loads.items()):
            # The three arms of a round replay the same prompts (fresh engines: no cache carries
            # over); every round and load has its own.
            seed = 100_000 * (list(TRACES).index(trace_name) + 1) + 1000 * round_ + i
            result = replay_at(scale, args.duration_s, seed)
            s = result.summary
            replays[load] = {
                "rate_scale": scale,
                "seed": seed,
                "requests": s.num_requests,
                "errors": s.num_errors,
                "ttft_ms": [round(r.ttft_ms, 3) for r in result.requests if r.ttft_ms is not None],
                "tpot_p50_ms": s.tpot_ms.p50,
                "ttft_p95_ms": s.ttft_ms.p95,
            }
            log(
                f"[{shape} {trace_name} {arm} r{round_}] {load}: TTFT p95 {s.ttft_ms.p95:,.0f} ms, "
                f"TPOT p50 {s.tpot_ms.p50:.2f} ms, {s.num_errors} errors"
            )
    return {
        "shape": shape,
        "trace": trace_name,
        "arm": arm,
        "round": round_,
        "engine_ready_s": round(ready_s, 1),
        "seconds": round(time.monotonic() - started, 1),
        "table_used": table_used(log_path),
        "steady": steady,
        "replays": replays,
    }


def _block(block: Mapping[str, Any], sample_ms: Sequence[float], tpot_p50_ms: float) -> Block:
    """One served block as `tuning.search.confirm`'s Block: `sample_ms` is the per-request sample
    its pooled percentiles are taken of (TTFTs of a replay, TPOTs of steady decode)."""
    return Block(
        subject=block["arm"],
        round=block["round"],
        trial=0,
        ttft_ms=tuple(sample_ms),
        tpot_p50_ms=float(tpot_p50_ms),
        sustainable_multiple=1.0,
        slo_met=True,
        gates_passed=True,
        contended=False,
    )


def steady_figures(blocks: Sequence[Mapping[str, Any]], seed: int) -> dict[str, Any]:
    """Per steady-decode batch size: the traffic (and uniform) arm's TPOT p50 over the default's,
    with the 95% interval of `tuning.search.confirm.ratio` (its TTFT slot carries each block's
    per-request TPOTs here: blocks resampled, then requests, widened to the Welch t interval
    over blocks)."""
    out: dict[str, Any] = {}
    batches = sorted({int(k) for b in blocks for k in (b.get("steady") or {})})
    rng = np.random.default_rng(seed)
    for batch in batches:
        by_arm: dict[str, list[Block]] = {a: [] for a in ARMS}
        for b in blocks:
            rec = (b.get("steady") or {}).get(str(batch))
            if b["round"] < 0 or not rec or not rec["tpot_ms"]:
                continue
            by_arm[b["arm"]].append(_block(b, rec["tpot_ms"], rec["tpot_p50_ms"]))
        fig: dict[str, Any] = {"blocks": {a: len(v) for a, v in by_arm.items()}}
        for arm in by_arm:
            if by_arm[arm]:
                fig[f"{arm}_tpot_p50_ms"] = round(
                    float(np.median([v for bl in by_arm[arm] for v in bl.ttft_ms])), 3
                )
        for name, cand in (
            ("tpot_ratio_vs_default", "traffic"),
            ("uniform_tpot_ratio_vs_default", "uniform"),
        ):
            if by_arm[cand] and by_arm["default"]:
                fig[name] = ratio(by_arm[cand], by_arm["default"], rng)["ttft_p50_ms"].to_dict()
        out[str(batch)] = fig
    return out


def figures(blocks: Sequence[Mapping[str, Any]], load: str, seed: int) -> dict[str, Any]:
    """The three ratios (with 95% intervals) at one load, from the blocks measured so far."""
    by_arm: dict[str, list[Block]] = {a: [] for a in ARMS}
    errors = {a: 0 for a in ARMS}
    for b in blocks:
        if b["round"] < 0:  # a warm-up round: served to fill the compile caches, not measured
            continue
        rep = b["replays"].get(load)
        if rep:
            errors[b["arm"]] += int(rep["errors"])
        # A block with failed requests measured something else than latency: left out, counted.
        if not rep or not rep["ttft_ms"] or rep["errors"]:
            continue
        by_arm[b["arm"]].append(_block(b, rep["ttft_ms"], rep["tpot_p50_ms"]))
    out: dict[str, Any] = {"blocks": {a: len(v) for a, v in by_arm.items()}, "errors": errors}
    rng = np.random.default_rng(seed)
    pairs = (
        ("tpot_ratio_vs_default", "traffic", "default", "tpot_p50_ms"),
        ("ttft_p95_ratio_vs_default", "traffic", "default", "ttft_p95_ms"),
        ("tpot_ratio_vs_uniform_tuned", "traffic", "uniform", "tpot_p50_ms"),
        ("uniform_tpot_ratio_vs_default", "uniform", "default", "tpot_p50_ms"),
    )
    for name, cand, base, fig in pairs:
        if by_arm[cand] and by_arm[base]:
            out[name] = ratio(by_arm[cand], by_arm[base], rng)[fig].to_dict()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {', '.join(TRACES)}")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated, of {', '.join(ARMS)} (default and traffic are the target's pair)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of the three arms (>= 3 for intervals)"
    )
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="rounds of every arm served first and left out of the figures (compile caches)",
    )
    parser.add_argument("--load-fractions", default="0.4,0.8", help="of the simulated saturation rate")
    parser.add_argument(
        "--warm-replay-s", type=float, default=10.0, help="unmeasured trace replay first in every block"
    )
    parser.add_argument(
        "--steady-batches", default="1,16,64,256", help="steady-decode batch sizes measured in every block"
    )
    parser.add_argument("--steady-bursts", type=int, default=2, help="bursts per steady-decode batch size")
    parser.add_argument("--steady-prompt-tokens", type=int, default=128)
    parser.add_argument("--steady-output-tokens", type=int, default=128)
    parser.add_argument("--saturation-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--duration-s", type=float, default=40.0, help="of one replay at one load")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--max-prompt-tokens", type=int, default=8192)
    parser.add_argument("--max-output-tokens", type=int, default=512)
    parser.add_argument("--sim-requests", type=int, default=400, help="trace requests the simulator replays")
    parser.add_argument(
        "--sim-window-s", type=float, default=30.0, help="arrival window of a saturation probe"
    )
    parser.add_argument("--tune-trials", type=int, default=216, help="timed candidates per table (both arms)")
    parser.add_argument("--pool-size", type=int, default=96, help="candidate configurations to draw from")
    parser.add_argument("--min-per-bucket", type=int, default=4)
    parser.add_argument(
        "--max-points", type=int, default=2, help="token counts a traffic bucket's candidates are timed at"
    )
    parser.add_argument(
        "--tune-budget-s", type=float, default=420.0, help="refuse a table that would take longer"
    )
    parser.add_argument("--seconds-per-timing", type=float, default=0.4, help="estimate, compile included")
    parser.add_argument("--rep-ms", type=int, default=25)
    parser.add_argument("--engine-start-s", type=float, default=180.0, help="estimate for a cold start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hardware",
        choices=["auto", *USABLE_MEMORY_GIB],
        default="auto",
        help="GPU the loads are simulated for (auto: the one torch sees; h200 in a dry run)",
    )
    parser.add_argument(
        "--tokenizer-from", type=Path, help="folder with tokenizer.json (required on the GPU)"
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tailguard-kernels-e2e")
    parser.add_argument("--state", type=Path, help="default: WORK/state.json")
    parser.add_argument(
        "--deadline-s", type=float, default=540.0, help="stop before a step that would not fit"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "kernels_e2e.json")
    parser.add_argument("--dry-run", action="store_true", help="check the plan on a CPU; start nothing")
    parser.add_argument(
        "--plan-out", type=Path, help="dry run: where the plan goes (default: WORK/plan.json)"
    )
    parser.add_argument(
        "--no-validate", action="store_true", help="dry run: skip vLLM's parser (slow import)"
    )
    args = parser.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.traces = [t for t in args.traces.split(",") if t]
    arms = [a for a in args.arms.split(",") if a]
    for kind, names, known in (
        ("shape", args.shapes, SHAPES),
        ("trace", args.traces, TRACES),
        ("arm", arms, ARMS),
    ):
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            parser.error(f"unknown or no {kind}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if "default" not in arms or len(arms) < 2:
        parser.error("--arms must hold 'default' and at least one tuned arm (the ratios are against it)")
    args.arms = tuple(a for a in ARMS if a in arms)  # in ARMS' order
    if not 1 <= args.repeats <= MAX_REPEATS:
        parser.error(f"--repeats must be in [1, {MAX_REPEATS}]")
    if not 0 <= args.warmup_rounds <= MAX_WARMUP_ROUNDS:
        parser.error(f"--warmup-rounds must be in [0, {MAX_WARMUP_ROUNDS}]")
    if not 1 <= args.duration_s <= 600:
        parser.error("--duration-s must be in [1, 600]")
    if not 0 <= args.warm_replay_s <= 120:
        parser.error("--warm-replay-s must be in [0, 120]")
    try:
        args.steady_batches = [int(b) for b in args.steady_batches.split(",") if b]
    except ValueError:
        parser.error("--steady-batches must be comma-separated integers")
    if len(args.steady_batches) > MAX_STEADY_BATCHES or not all(
        1 <= b <= MAX_STEADY_BATCH for b in args.steady_batches
    ):
        parser.error(f"--steady-batches: at most {MAX_STEADY_BATCHES} sizes, each in [1, {MAX_STEADY_BATCH}]")
    if not 1 <= args.steady_bursts <= 5:
        parser.error("--steady-bursts must be in [1, 5]")
    for name in ("steady_prompt_tokens", "steady_output_tokens"):
        if not 2 <= getattr(args, name) <= 2048:
            parser.error(f"--{name.replace('_', '-')} must be in [2, 2048]")
    args.state = args.state or args.work / "state.json"
    if args.hardware == "auto":
        if args.dry_run:
            args.hardware = "h200"
        else:
            import torch

            if not torch.cuda.is_available():
                parser.error("needs a CUDA GPU (use --dry-run to check the plan here)")
            try:
                args.hardware = hardware_of(torch.cuda.get_device_name())
            except ValueError as exc:
                parser.error(str(exc))

    # The plan (simulated loads and step distributions) is made once and kept in the state, so a
    # resumed run measures against the same loads and spends no device time re-simulating.
    state = {} if args.dry_run else load_state(args.state, stamp=git_state(REPO))
    try:
        plan = (
            state["plan"] if _covers(state.get("plan"), args) else _merge(state.get("plan"), build_plan(args))
        )
    except (moe_step.NotTunable, moe_tuning.TuningWontFit, ValueError) as exc:
        print(f"kernels_e2e: the plan is refused: {exc}", file=sys.stderr)
        return 2
    for shape in args.shapes:
        write_model(shape, args.work / "models" / shape, args.tokenizer_from)
    if args.dry_run:
        if not args.no_validate:
            validate_plan(plan)
        plan["validated_flags"] = not args.no_validate
        out = args.plan_out or args.work / "plan.json"
        save_state(out, plan)
        est = plan["estimate"]
        print(
            f"plan OK: {est['blocks']} engine blocks, ~{est['device_minutes']} device minutes "
            f"(~{est['commands_of_deadline']} commands of {args.deadline_s:.0f} s); written to {out}"
        )
        for shape, s in plan["shapes"].items():
            print(f"  {shape}: {s['table_file_name']} shipped by vLLM: {s['vllm_ships_table']}")
        return 0
    state["plan"] = plan
    return run(args, plan, state)


def run(args: argparse.Namespace, plan: dict[str, Any], state: dict[str, Any]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("kernels_e2e: needs a CUDA GPU (use --dry-run to check the plan here)", file=sys.stderr)
        return 2
    if args.tokenizer_from is None:
        print("kernels_e2e: --tokenizer-from is required to serve", file=sys.stderr)
        return 2
    clock = Clock(args.deadline_s)
    state.setdefault("device_seconds", 0.0)
    state.setdefault("blocks", [])
    if "in_flight" in state:  # an earlier command ended (at the tool's limit) inside this block
        state.setdefault("lost_blocks", []).append(state.pop("in_flight"))
    counted_until = time.monotonic()

    def keep_state() -> None:
        # Device time is counted into the state at every save, so a command killed at the tool's
        # limit loses only the time since its last step (and the block in flight says so).
        nonlocal counted_until
        now = time.monotonic()
        state["device_seconds"] += now - counted_until
        counted_until = now
        save_state(args.state, state)

    config = engine_config(args)

    def write(complete: bool) -> None:
        spent = state["device_seconds"] + (time.monotonic() - counted_until)
        cases: dict[str, Any] = {}
        for shape in args.shapes:
            for trace in args.traces:
                blocks = [b for b in state["blocks"] if b["shape"] == shape and b["trace"] == trace]
                tables = {k: state.get(f"tune-{shape}-{k}") for k in ("uniform", f"traffic-{trace}")}
                if not blocks:
                    if any(tables.values()):  # tuned, not yet served: the kernel-level figures stand
                        cases[f"{shape}/{trace}"] = {
                            "figures": {},
                            "tables_used": [],
                            "tables": tables,
                            "blocks": [],
                        }
                    continue
                loads = plan["shapes"][shape]["traces"][trace]["loads"]
                per_load = {load: figures(blocks, load, args.seed) for load in loads}
                unshipped = plan["shapes"][shape]["vllm_ships_table"] is False
                for f in per_load.values():
                    r = f.get("tpot_ratio_vs_default") or {}
                    if unshipped and r.get("value") is not None and r.get("ci_high") is not None:
                        f["target_met"] = r["value"] <= 0.9 and r["ci_high"] < 1.0
                cases[f"{shape}/{trace}"] = {
                    "figures": per_load,
                    "steady_decode": steady_figures(blocks, args.seed),
                    "tables_used": sorted({f"{b['arm']}: {b['table_used']}" for b in blocks}),
                    "tables": tables,
                    "blocks": blocks,
                }
        result = {
            "benchmark": "kernels_e2e",
            "written_by": "benchmarks/kernels_e2e.py",
            "command": " ".join(["python", *sys.argv]),
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "complete": complete,
            **git_state(REPO),  # commit and dirty flag at the top level
            "machine": machine_facts(),
            "versions": versions("vllm", "torch", "triton", "numpy", "transformers"),
            "weights": "random (vLLM --load-format dummy): real shapes and timings",
            "method": {
                "arms": list(args.arms),
                "repeats": args.repeats,
                "duration_s": args.duration_s,
                "tune_trials": args.tune_trials,
                "interval": "95%, two-level bootstrap over blocks and requests (tuning.search.confirm.ratio)",
                "warm_replay_s": args.warm_replay_s,
                "steady_decode": {
                    "batches": args.steady_batches,
                    "bursts": args.steady_bursts,
                    "prompt_tokens": args.steady_prompt_tokens,
                    "output_tokens": args.steady_output_tokens,
                    "what": "batch requests sent at once, ignore_eos: TPOT is the decode step time at that batch",
                },
                "target": "shape without a shipped table: tpot_ratio_vs_default <= 0.9 with ci_high < 1.0",
            },
            "plan": {k: v for k, v in plan.items() if k != "arms"},
            "device_minutes": round(spent / 60.0, 1),
            # Blocks started by a command that ended before they finished (their time is not in
            # device_minutes): served, never measured.
            "lost_blocks": state.get("lost_blocks", []),
            "cases": cases,
        }
        save_state(args.out, result)

    complete = True
    for shape in args.shapes:
        spec = model_spec(shape)
        tables_root = args.work / "tables"
        # Tables first: the uniform one, then one per trace, each in its own folder.
        uniform_plan = moe_step.plan_tables(
            model=spec,
            config=config,
            gpu_name=torch.cuda.get_device_name(),
            sample=None,
            budget=args.tune_trials,
            time_budget_s=args.tune_budget_s,
            seconds_per_timing=args.seconds_per_timing,
            pool_size=args.pool_size,
            device_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
            min_per_bucket=max(1, args.tune_trials // len(moe_tables.BATCH_SIZE_KEYS)),
        )
        folders = {"uniform": tables_root / "uniform" / shape}
        if "uniform" in args.arms:
            if (
                tune_step(args, f"tune-{shape}-uniform", uniform_plan, folders["uniform"], state, clock)
                is None
            ):
                complete = False
                break
            keep_state()
            write(False)
        for trace in args.traces:
            loads = plan["shapes"][shape]["traces"][trace]["loads"]
            # The same plan as the dry run's (same simulations, same seed), made here again
            # because it carries the candidates; a few seconds of CPU.
            samples = [
                moe_step.step_sample(
                    TRACES_DIR / TRACES[trace],
                    model=spec,
                    hardware=args.hardware,
                    config=config,
                    rate_scale=scale,
                    max_requests=args.sim_requests,
                    max_prompt_tokens=args.max_prompt_tokens,
                    max_output_tokens=args.max_output_tokens,
                )
                for scale in loads.values()
            ]
            traffic_plan = moe_step.plan_tables(
                model=spec,
                config=config,
                gpu_name=torch.cuda.get_device_name(),
                sample=merged_steps(samples),
                budget=args.tune_trials,
                time_budget_s=args.tune_budget_s,
                seconds_per_timing=args.seconds_per_timing,
                pool_size=args.pool_size,
                min_per_bucket=args.min_per_bucket,
                max_points=args.max_points,
                device_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
            )
            folder = tables_root / f"traffic-{trace}" / shape
            if tune_step(args, f"tune-{shape}-traffic-{trace}", traffic_plan, folder, state, clock) is None:
                complete = False
                break
            keep_state()
            write(False)
            arm_tables = {"default": None, "uniform": folders["uniform"], "traffic": folder}
            done = {
                (b["arm"], b["round"]) for b in state["blocks"] if b["shape"] == shape and b["trace"] == trace
            }
            measured = [b["seconds"] for b in state["blocks"]]
            # The longest block so far: the first engine on a machine compiles and loads cold
            # (run 9: 3.5 minutes for a 57 GiB model on an H100, --engine-start-s said 2).
            estimate = (
                (max(measured) + 30)
                if measured
                else args.engine_start_s
                + 2.5 * args.duration_s * len(loads)
                + 1.5 * args.warm_replay_s
                + len(args.steady_batches) * args.steady_bursts * (0.02 * args.steady_output_tokens + 1.0)
            )
            # Warm-up rounds are numbered below zero: kept in the state and the result, never in
            # the figures.
            for round_ in range(-args.warmup_rounds, args.repeats):
                n = len(args.arms)
                arms = args.arms[round_ % n :] + args.arms[: round_ % n]  # rotated: no arm always first
                for arm in arms:
                    if (arm, round_) in done:
                        continue
                    if not clock.fits(estimate):
                        complete = False
                        break
                    state["in_flight"] = {"shape": shape, "trace": trace, "arm": arm, "round": round_}
                    keep_state()
                    block = run_block(args, shape, trace, arm, round_, loads, arm_tables[arm])
                    state["blocks"].append(block)
                    state.pop("in_flight")
                    keep_state()
                    write(False)
                if not complete:
                    break
            if not complete:
                break
        if not complete:
            break
    # The result counts this command's time once: written before the state takes it in.
    write(complete)
    keep_state()
    log(f"{'complete' if complete else 'partial (run the same command again to resume)'}: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
