"""Paged decode attention with grouped-query heads over a block-table KV cache.

Each sequence in the batch has one new query token. Its keys and values live in a paged cache
`k_cache`, `v_cache` of shape [num_blocks, page_size, num_kv_heads, head_dim] (vLLM's layout);
row b of `block_tables` lists the cache blocks that hold sequence b's tokens in order.

One program handles one (sequence, KV head, context split): it loads the group of query heads
that share the KV head (GQA: the K and V bytes are read once for the whole group, which is the
point of the fusion), walks its slice of the context `block_n` tokens at a time through the
block table, and keeps an online softmax. Long contexts with few sequences would leave most of
the GPU idle, so the context is split into `split_tokens` slices processed in parallel; a
second small kernel merges the partial results with their log-sum-exp weights (flash-decoding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import config_table
from kernels._common import attention_bucket, check_out, interpreting, next_pow2

OP = "decode_attention"
# Programs wanted in flight: about two per multiprocessor of an H100/H200 (132 SMs).
_TARGET_PROGRAMS = 264


@triton.jit
def _paged_decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seqlens_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kp,
    stride_kh,
    stride_vb,
    stride_vp,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    split_tokens,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    # KV heads vary fastest across the grid, so the programs in flight together read all heads
    # of the same pages: in this cache layout one token's heads sit side by side (2 KiB for 8
    # heads of 128), and reading them together keeps DRAM accesses within open rows.
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(seqlens_ptr + b)
    start = split * split_tokens
    end = tl.minimum(start + split_tokens, seqlen)

    g = tl.arange(0, GROUP_PAD)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nmask = offs < end
        page = tl.load(bt_row + offs // PAGE, mask=nmask, other=0).to(tl.int64)
        slot = offs % PAGE
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr + page[:, None] * stride_kb + slot[:, None] * stride_kp + kvh * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + page[:, None] * stride_vb + slot[:, None] * stride_vp + kvh * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        if UPCAST_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(nmask[None, :], s * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if UPCAST_DOT:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # An empty split (its start past this sequence's end) has l_i == 0: it contributes weight 0.
    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    omask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        base = b.to(tl.int64) * stride_pb + split * stride_ps
        tl.store(part_o_ptr + base + heads[:, None] * stride_ph + d[None, :], o, mask=omask)
        tl.store(part_lse_ptr + (base + heads * stride_ph) // HEAD_DIM, lse, mask=gmask)
    else:
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=omask,
        )


@triton.jit
def _merge_splits_kernel(  # type: ignore[no-untyped-def]
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    smask = s < num_splits
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_DIM
    base = b * stride_pb + h * stride_ph
    lse = tl.load(part_lse_ptr + (base + s * stride_ps) // HEAD_DIM, mask=smask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp(lse - m)
    w = tl.where(smask, w, 0.0)
    o = tl.load(
        part_o_ptr + base + s[:, None] * stride_ps + d[None, :],
        mask=smask[:, None] & dmask[None, :],
        other=0.0,
    )
    res = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty), mask=dmask)


def default_config(num_seqs: int, num_kv_heads: int, max_seq_len: int) -> dict[str, int]:
    """Split the context only as far as needed to put ~2 programs on every multiprocessor."""
    block_n = 64
    want_splits = max(1, -(-_TARGET_PROGRAMS // max(1, num_seqs * num_kv_heads)))
    split_tokens = -(-max_seq_len // want_splits)
    split_tokens = max(256, -(-split_tokens // block_n) * block_n)
    return {"block_n": block_n, "split_tokens": split_tokens, "num_warps": 4, "num_stages": 2}


def candidate_configs(max_seq_len: int) -> list[dict[str, int]]:
    out = []
    splits = [0, 256, 512, 1024, 2048, 4096]  # 0 = whole context in one program
    for split_tokens in splits:
        if split_tokens and split_tokens >= max_seq_len:
            continue
        for block_n in (32, 64, 128):
            for num_warps in (4, 8):
                # 4 stages of 128-token K and V tiles would need 256 KiB of shared memory
                for num_stages in (2, 3) if block_n == 128 else (2, 3, 4):
                    out.append(
                        {
                            "block_n": block_n,
                            "split_tokens": split_tokens,
                            "num_warps": num_warps,
                            "num_stages": num_stages,
                        }
                    )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged KV cache.

    q: [num_seqs, num_heads, head_dim]; k_cache, v_cache: [num_blocks, page_size, num_kv_heads,
    head_dim]; block_tables: [num_seqs, max_blocks] int32; seq_lens: [num_seqs] int32 (>= 1).
    `max_seq_len` (an upper bound of seq_lens) saves a device-to-host read when given.
    Returns [num_seqs, num_heads, head_dim] in q's dtype.
    """
    num_seqs, num_heads, head_dim = q.shape
    _, page, num_kv_heads, kd = k_cache.shape
    if kd != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"cache shapes {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not match q {tuple(q.shape)}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension of q and the caches")
    if page & (page - 1):
        raise ValueError(f"page size {page} must be a power of two")
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if num_seqs else 0
    group = num_heads // num_kv_heads
    cfg = (
        config
        or config_table.lookup(OP, attention_bucket(num_seqs, max_seq_len))
        or default_config(num_seqs, num_kv_heads, max_seq_len)
    )
    if out is None:
        out = torch.empty_like(q)
    check_out(out, tuple(q.shape), q.dtype, "out")
    if num_seqs == 0:
        return out
    sm_scale = float(scale if scale is not None else head_dim**-0.5)
    block_n = int(cfg["block_n"])
    split_tokens = int(cfg["split_tokens"])
    if split_tokens <= 0 or split_tokens >= max_seq_len:
        split_tokens = max(max_seq_len, 1)
    split_tokens = -(-split_tokens // block_n) * block_n
    num_splits = max(1, -(-max_seq_len // split_tokens))
    d_pad = next_pow2(head_dim)
    # tl.dot needs at least 16 rows; a GQA group of 4 or 8 heads is padded with masked rows.
    group_pad = max(16, next_pow2(group))
    if num_splits > 1:
        part_o = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        # One lse per (seq, head, split), addressed with part_o's strides divided by head_dim.
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        ps = part_o.stride()
    else:
        part_o = part_lse = out
        ps = (0, 0, 0, 0)
    upcast = interpreting() and q.dtype == torch.bfloat16
    _paged_decode_kernel[(num_kv_heads, num_splits, num_seqs)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_o,
        part_lse,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        ps[0],
        ps[1],
        ps[2],
        split_tokens,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        PAGE=page,
        BLOCK_N=block_n,
        SPLIT=num_splits > 1,
        UPCAST_DOT=upcast,
        num_warps=int(cfg["num_warps"]),
        num_stages=int(cfg["num_stages"]),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            part_o,
            part_lse,
            out,
            num_splits,
            ps[0],
            ps[1],
            ps[2],
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            S_PAD=next_pow2(num_splits),
            num_warps=4,
        )
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Plain-torch reference: gather each sequence's keys and values, softmax in float32."""
    num_seqs, num_heads, head_dim = q.shape
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    sm_scale = scale if scale is not None else head_dim**-0.5
    out = torch.empty_like(q)
    for b in range(num_seqs):
        n = int(seq_lens[b])
        pos = torch.arange(n, device=q.device)
        blocks = block_tables[b, pos // page].long()
        k = k_cache[blocks, pos % page].float().repeat_interleave(group, dim=1)  # [n, H, D]
        v = v_cache[blocks, pos % page].float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v).to(q.dtype)
    return out
