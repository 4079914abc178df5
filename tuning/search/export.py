"""A job's chosen configuration in the forms a GPU user runs it: `vllm serve` flags, the
Kubernetes runner's command (manifests checked against the API schema), the engine config
file, and the `tailguard tune` command that reproduces the measurement."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from serving.engine.config import EngineConfig

# Flags the serving side sets per deployment (where it listens), not part of a tuned configuration.
_PER_DEPLOYMENT = {"--model", "--host", "--port"}


def serve_flags(config: EngineConfig) -> list[str]:
    """The configuration's vLLM flags, without the model and the address."""
    args = config.to_args(model="MODEL")
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in _PER_DEPLOYMENT:
            skip = True
            continue
        out.append(arg)
    return out


def serve_command(model_path: str, config: EngineConfig) -> str:
    """`vllm serve MODEL ...` with the configuration's flags and its environment, as one shell line."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(config.to_env().items()))
    line = shlex.join(["vllm", "serve", model_path, *serve_flags(config)])
    return f"{env} {line}" if env else line


def k8s_command(*, name: str, model_path: str, hardware: str, config_file: str) -> str:
    """The Kubernetes runner's render command for this configuration (region and residency are
    the deployer's to fill in)."""
    return (
        shlex.join(
            [
                "tailguard",
                "endpoint",
                "render-k8s",
                "--name",
                name,
                "--model",
                name,
                "--model-path",
                model_path,
                "--hardware",
                hardware,
                "--config",
                config_file,
                "--out",
                f"{name}-manifests",
            ]
        )
        + " --region REGION --allowed-regions CODES"
    )


def tune_command(spec: Mapping[str, Any]) -> str:
    """The `tailguard tune` command that re-runs this job (same trace, model, SLO, load, caps, seed)."""
    words = [
        "tailguard",
        "tune",
        "--trace",
        str(spec["trace_path"]),
        "--model",
        str(spec["model_path"]),
        "--slo",
        str(spec["slo"]),
        "--peak-rps",
        f"{spec['peak_rps']:g}",
        "--headroom",
        f"{spec.get('headroom', 1.25):g}",
        "--hardware",
        str(spec.get("hardware", "local-cpu")),
        "--budget-trials",
        str(spec.get("budget_trials", 8)),
        "--duration-s",
        f"{spec.get('duration_s', 20.0):g}",
        "--repeats",
        str(spec.get("repeats", 2)),
        "--confirm-repeats",
        str(spec.get("confirm_repeats", 3)),
        "--finalists",
        str(spec.get("finalists", 2)),
        "--seed",
        str(spec.get("seed", 0)),
    ]
    for key, flag in (
        ("max_prompt_tokens", "--max-prompt-tokens"),
        ("max_output_tokens", "--max-output-tokens"),
        ("max_model_len", "--max-model-len"),
        ("load_format", "--load-format"),
    ):
        if spec.get(key) is not None:
            words += [flag, str(spec[key])]
    if spec.get("length_scale", 1.0) != 1.0:
        words += ["--length-scale", f"{spec['length_scale']:g}"]
    return shlex.join([*words, "--json", "report.json"])


def exports(
    *, spec: Mapping[str, Any], config: EngineConfig, label: str, gpu: bool, endpoint_name: str = "tuned"
) -> dict[str, Any]:
    """Every form of one chosen configuration, for the report and the job page. The Kubernetes
    command only for accelerators the runner places (GPU pools); a CPU configuration is served by
    `tailguard endpoint serve`."""
    data: dict[str, Any] = {
        "label": label,
        "engine_config": config.to_mapping(),
        "vllm_serve": serve_command(str(spec["model_path"]), config),
        "reproduce": tune_command(spec),
    }
    if gpu:
        data["kubernetes"] = k8s_command(
            name=endpoint_name,
            model_path=str(spec["model_path"]),
            hardware=str(spec.get("hardware")),
            config_file="engine-config.json",
        )
    return data
