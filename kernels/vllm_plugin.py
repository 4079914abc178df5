"""Our RMSNorm kernels offered to vLLM as an implementation of its IR ops (issue 25, item 3).

vLLM (0.26 and later) routes every RMSNorm of a model through two IR ops, `rms_norm` and
`fused_add_rms_norm`, each with implementations named by provider ("native": the torch code that
torch.compile turns into an Inductor kernel, "vllm_c": vLLM's CUDA kernel, ...), and picks one per
call from a priority list (`--ir-op-priority`, or `kernel_config.ir_op_priority`). Providers come
from general plugins (the `vllm.general_plugins` entry point group, filtered by `VLLM_PLUGINS`),
which every vLLM process loads before it builds the model. This module is such a plugin: its
`register()` adds the provider "tailguard", so that

    VLLM_PLUGINS=tailguard_kernels vllm serve MODEL \\
        --ir-op-priority '{"rms_norm": ["tailguard"], "fused_add_rms_norm": ["tailguard"]}'

runs our Triton kernels where the compiled graph had vLLM's own (the platform's defaults follow
in the list, so a call our kernel cannot take, e.g. a norm over part of the row, falls back).

The kernels are wrapped as opaque torch ops (`torch.ops.tailguard.*`, with shape-only fake
implementations): vLLM's lowering pass traces the chosen implementation with fake tensors, and a
Triton launch cannot be traced, an op can. `entry_point_dir()` writes the distribution metadata
that makes the plugin discoverable from a folder on PYTHONPATH, without installing a package.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch  # at module level: torch.library reads the ops' annotations by name

from kernels import rmsnorm
from kernels._common import interpreting

PROVIDER = "tailguard"
PLUGIN_NAME = "tailguard_kernels"
OPS = ("rms_norm", "fused_add_rms_norm")
_registered = False
# a child of vLLM's logger: its handlers print these lines in the engine's log
logger = logging.getLogger("vllm.tailguard_kernels")
_used: set[str] = set()


def _first_use(op: str) -> None:
    """Say once per process that an op ran our kernel (called from the opaque op's body, which
    runs for real: compiled graphs call the op, they do not trace into it), so an engine's log
    shows the plugin in use."""
    if op not in _used:
        _used.add(op)
        logger.info("tailguard kernels: %s runs our Triton kernel", op)


def priority_json() -> str:
    """The `--ir-op-priority` value that puts our provider first for both ops."""
    import json

    return json.dumps({op: [PROVIDER] for op in OPS}, separators=(",", ":"))


def entry_point_dir(folder: Path) -> Path:
    """Write `<folder>/tailguard_kernels-0.dist-info` declaring `register` under vLLM's
    general-plugins group; with `folder` and this repository on PYTHONPATH, vLLM finds it."""
    info = folder / f"{PLUGIN_NAME}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_NAME}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN_NAME} = kernels.vllm_plugin:register\n"
    )
    return info


def _takes(x: Any, weight: Any, variance_size: Any) -> bool:
    """What our kernel serves: whole rows of a 2-D activation with a weight of its dtype."""
    return bool(
        variance_size is None
        and weight is not None
        and weight.dtype == x.dtype
        and x.dim() == 2
        and x.shape[-1] <= rmsnorm.MAX_HIDDEN
        and x.stride(-1) == 1
    )


def register() -> None:
    """Add the "tailguard" provider to vLLM's RMSNorm IR ops (idempotent: vLLM may load a plugin
    more than once per process)."""
    global _registered
    if _registered:
        return
    from vllm import ir

    @torch.library.custom_op("tailguard::rms_norm", mutates_args=())
    def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
        _first_use("rms_norm")
        return rmsnorm.fused_add_rmsnorm(x, None, weight, epsilon).out

    @rms_norm_op.register_fake
    def _(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("tailguard::fused_add_rms_norm", mutates_args=())
    def fused_add_op(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _first_use("fused_add_rms_norm")
        result = rmsnorm.fused_add_rmsnorm(x, residual.contiguous(), weight, epsilon)
        assert result.residual_out is not None
        return result.out, result.residual_out

    @fused_add_op.register_fake
    def _(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(x), torch.empty_like(x)

    # Triton runs on a CUDA GPU, or on the CPU in its interpreter (the tests).
    supported = torch.cuda.is_available() or interpreting()

    def takes_rms(x: Any, weight: Any, epsilon: Any, variance_size: Any = None) -> bool:
        return _takes(x, weight, variance_size)

    def takes_add(x: Any, x_residual: Any, weight: Any, epsilon: Any, variance_size: Any = None) -> bool:
        return _takes(x, weight, variance_size) and x_residual.shape == x.shape

    @ir.ops.rms_norm.register_impl(PROVIDER, supported=supported, supports_args=takes_rms)
    def rms_norm_impl(
        x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> torch.Tensor:
        assert weight is not None and variance_size is None
        return torch.ops.tailguard.rms_norm(x, weight, epsilon)

    @ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supported=supported, supports_args=takes_add)
    def fused_add_impl(
        x: torch.Tensor,
        x_residual: torch.Tensor,
        weight: torch.Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert weight is not None and variance_size is None
        out, residual = torch.ops.tailguard.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return out, residual

    _registered = True
    logger.info("tailguard kernels: provider %r registered for %s", PROVIDER, ", ".join(OPS))
