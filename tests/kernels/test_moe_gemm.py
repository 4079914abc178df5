from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels.moe_gemm import (
    MoEAlignment,
    candidate_configs,
    default_config,
    moe_align,
    moe_align_ref,
    moe_grouped_gemm,
    moe_grouped_gemm_ref,
)
from tests.kernels.device import DEVICE, ON_GPU
from tests.kernels.helpers import assert_close

# (tokens, K, N, experts, top_k)
if ON_GPU:
    SHAPES = [
        (1, 4096, 14336, 8, 2),
        (37, 2048, 1536, 128, 8),
        (512, 4096, 2048, 8, 2),
        (2000, 1024, 3000, 16, 4),
    ]
    CONFIGS = [None, *candidate_configs()[::5]]
else:
    SHAPES = [(1, 64, 48, 4, 2), (20, 64, 48, 4, 2), (9, 80, 40, 8, 3)]  # 80: K not a block multiple
    CONFIGS = [
        None,
        {"block_m": 16, "block_n": 32, "block_k": 32, "group_m": 2, "num_warps": 4, "num_stages": 2},
        {"block_m": 32, "block_n": 16, "block_k": 64, "group_m": 1, "num_warps": 4, "num_stages": 2},
    ]


def make_inputs(
    n: int, k: int, nn: int, experts: int, top_k: int, dtype: torch.dtype, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    scores = torch.rand(n, experts, device=DEVICE, generator=gen)
    weights, ids = scores.topk(top_k, dim=1)
    return {
        "a": torch.randn(n, k, device=DEVICE, dtype=dtype, generator=gen),
        "w": torch.randn(experts, nn, k, device=DEVICE, dtype=dtype, generator=gen) * k**-0.5,
        "topk_ids": ids.to(torch.int32),
        "topk_weights": weights,
    }


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg_index", range(len(CONFIGS)))
@pytest.mark.parametrize("weighted", [True, False])
def test_matches_reference(
    shape: tuple[int, ...], dtype: torch.dtype, cfg_index: int, weighted: bool, gen: torch.Generator
) -> None:
    inp = make_inputs(*shape, dtype, gen)
    tw = inp["topk_weights"] if weighted else None
    ref = moe_grouped_gemm_ref(inp["a"], inp["w"], inp["topk_ids"], tw)
    out = torch.full_like(ref, float("nan"))
    got = moe_grouped_gemm(inp["a"], inp["w"], inp["topk_ids"], tw, config=CONFIGS[cfg_index], out=out)
    assert got is out
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("block_m", [1, 4, 16])
@pytest.mark.parametrize("align", [moe_align, moe_align_ref])
@pytest.mark.parametrize("experts", [6, 40])
def test_align_groups_pairs_by_expert(
    block_m: int, align: Callable[..., MoEAlignment], experts: int, gen: torch.Generator
) -> None:
    n, top_k = 50, 2
    ids = torch.rand(n, experts, device=DEVICE, generator=gen).topk(top_k, dim=1).indices.to(torch.int32)
    al = align(ids, experts, block_m)
    ref = moe_align_ref(ids, experts, block_m)
    assert torch.equal(al.block_experts, ref.block_experts)
    pairs = n * top_k
    sorted_ids = al.sorted_ids.view(-1, block_m)
    flat = ids.reshape(-1).long()
    seen = []
    for blk, expert in enumerate(al.block_experts.tolist()):
        rows = sorted_ids[blk]
        real = rows[rows < pairs].long()
        if expert >= experts:
            assert real.numel() == 0, "an unused block holds pairs"
            continue
        assert (flat[real] == expert).all(), "a block mixes experts"
        seen.append(real)
    assert torch.sort(torch.cat(seen)).values.tolist() == list(range(pairs)), "every pair exactly once"


def test_default_configs_grow_with_tokens() -> None:
    small, large = default_config(4, 2, 8), default_config(8192, 2, 8)
    assert small["block_m"] < large["block_m"]


def test_rejects_mismatched_k() -> None:
    a = torch.randn(3, 16, device=DEVICE)
    w = torch.randn(2, 8, 32, device=DEVICE)
    with pytest.raises(ValueError, match="K=16"):
        moe_grouped_gemm(a, w, torch.zeros(3, 1, dtype=torch.int32, device=DEVICE))
