"""Fused residual-add + RMSNorm, optionally emitting FP8 (e4m3fn) with a per-token scale.

    residual_out = x + residual                  (stored in the input dtype)
    y            = residual_out * rsqrt(mean(residual_out^2) + eps) * weight
    out          = y                             or, with fp8=True,
    scale[t]     = max|y[t, :]| / 448,  out = round_fp8(y / scale[t])

One program normalises `block_m` whole rows held in registers (hidden sizes up to 16384), so
every input byte is read once and every output byte written once: the kernel is a single pass
over memory, which is the bound for this operator. The sum is kept in float32 and normalised
unrounded, as vLLM's CUDA kernel does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import config_table
from kernels._common import FP8_E4M3_MAX, FP8_MIN_AMAX, check_out, interpreting, next_pow2, token_bucket
from kernels._fp8 import FP8_MAX, MIN_AMAX, round_to_e4m3

OP = "rmsnorm"
MAX_HIDDEN = 16384


@dataclass(frozen=True)
class RMSNormOutput:
    out: torch.Tensor  # [tokens, hidden], input dtype or float8_e4m3fn
    residual_out: torch.Tensor | None  # x + residual in the input dtype; None without a residual
    scale: torch.Tensor | None  # [tokens, 1] float32 dequantisation scale; None unless fp8


@triton.jit
def _add_rmsnorm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    scale_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    FP8: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = x + r.to(tl.float32)
        tl.store(
            res_out_ptr + rows[:, None] * stride_ro + cols[None, :],
            x.to(res_out_ptr.dtype.element_ty),
            mask=mask,
        )
    var = tl.sum(x * x, axis=1) / n_cols
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    if FP8:
        amax = tl.maximum(tl.max(tl.abs(y), axis=1), MIN_AMAX)
        scale = amax / FP8_MAX
        q = y * (1.0 / scale)[:, None]
        q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
        if SOFT_ROUND:
            q = round_to_e4m3(q)
        tl.store(
            out_ptr + rows[:, None] * stride_o + cols[None, :], q.to(out_ptr.dtype.element_ty), mask=mask
        )
        tl.store(scale_ptr + rows, scale, mask=rmask)
    else:
        tl.store(
            out_ptr + rows[:, None] * stride_o + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask
        )


def default_config(num_tokens: int, hidden: int) -> dict[str, int]:
    """Heuristic used when no tuned table covers the bucket: one row per program for wide rows,
    several narrow rows per program so each program still moves a few kilobytes."""
    block_n = next_pow2(hidden)
    block_m = max(1, min(8, 2048 // block_n))
    num_warps = max(1, min(16, block_n * block_m // 512))
    return {"block_m": block_m, "num_warps": num_warps}


def candidate_configs(hidden: int) -> list[dict[str, int]]:
    """Search space for the autotuner, pruned to tiles that fit in registers."""
    block_n = next_pow2(hidden)
    out = []
    for block_m in (1, 2, 4, 8):
        if block_m * block_n > 16384:
            continue
        for num_warps in (1, 2, 4, 8, 16):
            elems_per_thread = block_m * block_n // (32 * num_warps)
            if 4 <= elems_per_thread <= 64:
                out.append({"block_m": block_m, "num_warps": num_warps})
    return out


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    fp8: bool = False,
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> RMSNormOutput:
    """Residual add + RMSNorm over the last dimension of a 2-D `x` ([tokens, hidden]).

    `out`, `residual_out` and `scale_out` are optional preallocated outputs (residual_out may
    be `residual` itself, for the in-place update engines do).
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden], got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    if n_cols > MAX_HIDDEN:
        raise ValueError(f"hidden size {n_cols} exceeds the {MAX_HIDDEN} this kernel holds in registers")
    if weight.shape != (n_cols,):
        raise ValueError(f"weight must be [{n_cols}], got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("rows of x and residual must be contiguous")
    cfg = config or config_table.lookup(OP, str(token_bucket(n_rows))) or default_config(n_rows, n_cols)
    out_dtype = torch.float8_e4m3fn if fp8 else x.dtype
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    check_out(out, tuple(x.shape), out_dtype, "out")
    res_out = None
    if residual is not None:
        res_out = residual_out if residual_out is not None else torch.empty_like(x)
        check_out(res_out, tuple(x.shape), x.dtype, "residual_out")
    scale = None
    if fp8:
        scale = (
            scale_out
            if scale_out is not None
            else torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
        )
        check_out(scale, (n_rows, 1), torch.float32, "scale_out")
    if n_rows == 0:
        return RMSNormOutput(out=out, residual_out=res_out, scale=scale)
    block_m = int(cfg["block_m"])
    grid = (triton.cdiv(n_rows, block_m),)
    _add_rmsnorm_kernel[grid](
        x,
        residual if residual is not None else x,
        weight,
        out,
        res_out if res_out is not None else out,
        scale if scale is not None else weight,
        n_rows,
        n_cols,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        res_out.stride(0) if res_out is not None else 0,
        eps,
        BLOCK_M=block_m,
        BLOCK_N=next_pow2(n_cols),
        HAS_RES=residual is not None,
        FP8=fp8,
        SOFT_ROUND=fp8 and interpreting(),
        num_warps=int(cfg["num_warps"]),
    )
    return RMSNormOutput(out=out, residual_out=res_out, scale=scale)


def fused_add_rmsnorm_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    fp8: bool = False,
) -> RMSNormOutput:
    """Plain-torch reference, float32 arithmetic (the definition the kernel must match)."""
    xf = x.float()
    res_out = None
    if residual is not None:
        xf = xf + residual.float()
        res_out = xf.to(x.dtype)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    if not fp8:
        return RMSNormOutput(out=y.to(x.dtype), residual_out=res_out, scale=None)
    scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_MIN_AMAX) / FP8_E4M3_MAX
    q = (y * (1.0 / scale)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return RMSNormOutput(out=q, residual_out=res_out, scale=scale)
