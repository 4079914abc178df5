"""The search space: every engine knob that can move TTFT or cost, with its constraints.

The space is data: `SearchSpace.describe()` prints it, `to_dict()` serialises it, and
`violations(assignment)` says why a point is not allowed (KV cache must fit, tensor parallel
within the devices, speculative decoding only where its method applies, ...).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serving.catalog.hardware import local_region_code
from serving.engine.config import CPU_BIND_ENV, EngineConfig

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "auto": 2}


class ModelLoadError(ValueError):
    """A model directory that cannot be served; the message says what is missing."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    checkpoint_dtype: str  # what the checkpoint says (vLLM's "auto")
    num_params: int  # estimated from the shapes

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _BYTES.get(kv_dtype, 2)


def model_info(path: str | Path, *, require_weights: bool = True) -> ModelInfo:
    """Read a Hugging Face style model directory (config.json + tokenizer) without loading weights.

    `require_weights=False` accepts a directory without weight files: the engine then fills
    every weight at random (vLLM's `--load-format dummy`)."""
    root = Path(path)
    config_file = root / "config.json"
    if not root.is_dir():
        raise ModelLoadError(f"model directory {root} does not exist")
    if not config_file.is_file():
        raise ModelLoadError(f"{root} has no config.json: not a model directory")
    try:
        cfg = json.loads(config_file.read_text())
    except ValueError as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from None
    if not any((root / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelLoadError(f"{root} has no tokenizer (tokenizer.json)")
    if require_weights and not list(root.glob("*.safetensors")) and not list(root.glob("*.bin")):
        raise ModelLoadError(
            f"{root} has no weights (*.safetensors); for timings of the architecture alone, "
            "use random weights (load format 'dummy')"
        )
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads", heads))
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        vocab = int(cfg["vocab_size"])
        inter = int(cfg.get("intermediate_size", 4 * hidden))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{config_file} lacks a usable field: {exc}") from None
    per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2 + 3 * hidden * inter
    return ModelInfo(
        path=str(root),
        architecture=str((cfg.get("architectures") or ["unknown"])[0]),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        checkpoint_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        num_params=layers * per_layer + 2 * vocab * hidden,
    )


@dataclass(frozen=True)
class HardwareTarget:
    """Where trials run: the local CPU engine here; a GPU type on a GPU host."""

    name: str  # e.g. "local-cpu"
    # Data-residency region code, e.g. "us"; None: this machine's, read when asked
    # (LOCAL_HARDWARE_REGION, see `residency`), never frozen at import.
    region: str | None
    num_devices: int
    kv_cache_gib: float  # memory available to the KV cache on one replica
    price_per_hour_usd: float  # for cost per million tokens
    device_kind: str = "cpu"  # "cpu" or "gpu"
    # Longest prompt / output a trial on this hardware replays when the job names no cap (None:
    # full length). A 2-core CPU engine prefills ~1,000 tokens in about a second; longer prompts
    # at a customer's rate would make each trial take many minutes.
    replay_prompt_tokens: int | None = None
    replay_output_tokens: int | None = None
    # GPUs: memory of one device (the host's reported figure where known, else the catalog's);
    # the KV cache is what `gpu_memory_utilization` of it leaves after weights and activations.
    device_memory_gib: float | None = None
    catalog_name: str | None = None  # the accelerator in serving.catalog.hardware
    # Load-generator processes a trial replays with (see `TrialPlan.client_processes`).
    client_processes: int = 1

    def residency(self) -> str:
        """The region code trials on this target run in."""
        return self.region or local_region_code()

    def kv_cache_gib_for(self, model: ModelInfo, values: Mapping[str, Any]) -> float:
        """The KV cache one replica gets with these knob values (GPUs: memory x utilisation,
        less the weights and an activation reserve; CPUs: the configured KV space)."""
        if self.device_kind == "cpu" or self.device_memory_gib is None:
            return self.kv_cache_gib
        return gpu_budget(self, model, values)["kv_gib"]


# What vLLM keeps besides weights and KV on a GPU (activations of the largest step, CUDA graphs,
# the allocator's slack); vLLM measures it by a profiling run at start-up, this is the estimate
# the search uses to refuse points that cannot fit before any engine starts.
GPU_ACTIVATION_RESERVE_GIB = 4.0
GPU_DEFAULT_MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
GPU_CLIENT_PROCESSES = 4  # load-generator processes on a GPU host (16+ cores beside the engine)


def gpu_budget(hardware: HardwareTarget, model: ModelInfo, values: Mapping[str, Any]) -> dict[str, float]:
    """The memory arithmetic of one GPU replica: usable, weights, reserve and KV cache (GiB)."""
    util = values.get("gpu_memory_utilization") or GPU_DEFAULT_MEMORY_UTILIZATION
    tp = values.get("tensor_parallel_size") or 1
    dtype = values.get("dtype") or model.checkpoint_dtype
    weight_bytes = 1 if values.get("quantization") == "fp8" else _BYTES.get(dtype, 2)
    usable = float(hardware.device_memory_gib or 0.0) * float(util)
    weights = model.num_params * weight_bytes / tp / (1 << 30)
    kv = usable - weights - GPU_ACTIVATION_RESERVE_GIB
    return {
        "usable_gib": usable,
        "weights_gib": weights,
        "reserve_gib": GPU_ACTIVATION_RESERVE_GIB,
        "kv_gib": kv,
    }


def _host_gpu_memory_gib() -> float | None:
    """Memory of this host's first GPU as the driver reports it (torch), or None without one."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        total = torch.cuda.get_device_properties(0).total_memory
    except (RuntimeError, AssertionError):
        return None
    return float(total) / (1 << 30)


def on_this_host(target: HardwareTarget) -> HardwareTarget:
    """`target` with the device memory this host's driver reports, when this host has a GPU of
    about the catalog's size (within 15%); else unchanged. Trials then plan the KV cache from the
    memory they will actually get."""
    if target.device_kind == "cpu" or target.device_memory_gib is None:
        return target
    host = _host_gpu_memory_gib()
    if host is None or abs(host - target.device_memory_gib) / target.device_memory_gib > 0.15:
        return target
    return replace(target, device_memory_gib=round(host, 1))


def gpu_target(name: str, *, region: str | None = None, num_devices: int = 1) -> HardwareTarget:
    """A GPU target from the hardware catalog (device memory, price per device-hour)."""
    from serving.catalog.hardware import get_hardware

    spec = get_hardware(name)
    memory = spec.memory_bytes / (1 << 30)
    return HardwareTarget(
        name=name,
        region=region,
        num_devices=num_devices,
        kv_cache_gib=0.0,
        price_per_hour_usd=float(spec.price_per_hour_usd.value) * num_devices,
        device_kind="gpu",
        device_memory_gib=round(memory, 1),
        catalog_name=spec.name,
        client_processes=GPU_CLIENT_PROCESSES,
    )


LOCAL_CPU = HardwareTarget(
    name="local-cpu",
    region=None,
    num_devices=1,
    kv_cache_gib=2.0,
    # Not priced (as in the hardware catalog): the operator's own machine has a price only when
    # the operator sets one (a job's `price_per_hour_usd`). At 0 no trial has a cost, and the
    # search and selection rank on latency alone, never on an invented price.
    price_per_hour_usd=0.0,
    replay_prompt_tokens=1024,
    replay_output_tokens=64,
)


# Change types decide how strict the correctness gate is (see gates.py).
LOSSLESS = "lossless"  # must reproduce the reference's greedy output exactly
PRECISION = "precision"  # changes numerics: judged by top-1 agreement and KL divergence


@dataclass(frozen=True)
class Knob:
    name: str  # a field of EngineConfig, or a pseudo-knob expanded in `to_config`
    values: tuple[Any, ...]
    baseline: Any  # the value vLLM uses when the flag is not given
    change_type: str  # LOSSLESS or PRECISION
    why: str  # what the knob does to TTFT or cost


@dataclass(frozen=True)
class SearchSpace:
    model: ModelInfo
    hardware: HardwareTarget
    base: EngineConfig  # fields no knob sets (start-up mode, KV space, ...)
    knobs: tuple[Knob, ...]
    max_model_len: int

    @property
    def size(self) -> int:
        return math.prod(len(k.values) for k in self.knobs)

    def knob(self, name: str) -> Knob:
        return next(k for k in self.knobs if k.name == name)

    def baseline(self) -> dict[str, Any]:
        return {k.name: k.baseline for k in self.knobs}

    def to_config(self, assignment: Mapping[str, Any]) -> EngineConfig:
        values = {**self.baseline(), **assignment}
        speculative = values.pop("speculative", None)
        cores = values.pop("cpu_worker_cores", None)
        fields: dict[str, Any] = {k: v for k, v in values.items() if v is not None or k == "dtype"}
        if fields.get("dtype") is None:
            fields["dtype"] = "auto"
        config = replace(self.base, **fields, max_model_len=self.max_model_len)
        if cores:
            env = dict(config.extra_env) | {CPU_BIND_ENV: str(cores)}
            config = replace(config, extra_env=tuple(sorted(env.items())))
        if speculative:
            method, _, num = str(speculative).partition(":")
            config = replace(
                config,
                speculative_method=method,
                num_speculative_tokens=int(num),
                ngram_prompt_lookup_max=int(num) if method == "ngram" else None,
            )
        return config

    def violations(self, assignment: Mapping[str, Any]) -> list[str]:
        """Why this point cannot run (empty when it can)."""
        values = {**self.baseline(), **assignment}
        problems = []
        for knob in self.knobs:
            if values[knob.name] not in knob.values:
                problems.append(f"{knob.name}={values[knob.name]!r} is not one of {list(knob.values)}")
        gpu = self.hardware.device_kind != "cpu"
        # vLLM's own defaults for its API server: 1024 sequences and an 8192-token step on a GPU
        # of >= 70 GiB, 256 and 2048 on a CPU.
        seqs = values.get("max_num_seqs") or (1024 if gpu else 256)
        budget = values.get("max_num_batched_tokens") or (8192 if gpu else 2048)
        chunked = values.get("enable_chunked_prefill")
        if budget < seqs:
            problems.append(
                f"max_num_batched_tokens {budget} < max_num_seqs {seqs}: the step budget cannot hold one token per sequence"
            )
        if chunked is False and budget < self.max_model_len:
            problems.append(
                f"without chunked prefill max_num_batched_tokens ({budget}) must cover max_model_len ({self.max_model_len})"
            )
        kv_dtype = values.get("kv_cache_dtype") or "auto"
        if kv_dtype.startswith("fp8") and self.hardware.device_kind == "cpu" and self.model.head_dim % 32:
            problems.append(
                f"an fp8 KV cache on a CPU needs a head size divisible by 32 (this model's: {self.model.head_dim})"
            )
        dtype = values.get("dtype") or self.model.checkpoint_dtype
        per_token = self.model.kv_bytes_per_token(dtype if kv_dtype == "auto" else kv_dtype)
        kv_gib = self.hardware.kv_cache_gib_for(self.model, values)
        if self.hardware.device_kind != "cpu" and self.hardware.device_memory_gib is not None:
            budget_gib = gpu_budget(self.hardware, self.model, values)
            if budget_gib["kv_gib"] <= 0:
                problems.append(
                    f"the model does not fit: {budget_gib['usable_gib']:.1f} GiB usable "
                    f"({self.hardware.device_memory_gib:g} GiB x {values.get('gpu_memory_utilization') or GPU_DEFAULT_MEMORY_UTILIZATION}) "
                    f"- {budget_gib['weights_gib']:.1f} GiB of weights - {budget_gib['reserve_gib']:g} GiB of "
                    f"activations leaves {budget_gib['kv_gib']:.1f} GiB for the KV cache"
                )
        kv_tokens = int(max(0.0, kv_gib) * (1 << 30) // per_token)
        if kv_gib > 0 and kv_tokens < self.max_model_len:
            problems.append(
                f"the KV cache ({kv_gib:.4g} GiB = {kv_tokens:,} tokens) cannot hold one "
                f"{self.max_model_len:,}-token sequence"
            )
        tp = values.get("tensor_parallel_size") or 1
        if tp > self.hardware.num_devices:
            problems.append(f"tensor_parallel_size {tp} > {self.hardware.num_devices} devices")
        if tp > 1 and self.model.num_kv_heads % tp:
            problems.append(f"tensor_parallel_size {tp} does not divide {self.model.num_kv_heads} KV heads")
        spec = values.get("speculative")
        if spec and not str(spec).startswith("ngram:"):
            problems.append(f"speculative method {spec!r} needs a draft model, which this job has none of")
        return problems

    def key(self, assignment: Mapping[str, Any]) -> tuple[Any, ...]:
        """What the engine actually runs, as a hashable key: vLLM's "auto" dtype (no flag) is
        the checkpoint's own, so both spellings are one point."""
        full = {**self.baseline(), **assignment}
        if "dtype" in full and full["dtype"] in (None, "auto"):
            full["dtype"] = self.model.checkpoint_dtype
        return tuple((k.name, full.get(k.name)) for k in self.knobs)

    def changed_knobs(self, assignment: Mapping[str, Any]) -> list[str]:
        base = self.baseline()
        return [name for name, value in assignment.items() if base.get(name) != value]

    def change_type(self, assignment: Mapping[str, Any], reference: Mapping[str, Any]) -> str:
        """PRECISION if any knob that changes numerics differs from the reference, else LOSSLESS."""
        for knob in self.knobs:
            if knob.change_type == PRECISION and assignment.get(knob.name, knob.baseline) != reference.get(
                knob.name, knob.baseline
            ):
                return PRECISION
        return LOSSLESS

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.path,
            "hardware": self.hardware.name,
            "max_model_len": self.max_model_len,
            "size": self.size,
            "knobs": [
                {
                    "name": k.name,
                    "values": list(k.values),
                    "baseline": k.baseline,
                    "change_type": k.change_type,
                    "why": k.why,
                }
                for k in self.knobs
            ],
        }

    def describe(self) -> str:
        lines = [f"search space for {self.model.path} on {self.hardware.name}: {self.size:,} points"]
        for k in self.knobs:
            values = ", ".join("default" if v is None else str(v) for v in k.values)
            lines.append(f"  {k.name:<24} {{{values}}}  baseline={k.baseline}  [{k.change_type}] {k.why}")
        return "\n".join(lines)


def _cpu_has_fp8_kv() -> bool:
    """vLLM's CPU attention stores an fp8 KV cache only on x86 with AVX-512 or AMX."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512f" in flags or "amx_tile" in flags


def local_worker_cores() -> str | None:
    """Every core this process may run on, as vLLM's CPU list ("0-1"), or None with one core
    (vLLM's own binding then already uses it)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return None
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def build_space(
    *, model: ModelInfo, hardware: HardwareTarget, max_model_len: int, load_format: str | None = None
) -> SearchSpace:
    """The knobs worth searching for this model on this hardware, with vLLM's defaults as baseline.

    CPU pools search the CPU build's knobs (float32, the worker's cores, eager mode); GPU pools
    the knobs that move latency on a GPU (weight and KV precision, memory share, batch shape,
    KV page size, CUDA-graph capture, asynchronous scheduling), judged against the checkpoint's
    own precision with CUDA graphs on.
    """
    if hardware.device_kind != "cpu":
        return _gpu_space(
            model=model, hardware=hardware, max_model_len=max_model_len, load_format=load_format
        )
    knobs = [
        Knob(
            "dtype",
            (None, "float32", "bfloat16"),
            None,
            PRECISION,
            "activation/weight precision; float32 prefill is faster on AVX2 CPUs",
        ),
        Knob(
            "max_num_seqs", (None, 4, 8, 16, 32, 64), None, LOSSLESS, "batch width: queueing vs per-step time"
        ),
        Knob(
            "max_num_batched_tokens",
            (None, 512, 1024, 2048, 4096, 8192),
            None,
            LOSSLESS,
            "tokens per step: long prefills in one step vs decode stalls behind them",
        ),
        _CHUNKED,
        _PREFIX,
        _NGRAM,
    ]
    if _cpu_has_fp8_kv():
        knobs.append(_FP8_KV)
    all_cores = local_worker_cores()
    if all_cores is not None:
        knobs.append(
            Knob(
                "cpu_worker_cores",
                (None, all_cores),
                None,
                LOSSLESS,
                "the engine worker's compute threads: vLLM keeps one core for its API server and "
                "scheduler; every core speeds long compute-bound prefills, which then share it",
            )
        )
    base = EngineConfig(
        enforce_eager=True,
        cpu_kv_cache_space_gib=max(1, int(hardware.kv_cache_gib)),
        load_format=load_format,
    )
    return SearchSpace(
        model=model, hardware=hardware, base=base, knobs=tuple(knobs), max_model_len=max_model_len
    )


_CHUNKED = Knob(
    "enable_chunked_prefill", (None, True, False), None, LOSSLESS, "split long prompts across steps"
)
_PREFIX = Knob(
    "enable_prefix_caching", (None, True, False), None, LOSSLESS, "reuse KV of shared prompt prefixes"
)
_NGRAM = Knob(
    "speculative",
    (None, "ngram:3"),
    None,
    LOSSLESS,
    "n-gram speculative decoding: faster decode where outputs echo the prompt",
)
_FP8_KV = Knob(
    "kv_cache_dtype",
    (None, "fp8"),
    None,
    PRECISION,
    "fp8 KV cache: half the KV memory and bandwidth per token, at some precision "
    "(the gate decides whether the model tolerates it)",
)


def _gpu_space(
    *, model: ModelInfo, hardware: HardwareTarget, max_model_len: int, load_format: str | None
) -> SearchSpace:
    half = model.checkpoint_dtype in {"bfloat16", "float16", "auto"}
    knobs = [
        Knob(
            "dtype",
            (None, "float16") if model.checkpoint_dtype != "float16" else (None, "bfloat16"),
            None,
            PRECISION,
            "the other 16-bit format: same speed on Hopper, different rounding (the gate judges it)",
        ),
        Knob(
            "max_num_seqs",
            (None, 64, 128, 256, 512),
            None,
            LOSSLESS,
            "batch width (vLLM's default on a large GPU: 1024): queueing vs per-step time",
        ),
        Knob(
            "max_num_batched_tokens",
            (None, 2048, 4096, 16384, 32768),
            None,
            LOSSLESS,
            "tokens per step (default 8192 on a large GPU): long prefills in fewer steps vs decode "
            "stalls behind them",
        ),
        Knob("enable_chunked_prefill", (None, False), None, LOSSLESS, "split long prompts across steps"),
        Knob("enable_prefix_caching", (None, False), None, LOSSLESS, "reuse KV of shared prompt prefixes"),
        Knob(
            "gpu_memory_utilization",
            (None, 0.95),
            None,
            LOSSLESS,
            "share of device memory vLLM takes (default 0.9): more KV pages, fewer preemptions",
        ),
        Knob("block_size", (None, 32, 64), None, LOSSLESS, "tokens per KV page (default 16)"),
        Knob(
            "cudagraph_mode",
            (None, "PIECEWISE", "FULL_DECODE_ONLY"),
            None,
            LOSSLESS,
            "what CUDA graphs capture (default: full graphs for decode, piecewise for mixed steps)",
        ),
        Knob(
            "async_scheduling",
            (None, False),
            None,
            LOSSLESS,
            "schedule the next step while the device runs this one (on by default)",
        ),
        _NGRAM,
        _FP8_KV,
    ]
    if half:
        knobs.append(
            Knob(
                "quantization",
                (None, "fp8"),
                None,
                PRECISION,
                "dynamic fp8 weights and activations: half the weight bytes, twice the matrix "
                "throughput on Hopper, at some precision (the gate decides)",
            )
        )
    if hardware.num_devices > 1:
        tps = tuple(n for n in (1, 2, 4, 8) if n <= hardware.num_devices and model.num_kv_heads % n == 0)
        knobs.append(Knob("tensor_parallel_size", tps, 1, PRECISION, "split each layer over devices"))
    base = EngineConfig(enforce_eager=False, load_format=load_format)
    return SearchSpace(
        model=model, hardware=hardware, base=base, knobs=tuple(knobs), max_model_len=max_model_len
    )
