"""The job step that tunes an endpoint's fused-MoE tables for its traffic.

From a traffic sample and the serving configuration chosen for it: the simulator replays the
sample (`serving.sim`) and yields the tokens of every engine step with the time it took; the
steps are grouped by the batch-size key vLLM's fused-MoE table would use for them
(`serving.engine.moe_tables`); the tuner (`kernels.moe_tuning`) spends its trials where the
traffic spends its time, timing each candidate at the token counts that occur; the winners are
written as vLLM's own table file, for the folder `VLLM_TUNED_CONFIG_FOLDER` names.

It lives here because it puts `serving` and `kernels` together, which only the layer above both
may do. Refusals come before any device time is spent: a model that is not MoE, a quantised
model (the candidates are bf16 tiles), a run that would not fit its time or memory budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels import moe_tuning
from serving.catalog.hardware import Hardware
from serving.catalog.models import ModelSpec, get_model
from serving.engine import moe_tables
from serving.engine.config import EngineConfig
from serving.loadgen.traces import TraceRequest
from serving.sim.api import simulate_trace


class NotTunable(ValueError):
    """This endpoint has no fused-MoE table to tune; the engine keeps its defaults (the message says why)."""


@dataclass(frozen=True)
class StepSample:
    """What the traffic makes the engine run, per step (from the simulator)."""

    step_tokens: Mapping[int, tuple[int, float]] = field(repr=False)  # tokens -> (steps, seconds)
    num_requests: int
    busy_s: float  # simulated engine time in steps
    rate_scale: float


def step_sample(
    trace: Path | Sequence[TraceRequest],
    *,
    model: str | ModelSpec,
    hardware: str | Hardware,
    config: EngineConfig,
    rate_scale: float = 1.0,
    max_requests: int | None = 2000,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    seed: int = 0,
) -> StepSample:
    """The tokens-per-step distribution of replaying `trace` under `config` (simulated, no engine)."""
    if max_requests is not None and not 1 <= max_requests <= 100_000:
        raise ValueError(f"max_requests must be in [1, 100000], got {max_requests}")
    result = simulate_trace(
        trace,
        model=model,
        hardware=hardware,
        config=config,
        rate_scale=rate_scale,
        max_requests=max_requests,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        seed=seed,
    )
    if not result.step_tokens:
        raise NotTunable("the simulated replay ran no engine step (every request was refused?)")
    return StepSample(dict(result.step_tokens), len(result.requests), result.busy_s, rate_scale)


def layer_shape(model: str | ModelSpec, config: EngineConfig) -> moe_tuning.MoEShape:
    """The fused-MoE kernel's shape on one device of this deployment, or `NotTunable`."""
    spec = get_model(model) if isinstance(model, str) else model
    if not spec.is_moe:
        raise NotTunable(f"{spec.name} is not a mixture-of-experts model: it has no fused-MoE table")
    if config.quantization:
        raise NotTunable(
            f"quantization {config.quantization!r}: the tuner's candidates are bf16/fp16 tiles, "
            "so this endpoint keeps vLLM's tables for quantised weights"
        )
    if config.dtype not in ("auto", "bfloat16", "float16", "half"):
        raise NotTunable(f"dtype {config.dtype!r}: only bf16/fp16 MoE layers are tuned")
    tp = config.tensor_parallel_size
    if spec.moe_intermediate_size % tp:
        raise NotTunable(
            f"{spec.name}'s expert width {spec.moe_intermediate_size} does not split over tensor_parallel_size {tp}"
        )
    return moe_tuning.MoEShape(
        num_experts=spec.num_experts,
        shard_intermediate_size=spec.moe_intermediate_size // tp,
        hidden_size=spec.hidden_size,
        top_k=spec.num_experts_per_token,
    )


@dataclass(frozen=True)
class TablePlan:
    """Everything decided before device time is spent."""

    table: moe_tables.TableShape
    layer: moe_tuning.MoEShape
    plan: moe_tuning.Plan
    estimate_s: float
    mode: str  # "traffic" or "uniform"
    buckets: tuple[moe_tables.Bucket, ...] = ()  # the traffic's buckets (traffic mode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file_name": self.table.file_name,
            "mode": self.mode,
            "layer": vars(self.layer),
            "estimate_s": round(self.estimate_s, 1),
            **self.plan.to_dict(),
            "steps": sum(b.steps for b in self.buckets),
        }


def plan_tables(
    *,
    model: str | ModelSpec,
    config: EngineConfig,
    gpu_name: str,
    sample: StepSample | None,
    budget: int,
    time_budget_s: float,
    seconds_per_timing: float = 0.05,
    device_memory_bytes: int | None = None,
    pool_size: int = 400,
    min_per_bucket: int = 4,
    max_points: int = 4,
) -> TablePlan:
    """Plan a table: traffic-weighted from `sample`, or vLLM's uniform grid when `sample` is None."""
    layer = layer_shape(model, config)
    table = moe_tables.shape_for(
        num_experts=layer.num_experts,
        moe_intermediate_size=layer.shard_intermediate_size * config.tensor_parallel_size,
        tensor_parallel_size=config.tensor_parallel_size,
        gpu_name=gpu_name,
    )
    pool = moe_tuning.candidate_pool(pool_size)
    if sample is None:
        buckets: tuple[moe_tables.Bucket, ...] = ()
        tune_buckets = moe_tuning.uniform_buckets(moe_tables.BATCH_SIZE_KEYS)
        mode = "uniform"
    else:
        buckets = tuple(moe_tables.bucket_steps(sample.step_tokens, max_points=max_points))
        tune_buckets = moe_tuning.traffic_buckets(buckets)
        mode = "traffic"
    plan = moe_tuning.plan(tune_buckets, pool, budget=budget, min_per_bucket=min_per_bucket, shape=layer)
    estimate = moe_tuning.check_fits(
        plan,
        layer,
        seconds_per_timing=seconds_per_timing,
        time_budget_s=time_budget_s,
        device_memory_bytes=device_memory_bytes,
    )
    return TablePlan(table, layer, plan, estimate, mode, buckets)


def run_tables(
    planned: TablePlan,
    bench: moe_tuning.Bench,
    out_folder: Path,
    *,
    check: moe_tuning.Check | None = None,
    should_stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
    baseline: moe_tuning.Baseline | None = None,
) -> tuple[Path | None, moe_tuning.TuneResult]:
    """Tune and write the table into `out_folder`; (path, result). No file when nothing worked.
    With `baseline` (the engine's own configuration per token count) the result records the
    table's kernel-level speedup over the engine, and no entry is slower than the engine's."""
    result = moe_tuning.tune(
        planned.plan, bench, check=check, should_stop=should_stop, log=log, baseline=baseline
    )
    table = result.table()
    if not table:
        return None, result
    return moe_tables.write_table(out_folder, planned.table, table), result
