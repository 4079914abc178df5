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

import contextlib
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


# -- on the GPU: vLLM's own kernel, timed as the engine runs it ------------------------------


_VLLM_CONTEXT = contextlib.ExitStack()  # held for the process: vLLM's current config, where needed
_PROBE_CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def vllm_bench(
    layer: moe_tuning.MoEShape,
    *,
    seed: int = 0,
    rep_ms: int = 25,
    log: Callable[[str], None] = print,
) -> tuple[moe_tuning.Bench, moe_tuning.Check, str, moe_tuning.Baseline | None]:
    """(bench, check, what is timed, the engine's own configuration per token count): vLLM's
    fused-MoE kernel with a forced configuration; the last is None where vLLM cannot say."""
    import torch

    from kernels.tune import bench_us

    try:
        from vllm.model_executor.layers.fused_moe import override_config
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
    except ImportError as exc:
        log(f"vLLM's fused_experts/override_config not importable ({exc}); timing kernels.moe_gemm")
        return (
            moe_tuning.moe_gemm_bench(layer, seed=seed, rep_ms=rep_ms),
            moe_tuning.moe_gemm_check(layer, device="cuda", seed=seed),
            "kernels.moe_gemm",
            None,
        )
    with contextlib.suppress(Exception):  # some vLLM versions read the current config inside the op
        from vllm.config import VllmConfig, set_current_vllm_config

        _VLLM_CONTEXT.enter_context(set_current_vllm_config(VllmConfig()))
    e, n, k, top_k = layer.num_experts, layer.shard_intermediate_size, layer.hidden_size, layer.top_k
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w1 = torch.randn(e, 2 * n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * k**-0.5
    w2 = torch.randn(e, k, n, generator=gen, device="cuda", dtype=torch.bfloat16) * n**-0.5
    inputs: dict[int, tuple[Any, Any, Any]] = {}

    def inp(tokens: int) -> tuple[Any, Any, Any]:
        if tokens not in inputs:
            x = torch.randn(tokens, k, generator=gen, device="cuda", dtype=torch.bfloat16)
            scores = torch.rand(tokens, e, generator=gen, device="cuda")
            w, ids = scores.topk(top_k, dim=1)
            inputs[tokens] = (x, (w / w.sum(dim=1, keepdim=True)).float(), ids.to(torch.int32))
        return inputs[tokens]

    import vllm.model_executor.layers.fused_moe as vllm_fused_moe

    @contextlib.contextmanager
    def configured(cfg: Mapping[str, int] | None) -> Any:
        # vLLM's override_config puts the previous configuration back only when its block exits
        # cleanly: a candidate that fails inside it (out of shared memory, say) would stay in
        # force for every later call, vLLM's own choice included. So it is put back here.
        before = vllm_fused_moe.get_config()
        try:
            with override_config(None if cfg is None else dict(cfg)):
                yield
        finally:
            vllm_fused_moe._config = before

    def run(cfg: Mapping[str, int], tokens: int) -> Any:
        x, w, ids = inp(tokens)
        with configured(cfg):
            return fused_experts(x, w1, w2, w, ids)

    def reference(tokens: int) -> Any:
        x, w, ids = inp(tokens)
        out = torch.zeros(tokens, k, device="cuda", dtype=torch.float32)
        for expert in range(e):
            tok, slot = torch.nonzero(ids == expert, as_tuple=True)
            if tok.numel():
                h = x[tok].float() @ w1[expert].float().T
                act = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
                out.index_add_(0, tok, (act @ w2[expert].float().T) * w[tok, slot, None])
        return out

    refs: dict[int, Any] = {}

    def check(cfg: Mapping[str, int], tokens: int) -> None:
        t = min(tokens, 256)  # a failing configuration fails at any size; the reference is slow
        if t not in refs:
            refs[t] = reference(t)
        out = run(cfg, t).float()
        err = float((out - refs[t]).norm() / refs[t].norm().clamp(min=1e-30))
        if not err < 3e-2:
            raise ValueError(f"relative error {err:.3g} against the reference")

    # The engine replays the op inside its CUDA graphs (decode steps up to the largest captured
    # size; piecewise graphs around attention beyond): timed the same way, every size. Run 6's
    # tables were timed with a 0.2 ms probe deciding, and fused_experts' Python path alone is
    # longer: its small buckets timed that path (1 token: 168-302 us for a kernel that streams
    # 75 MB of expert weights, ~20 us at the copy rate), and their winners were noise.
    in_graph = True

    def bench(cfg: Mapping[str, int], tokens: int) -> float:
        return bench_us(lambda: run(cfg, tokens), rep_ms=rep_ms, graph=True, always_graph=in_graph)

    try:  # one known-good configuration: if vLLM's op cannot be called here, say so and time ours
        check(_PROBE_CONFIG, 8)
        try:
            bench(_PROBE_CONFIG, 8)
        except Exception as exc:  # the op cannot be captured here: plain timing, and the result says so
            log(f"vLLM's fused_experts could not be captured in a CUDA graph ({exc}); timing it plainly")
            in_graph = False
    except Exception as exc:
        log(f"vLLM's fused_experts failed on a plain configuration ({exc}); timing kernels.moe_gemm")
        return (
            moe_tuning.moe_gemm_bench(layer, seed=seed, rep_ms=rep_ms),
            moe_tuning.moe_gemm_check(layer, device="cuda", seed=seed),
            f"kernels.moe_gemm (vLLM's fused_experts failed: {str(exc)[:200]})",
            None,
        )
    engine_config_at: moe_tuning.Baseline | None = None
    try:  # what vLLM itself runs at a token count without our table (its own table or default)
        from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

        def engine_config_at(tokens: int) -> Mapping[str, int]:
            with configured(None):  # no override in force: the engine's own table or default
                return dict(try_get_optimal_moe_config(tuple(w1.shape), tuple(w2.shape), top_k, None, tokens))

        engine_config_at(8)
    except Exception as exc:
        log(f"vLLM's own configuration choice is not callable here ({exc}): tuned without a baseline")
        engine_config_at = None
    timed = "vllm fused_experts (override_config), " + (
        "CUDA-graph replays at every size" if in_graph else "plain timing (CUDA-graph capture failed)"
    )
    return bench, check, timed, engine_config_at
