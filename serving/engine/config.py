"""Engine configuration: the knobs that move TTFT and cost, rendered to vLLM server flags.

`EngineConfig` is engine-neutral data; `to_args` / `to_env` render it for vLLM's OpenAI server
(`python -m vllm.entrypoints.openai.api_server`). Where vLLM is importable, `validate_args` runs
the rendered flags through vLLM's own parser so that a configuration which would not start is
refused before anything is launched, with the offending flag named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class InvalidEngineConfig(ValueError):
    """The configuration would not start; `flag` names the offending server flag when known."""

    def __init__(self, message: str, *, flag: str | None = None) -> None:
        super().__init__(message)
        self.flag = flag


# vLLM's CPU build: the cores its worker's OpenMP threads are pinned to ("auto": all but one core
# per NUMA node; "nobind": none; or a list such as "0-3,8").
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class EngineConfig:
    """One serving configuration. `None` means "the engine's own default"."""

    dtype: str = "auto"  # weights/activations: auto (the checkpoint's), float32, bfloat16, float16
    quantization: str | None = None  # weight quantization method, e.g. "fp8", "awq"
    kv_cache_dtype: str = "auto"  # e.g. "fp8" to halve KV memory
    max_model_len: int | None = None  # context length in tokens (prompt + output)
    max_num_seqs: int | None = None  # sequences in one batch
    max_num_batched_tokens: int | None = None  # token budget of one scheduler step
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    scheduling_policy: str | None = None  # "fcfs" or "priority"
    speculative_method: str | None = None  # e.g. "ngram", "eagle", "draft_model"
    num_speculative_tokens: int | None = None
    speculative_model: str | None = None  # draft model path for methods that need one
    ngram_prompt_lookup_max: int | None = None  # n-gram method only
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # share of each GPU's memory vLLM may take
    cpu_kv_cache_space_gib: int | None = None  # CPU build: KV cache size (VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool = False  # skip graph capture/compilation (fast start; the CPU default here)
    # GPU knobs. block_size: tokens per KV-cache page; cudagraph_mode: what CUDA graphs capture
    # (vLLM's compilation config, e.g. "FULL_AND_PIECEWISE", "PIECEWISE", "FULL_DECODE_ONLY");
    # async_scheduling: schedule step n+1 while step n runs on the device.
    block_size: int | None = None
    cudagraph_mode: str | None = None
    async_scheduling: bool | None = None
    # "dummy": random weights from config.json alone (shapes, memory and timings of the real
    # model; meaningless text). None: the checkpoint's weights.
    load_format: str | None = None
    seed: int | None = None
    served_model_name: str | None = None
    api_key: str | None = field(default=None, repr=False)  # required from clients when set
    # Escape hatches: further server flags verbatim, and further environment variables.
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise InvalidEngineConfig("tensor_parallel_size must be >= 1", flag="--tensor-parallel-size")
        for name in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_speculative_tokens",
            "block_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidEngineConfig(f"{name} must be >= 1, got {value}", flag=_flag(name))
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidEngineConfig(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
                flag="--gpu-memory-utilization",
            )
        if (self.num_speculative_tokens is not None) != (self.speculative_method is not None):
            raise InvalidEngineConfig(
                "speculative_method and num_speculative_tokens go together", flag="--speculative-config"
            )

    # -- rendering -----------------------------------------------------------------------------

    def to_args(self, *, model: str, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
        """The vLLM OpenAI server's command-line flags for this configuration."""
        args = ["--model", model, "--host", host, "--port", str(port)]
        args += ["--dtype", self.dtype, "--kv-cache-dtype", self.kv_cache_dtype]
        if self.quantization:
            args += ["--quantization", self.quantization]
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "seed"):
            value = getattr(self, name)
            if value is not None:
                args += [_flag(name), str(value)]
        if self.load_format:
            args += ["--load-format", self.load_format]
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"):
            value = getattr(self, name)
            if value is not None:
                args.append(_flag(name) if value else _flag(name).replace("--", "--no-", 1))
        if self.scheduling_policy:
            args += ["--scheduling-policy", self.scheduling_policy]
        if self.speculative_method:
            spec: dict[str, Any] = {
                "method": self.speculative_method,
                "num_speculative_tokens": self.num_speculative_tokens,
            }
            if self.speculative_model:
                spec["model"] = self.speculative_model
            if self.ngram_prompt_lookup_max is not None:
                spec["prompt_lookup_max"] = self.ngram_prompt_lookup_max
            args += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        if self.tensor_parallel_size != 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.cudagraph_mode:
            args += ["--compilation-config", json.dumps({"cudagraph_mode": self.cudagraph_mode})]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.api_key:
            args += ["--api-key", self.api_key]
        args += list(self.extra_args)
        return args

    def to_env(self) -> dict[str, str]:
        """Environment variables the engine process needs for this configuration."""
        env: dict[str, str] = {}
        if self.cpu_kv_cache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kv_cache_space_gib)
        env.update(dict(self.extra_env))
        return env

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Build from a plain mapping (a parsed JSON/TOML file), refusing unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidEngineConfig(f"unknown engine config key(s): {', '.join(unknown)}")
        values = dict(data)
        if "extra_args" in values:
            values["extra_args"] = tuple(str(a) for a in values["extra_args"])
        if "extra_env" in values:
            extra_env = values["extra_env"]
            items = extra_env.items() if isinstance(extra_env, Mapping) else extra_env
            values["extra_env"] = tuple((str(k), str(v)) for k, v in items)
        return cls(**values)

    @classmethod
    def from_file(cls, path: Path) -> EngineConfig:
        """Read a `.json` or `.toml` file of `EngineConfig` fields."""
        text = path.read_text()
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise InvalidEngineConfig(
                f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise InvalidEngineConfig(f"{path}: expected an object of engine config fields")
        return cls.from_mapping(data)

    def to_mapping(self) -> dict[str, Any]:
        """JSON-ready fields (the API key is left out)."""
        data = dataclasses.asdict(self)
        data["extra_args"] = list(self.extra_args)
        data["extra_env"] = dict(self.extra_env)
        data.pop("api_key")
        return data

    @classmethod
    def cpu_default(cls, **overrides: Any) -> EngineConfig:
        """What works best on the CPU build here: eager mode and float32 (2-4x faster prefill than bf16)."""
        base: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "cpu_kv_cache_space_gib": 2}
        base.update(overrides)
        return cls(**base)


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


