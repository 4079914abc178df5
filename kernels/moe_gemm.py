"""Grouped GEMM for mixture-of-experts layers: each token is multiplied by the weights of the
experts it is routed to.

    a: [tokens, K] activations, w: [experts, N, K] expert weights, topk_ids: [tokens, top_k]
    out[t, j, :] = a[t] @ w[topk_ids[t, j]].T   (times topk_weights[t, j] when given)

The (token, expert) pairs are first sorted by expert and each expert's run padded to a multiple
of `block_m` (`moe_align`, plain torch, no host synchronisation); then one launch computes
every expert's tiles, each program loading the `block_m` activation rows it needs through the
sorted index. The best block shape depends strongly on how many tokens reach each expert:
decode steps send a handful of tokens per expert (small `block_m`, wide `block_n`, the job is
streaming the weights), large prefill steps hundreds (large square tiles, the job is the matrix
units), which is why the configuration is chosen per token-count bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import config_table
from kernels._common import check_out, interpreting, next_pow2, token_bucket

OP = "moe_gemm"


@dataclass(frozen=True)
class MoEAlignment:
    sorted_ids: torch.Tensor  # [max_blocks * block_m] int32 pair indices t * top_k + j; padding = num_pairs
    # [max_blocks] int32 expert of each row block; >= num_experts for unused blocks
    block_experts: torch.Tensor
    block_m: int


_ALIGN_BLOCK = 1024


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, 1, mask=mask)


@triton.jit
def _offsets_kernel(  # type: ignore[no-untyped-def]
    counts_ptr,
    padded_start_ptr,
    block_experts_ptr,
    num_experts,
    max_blocks,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    B_CHUNK: tl.constexpr,
):
    e = tl.arange(0, E_PAD)
    emask = e < num_experts
    nblk = (tl.load(counts_ptr + e, mask=emask, other=0) + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(nblk, axis=0)
    tl.store(padded_start_ptr + e, (end - nblk) * BLOCK_M, mask=emask)
    # Block b belongs to the first expert whose run ends after it: count the runs ending at or
    # before b (unused trailing blocks count every expert, i.e. >= num_experts).
    for b0 in range(0, max_blocks, B_CHUNK):
        b = b0 + tl.arange(0, B_CHUNK)
        before = (end[None, :] <= b[:, None]) & emask[None, :]
        tl.store(block_experts_ptr + b, tl.sum(before.to(tl.int32), axis=1), mask=b < max_blocks)


@triton.jit
def _scatter_kernel(  # type: ignore[no-untyped-def]
    ids_ptr, cursor_ptr, padded_start_ptr, sorted_ids_ptr, num_pairs, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    # The order of pairs inside an expert's run is whatever the atomics give: each output row
    # depends on its own pair only, so the GEMM's results do not depend on it.
    rank = tl.atomic_add(cursor_ptr + e, 1, mask=mask)
    dst = tl.load(padded_start_ptr + e, mask=mask, other=0) + rank
    tl.store(sorted_ids_ptr + dst, offs, mask=mask)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Sort (token, expert) pairs by expert and pad each expert's run to a multiple of block_m.

    Three small Triton launches (count, offsets, scatter) and no host synchronisation; sized
    for the worst case (every expert padded) so no count leaves the device. On the H200 the
    plain-torch version, `moe_align_ref`, measured 0.42-0.49 ms for 4-16k pairs (an argsort
    and a dozen launches); this one 0.05 ms, most of it the Python launch path, which a CUDA
    graph removes.
    """
    flat = topk_ids.reshape(-1).to(torch.int32).contiguous()
    num_pairs = flat.numel()
    max_blocks = -(-(num_pairs + num_experts * (block_m - 1)) // block_m)
    dev = flat.device
    scratch = torch.zeros(3 * num_experts, dtype=torch.int32, device=dev)
    counts, cursor, padded_start = (
        scratch[:num_experts],
        scratch[num_experts : 2 * num_experts],
        scratch[2 * num_experts :],
    )
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=dev)
    block_experts = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    if num_pairs:
        grid = (triton.cdiv(num_pairs, _ALIGN_BLOCK),)
        _count_kernel[grid](flat, counts, num_pairs, BLOCK=_ALIGN_BLOCK)
    e_pad = max(16, next_pow2(num_experts))
    _offsets_kernel[(1,)](
        counts,
        padded_start,
        block_experts,
        num_experts,
        max_blocks,
        BLOCK_M=block_m,
        E_PAD=e_pad,
        B_CHUNK=max(16, min(256, 8192 // e_pad)),
    )
    if num_pairs:
        _scatter_kernel[grid](flat, cursor, padded_start, sorted_ids, num_pairs, BLOCK=_ALIGN_BLOCK)
    return MoEAlignment(sorted_ids=sorted_ids, block_experts=block_experts, block_m=block_m)


def moe_align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Plain-torch alignment (stable order inside each expert's run)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    max_blocks = -(-(num_pairs + num_experts * (block_m - 1)) // block_m)
    # scatter_add, not bincount: bincount reads the maximum back to the host to size its
    # output, a synchronisation that cost ~0.2 ms per call on the H200.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    blocks_per_expert = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks_per_expert, 0)  # exclusive end block of each expert's run
    padded_start = (block_end - blocks_per_expert) * block_m  # first padded row of each expert
    start = torch.cumsum(counts, 0) - counts  # first sorted row of each expert, unpadded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - start[sorted_experts]
    dest = padded_start[sorted_experts] + rank
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[dest] = order.to(torch.int32)
    block_idx = torch.arange(max_blocks, device=flat.device)
    block_experts = torch.searchsorted(block_end, block_idx, right=True).to(torch.int32)
    return MoEAlignment(sorted_ids=sorted_ids, block_experts=block_experts, block_m=block_m)


@triton.jit
def _moe_gemm_kernel(  # type: ignore[no-untyped-def]
    a_ptr,
    w_ptr,
    c_ptr,
    topk_w_ptr,
    sorted_ids_ptr,
    block_experts_ptr,
    N,
    K,
    num_pairs,
    num_experts,
    num_blocks_m,
    stride_am,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    TOP_K: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    # Grouped ordering: GROUP_M row blocks sweep the N blocks together, so the weight tiles they
    # share are still in L2 when the next row block of the same expert asks for them.
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size

    expert = tl.load(block_experts_ptr + pid_m)
    if expert >= num_experts:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    mmask = pair < num_pairs
    row = (pair // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None] * stride_am + offs_k[None, :]
    w_ptrs = (
        w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    )
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=nmask[None, :], other=0.0)
        else:
            kmask = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST_DOT:
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + pair, mask=mmask, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def default_config(num_tokens: int, top_k: int, num_experts: int) -> dict[str, int]:
    """vLLM-style defaults: small row blocks while few tokens reach each expert."""
    per_expert = num_tokens * top_k / max(1, num_experts)
    if per_expert <= 16:
        return {"block_m": 16, "block_n": 64, "block_k": 128, "group_m": 1, "num_warps": 4, "num_stages": 4}
    if per_expert <= 64:
        return {"block_m": 64, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 4, "num_stages": 4}
    return {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3}


def candidate_configs() -> list[dict[str, int]]:
    """A curated search space: the shapes that win somewhere on Hopper, not the full product."""
    out = []
    for bm, bn, bk, warps, stages in (
        (16, 64, 128, 4, 4),
        (16, 64, 256, 4, 3),
        (16, 128, 128, 4, 5),
        (16, 256, 128, 8, 4),
        (32, 128, 128, 4, 4),
        (16, 128, 128, 4, 4),
        (16, 128, 64, 4, 5),
        (16, 256, 64, 4, 4),
        (32, 64, 128, 4, 4),
        (32, 128, 64, 4, 4),
        (32, 256, 64, 8, 3),
        (64, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 128, 128, 8, 3),
        (64, 256, 64, 8, 4),
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 3),
        (128, 128, 128, 8, 3),
    ):
        for group_m in (1, 8):
            out.append(
                {
                    "block_m": bm,
                    "block_n": bn,
                    "block_k": bk,
                    "group_m": group_m,
                    "num_warps": warps,
                    "num_stages": stages,
                }
            )
    return out


def moe_grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    *,
    config: dict[str, int] | None = None,
    alignment: MoEAlignment | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t, j] = a[t] @ w[topk_ids[t, j]].T (scaled by topk_weights[t, j] when given).

    a: [tokens, K]; w: [experts, N, K]; topk_ids: [tokens, top_k] int. Returns [tokens, top_k, N]
    in a's dtype. Pass `alignment` (from `moe_align` with the config's block_m) to reuse the sort
    across the layer's GEMMs.
    """
    num_tokens, k_dim = a.shape
    num_experts, n_dim, wk = w.shape
    if wk != k_dim:
        raise ValueError(f"weights [{num_experts}, {n_dim}, {wk}] do not match activations' K={k_dim}")
    if topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} rows for {num_tokens} tokens")
    if a.stride(1) != 1:
        raise ValueError("rows of a must be contiguous")
    top_k = topk_ids.shape[1]
    cfg = (
        config
        or config_table.lookup(OP, str(token_bucket(num_tokens)))
        or default_config(num_tokens, top_k, num_experts)
    )
    block_m = int(cfg["block_m"])
    if alignment is None or alignment.block_m != block_m:
        alignment = moe_align(topk_ids, num_experts, block_m)
    if out is None:
        out = torch.empty((num_tokens, top_k, n_dim), dtype=a.dtype, device=a.device)
    check_out(out, (num_tokens, top_k, n_dim), a.dtype, "out")
    if num_tokens == 0:
        return out
    num_blocks_m = alignment.block_experts.numel()
    block_n, block_k = int(cfg["block_n"]), int(cfg["block_k"])
    grid = (num_blocks_m * triton.cdiv(n_dim, block_n),)
    _moe_gemm_kernel[grid](
        a,
        w,
        out,
        topk_weights if topk_weights is not None else a,
        alignment.sorted_ids,
        alignment.block_experts,
        n_dim,
        k_dim,
        num_tokens * top_k,
        num_experts,
        num_blocks_m,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(1),
        TOP_K=top_k,
        MUL_WEIGHT=topk_weights is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=int(cfg["group_m"]),
        EVEN_K=k_dim % block_k == 0,
        UPCAST_DOT=interpreting() and a.dtype == torch.bfloat16,
        num_warps=int(cfg["num_warps"]),
        num_stages=int(cfg["num_stages"]),
    )
    return out


def moe_grouped_gemm_ref(
    a: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain-torch reference: one float32 matrix product per expert over the tokens routed to it."""
    num_tokens, top_k = topk_ids.shape
    out = torch.empty((num_tokens, top_k, w.shape[1]), dtype=a.dtype, device=a.device)
    for e in range(w.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = a[tok].float() @ w[e].float().T
        if topk_weights is not None:
            y = y * topk_weights[tok, slot].float()[:, None]
        out[tok, slot] = y.to(a.dtype)
    return out
