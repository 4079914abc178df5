"""SiLU-and-multiply (the SwiGLU activation), optionally emitting FP8 with a per-token scale.

    x = [gate | up]  ([tokens, 2 * d]),  out = silu(gate) * up  ([tokens, d])

Without FP8 the grid is (tokens, column blocks): each element is read and written once. With
FP8 each program owns one whole row: up to MAX_WHOLE_ROW outputs it holds the row in registers
(the absolute maximum, i.e. the per-token scale, comes from registers); wider rows take two
passes, the first for the maximum, the second to quantise and store, re-reading the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import config_table
from kernels._common import FP8_E4M3_MAX, FP8_MIN_AMAX, check_out, interpreting, next_pow2, token_bucket
from kernels._fp8 import FP8_MAX, MIN_AMAX, round_to_e4m3

OP = "silu_mul"
# Widest row the FP8 path holds in registers (16 warps: 32 float32 of y per thread).
MAX_WHOLE_ROW = 16384


@dataclass(frozen=True)
class SiluMulOutput:
    out: torch.Tensor  # [tokens, d], input dtype or float8_e4m3fn
    scale: torch.Tensor | None  # [tokens, 1] float32 dequantisation scale; None unless fp8


@triton.jit
def _silu_mul_block(x_ptr, row, cols, d, stride_x):  # type: ignore[no-untyped-def]
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    return gate * tl.sigmoid(gate) * up, mask


@triton.jit
def _silu_mul_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    out_ptr,
    scale_ptr,
    d,
    stride_x,
    stride_o,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    WHOLE_ROW: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if not FP8:
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        y, mask = _silu_mul_block(x_ptr, row, cols, d, stride_x)
        tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    elif WHOLE_ROW:
        # The row fits in one block: one read, the amax from registers, one write.
        cols = tl.arange(0, BLOCK_N)
        y, mask = _silu_mul_block(x_ptr, row, cols, d, stride_x)
        scale = tl.maximum(tl.max(tl.abs(y), axis=0), MIN_AMAX) / FP8_MAX
        q = tl.minimum(tl.maximum(y * (1.0 / scale), -FP8_MAX), FP8_MAX)
        if SOFT_ROUND:
            q = round_to_e4m3(q)
        tl.store(out_ptr + row * stride_o + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        amax = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, d, BLOCK_N):
            y, mask = _silu_mul_block(x_ptr, row, start + tl.arange(0, BLOCK_N), d, stride_x)
            amax = tl.maximum(amax, tl.abs(y))
        scale = tl.maximum(tl.max(amax, axis=0), MIN_AMAX) / FP8_MAX
        inv = 1.0 / scale
        for start in range(0, d, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            y, mask = _silu_mul_block(x_ptr, row, cols, d, stride_x)
            q = tl.minimum(tl.maximum(y * inv, -FP8_MAX), FP8_MAX)
            if SOFT_ROUND:
                q = round_to_e4m3(q)
            tl.store(out_ptr + row * stride_o + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)


def default_config(num_tokens: int, d: int) -> dict[str, int]:
    block_n = min(1024, next_pow2(d))
    return {"block_n": block_n, "num_warps": max(1, min(8, block_n // 256))}


def candidate_configs(d: int) -> list[dict[str, int]]:
    out = []
    for block_n in (256, 512, 1024, 2048, 4096):
        if block_n > 2 * next_pow2(d):
            continue
        for num_warps in (1, 2, 4, 8, 16):
            per_thread = block_n // (32 * num_warps)
            if 2 <= per_thread <= 32:
                out.append({"block_n": block_n, "num_warps": num_warps})
    return out


def silu_and_mul(
    x: torch.Tensor,
    *,
    fp8: bool = False,
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> SiluMulOutput:
    """silu(x[:, :d]) * x[:, d:] for a 2-D `x` of shape [tokens, 2 * d] (optional preallocated
    `out` and, with fp8, `scale_out`)."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"x must be [tokens, 2 * d], got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError("rows of x must be contiguous")
    n_rows, d = x.shape[0], x.shape[1] // 2
    cfg = config or config_table.lookup(OP, str(token_bucket(n_rows))) or default_config(n_rows, d)
    out_dtype = torch.float8_e4m3fn if fp8 else x.dtype
    if out is None:
        out = torch.empty((n_rows, d), dtype=out_dtype, device=x.device)
    check_out(out, (n_rows, d), out_dtype, "out")
    scale = None
    if fp8:
        scale = (
            scale_out
            if scale_out is not None
            else torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
        )
        check_out(scale, (n_rows, 1), torch.float32, "scale_out")
    if n_rows == 0 or d == 0:
        return SiluMulOutput(out=out, scale=scale)
    block_n = int(cfg["block_n"])
    num_warps = int(cfg["num_warps"])
    whole_row = False
    if fp8 and d <= MAX_WHOLE_ROW:
        # Hold the row in registers and skip the second pass; widen the block to the row.
        block_n, whole_row = next_pow2(d), True
        num_warps = max(num_warps, min(16, block_n // 1024))
    grid = (n_rows,) if fp8 else (n_rows, triton.cdiv(d, block_n))
    _silu_mul_kernel[grid](
        x,
        out,
        scale if scale is not None else out,
        d,
        x.stride(0),
        out.stride(0),
        BLOCK_N=block_n,
        FP8=fp8,
        WHOLE_ROW=whole_row,
        SOFT_ROUND=fp8 and interpreting(),
        num_warps=num_warps,
    )
    return SiluMulOutput(out=out, scale=scale)


def silu_and_mul_ref(x: torch.Tensor, *, fp8: bool = False) -> SiluMulOutput:
    """Plain-torch reference in float32."""
    d = x.shape[-1] // 2
    gate, up = x[..., :d].float(), x[..., d:].float()
    y = torch.nn.functional.silu(gate) * up
    if not fp8:
        return SiluMulOutput(out=y.to(x.dtype), scale=None)
    scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_MIN_AMAX) / FP8_E4M3_MAX
    q = (y * (1.0 / scale)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return SiluMulOutput(out=q, scale=scale)
