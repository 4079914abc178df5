from __future__ import annotations

import pytest
import torch

from kernels.decode_attention import (
    candidate_configs,
    default_config,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from tests.kernels.device import DEVICE, ON_GPU
from tests.kernels.helpers import assert_close

# (num_seqs, num_heads, num_kv_heads, head_dim, page_size, max_seq_len)
if ON_GPU:
    SHAPES = [
        (1, 32, 8, 128, 16, 1),
        (16, 32, 8, 128, 16, 4096),
        (3, 64, 8, 128, 16, 32768),  # long context, few sequences: split over the context
        (33, 28, 4, 128, 32, 1500),
        (8, 16, 16, 64, 16, 777),  # MHA
        (4, 12, 2, 96, 16, 999),  # head_dim not a power of two
    ]
else:
    SHAPES = [
        (1, 4, 2, 32, 16, 1),
        (3, 8, 2, 64, 16, 200),
        (2, 16, 2, 32, 8, 90),  # GQA group of 8
        (2, 4, 4, 96, 16, 70),  # MHA, head_dim not a power of two
    ]
# split_tokens 0 = one program per (sequence, KV head); the others split the context.
SPLITS = [0, 512, 2048] if ON_GPU else [0, 64]


def make_inputs(
    num_seqs: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    page: int,
    max_len: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Random lengths up to max_len (the first exactly max_len), blocks scattered over a cache
    with spare blocks, so wrong block-table indexing reads the wrong data."""
    lens = torch.randint(1, max_len + 1, (num_seqs,), device=DEVICE, generator=gen)
    lens[0] = max_len
    per_seq = -(-max_len // page)
    num_blocks = num_seqs * per_seq + 7
    perm = torch.randperm(num_blocks, device=DEVICE, generator=gen)[: num_seqs * per_seq]
    return {
        "q": torch.randn(num_seqs, heads, head_dim, device=DEVICE, dtype=dtype, generator=gen),
        "k_cache": torch.randn(
            num_blocks, page, kv_heads, head_dim, device=DEVICE, dtype=dtype, generator=gen
        ),
        "v_cache": torch.randn(
            num_blocks, page, kv_heads, head_dim, device=DEVICE, dtype=dtype, generator=gen
        ),
        "block_tables": perm.reshape(num_seqs, per_seq).to(torch.int32),
        "seq_lens": lens.to(torch.int32),
    }


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("split_tokens", SPLITS)
def test_matches_reference(
    shape: tuple[int, ...], dtype: torch.dtype, split_tokens: int, gen: torch.Generator
) -> None:
    inp = make_inputs(*shape, dtype, gen)
    ref = paged_decode_attention_ref(**inp)
    out = torch.full_like(inp["q"], float("nan"))
    cfg = {"block_n": 64 if ON_GPU else 32, "split_tokens": split_tokens, "num_warps": 4, "num_stages": 2}
    got = paged_decode_attention(**inp, config=cfg, out=out)
    assert got is out
    assert_close(out, ref, dtype)


def test_default_config_and_scale(gen: torch.Generator) -> None:
    inp = make_inputs(*SHAPES[1], torch.float16, gen)
    ref = paged_decode_attention_ref(**inp, scale=0.3)
    out = torch.full_like(inp["q"], float("nan"))
    paged_decode_attention(**inp, scale=0.3, out=out)  # max_seq_len read from seq_lens
    assert_close(out, ref, torch.float16)
    cfg = default_config(num_seqs=1, num_kv_heads=8, max_seq_len=32768)
    assert cfg["split_tokens"] < 32768, "one long sequence must be split over the context"


@pytest.mark.gpu
def test_every_candidate_config_is_correct(gen: torch.Generator) -> None:
    shape = SHAPES[2]
    inp = make_inputs(*shape, torch.bfloat16, gen)
    ref = paged_decode_attention_ref(**inp)
    for cfg in candidate_configs(shape[-1]):
        out = torch.full_like(inp["q"], float("nan"))
        paged_decode_attention(**inp, max_seq_len=shape[-1], config=cfg, out=out)
        assert_close(out, ref, torch.bfloat16, f"out with {cfg}")


def test_rejects_mismatched_heads() -> None:
    q = torch.randn(2, 6, 32, device=DEVICE)
    k = torch.randn(4, 16, 4, 32, device=DEVICE)
    bt = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    sl = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(q, k, k, bt, sl)