# -- validation with vLLM's own parser -----------------------------------------------------------

_FLAG_IN_MESSAGE = re.compile(r"(--[a-zA-Z0-9][a-zA-Z0-9_.-]*)")


def vllm_importable() -> bool:
    """Whether vLLM can be imported in this interpreter (validation needs it)."""
    return importlib.util.find_spec("vllm") is not None


def validate_args(args: Sequence[str]) -> None:
    """Parse `args` with the vLLM server's own parser; raise `InvalidEngineConfig` naming the flag.

    Uses `FlexibleArgumentParser` with the server's frontend flags and
    `AsyncEngineArgs.add_cli_args`, then vLLM's pre-load checks of the parsed arguments. Nothing
    is started. Needs vLLM importable in this interpreter (see `vllm_importable`).
    """
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # vLLM before 0.30 kept the server's parser beside the OpenAI server
        from vllm.entrypoints.openai.cli_args import (  # type: ignore[no-redef]
            make_arg_parser,
            validate_parsed_serve_args,
        )
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm.entrypoints.openai.api_server"))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(list(args))
    except SystemExit as exc:
        message = _last_error_line(stderr.getvalue()) or f"vLLM's parser exited with status {exc.code}"
        raise InvalidEngineConfig(f"vLLM refuses the flags: {message}", flag=_flag_in(message)) from None
    try:
        validate_parsed_serve_args(namespace)
    except (ValueError, TypeError) as exc:
        raise InvalidEngineConfig(f"vLLM refuses the flags: {exc}", flag=_flag_in(str(exc))) from exc


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    if errors:
        return errors[-1].split(": error: ", 1)[1]
    return lines[-1] if lines else ""


def _flag_in(message: str) -> str | None:
    match = _FLAG_IN_MESSAGE.search(message)
    return match.group(1) if match else None
