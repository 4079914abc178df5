"""Does a model fit on a device group, and how many KV-cache tokens are left?"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.catalog.hardware import Hardware
from serving.catalog.models import ModelSpec, format_bytes

ACTIVATION_RESERVE_SHARE = 0.05  # of usable memory kept for activations, graphs and the allocator


class ModelDoesNotFit(ValueError):
    """The weights (or the minimum KV cache) exceed the devices' usable memory; says what would fit."""


@dataclass(frozen=True)
class FitReport:
    model: str
    hardware: str
    num_devices: int
    weight_format: str
    kv_cache_format: str
    usable_bytes_per_device: float  # memory x utilization, less the activation reserve
    weight_bytes_per_device: float
    kv_bytes_per_token: float  # over the whole group (per-device share x devices)
    kv_capacity_tokens: int  # KV-cache tokens the group holds after the weights


def check_fit(
    model: ModelSpec,
    hardware: Hardware,
    *,
    num_devices: int = 1,
    weight_format: str | None = None,
    kv_cache_format: str | None = None,
    memory_utilization: float = 0.9,
    kv_cache_bytes: float | None = None,
    min_kv_tokens: int = 1,
) -> FitReport:
    """Fit `model` on `num_devices` x `hardware`; raise `ModelDoesNotFit` with the reason if not.

    `kv_cache_bytes` fixes the KV-cache size (the CPU build's VLLM_CPU_KVCACHE_SPACE); otherwise
    the cache takes what the weights leave of `memory_utilization` of each device.
    """
    if num_devices < 1:
        raise ValueError("num_devices must be >= 1")
    if num_devices > hardware.max_devices_per_node:
        raise ModelDoesNotFit(
            f"{hardware.display_name}: at most {hardware.max_devices_per_node} devices per node, "
            f"asked for {num_devices}"
        )
    wfmt = weight_format or model.checkpoint_format
    kfmt = kv_cache_format or ("bf16" if wfmt in ("fp8", "fp4", "int4", "awq", "gptq") else wfmt)
    usable = hardware.memory_bytes * memory_utilization * (1.0 - ACTIVATION_RESERVE_SHARE)
    weights = model.weight_bytes(wfmt) / num_devices
    kv_per_token = model.kv_bytes_per_token(kfmt)
    if weights > usable:
        need = math.ceil(model.weight_bytes(wfmt) / usable)
        smaller = [f for f in ("fp8", "fp4") if format_bytes(f) < format_bytes(wfmt)]
        hint = f"use at least {need} devices (tensor parallel)"
        if smaller:
            hint += f" or a smaller weight format ({' / '.join(smaller)})"
        raise ModelDoesNotFit(
            f"{model.name} does not fit: {model.weight_bytes(wfmt) / 1e9:.1f} GB of {wfmt} weights, "
            f"{weights / 1e9:.1f} GB per device on {num_devices} x {hardware.display_name}, which has "
            f"{usable / 1e9:.1f} GB usable per device; {hint}"
        )
    if kv_cache_bytes is not None:
        kv_total = kv_cache_bytes
        if weights + kv_cache_bytes / num_devices > hardware.memory_bytes:
            raise ModelDoesNotFit(
                f"{model.name}: weights ({weights / 1e9:.2f} GB) plus the requested KV cache "
                f"({kv_cache_bytes / 1e9:.2f} GB) exceed {hardware.display_name}'s memory"
            )
    else:
        kv_total = (usable - weights) * num_devices
    capacity = int(kv_total // kv_per_token)
    if capacity < min_kv_tokens:
        raise ModelDoesNotFit(
            f"{model.name} on {num_devices} x {hardware.display_name}: the weights leave room for "
            f"{capacity} KV-cache tokens, fewer than the {min_kv_tokens} one request needs; "
            f"add devices, use an fp8 KV cache or a shorter max_model_len"
        )
    return FitReport(
        model=model.name,
        hardware=hardware.name,
        num_devices=num_devices,
        weight_format=wfmt,
        kv_cache_format=kfmt,
        usable_bytes_per_device=usable,
        weight_bytes_per_device=weights,
        kv_bytes_per_token=kv_per_token,
        kv_capacity_tokens=capacity,
    )
