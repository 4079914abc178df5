"""Helpers the kernel modules share: shape buckets, FP8 constants, interpreter detection.

Nothing here imports torch or triton at module level, so `kernels.workload` and the CLI stay
importable (and cheap) on machines without either.
"""

from __future__ import annotations

import os
from typing import Any

# float8_e4m3fn: the largest finite value. Per-token scales map each row's absolute maximum to it.
FP8_E4M3_MAX = 448.0
# A row of all-zero activations would give a zero scale and a 0/0 quantisation; clamp the amax.
FP8_MIN_AMAX = 1e-12


def check_out(out: Any, shape: tuple[int, ...], dtype: Any, name: str) -> None:
    """Validate a caller-provided output buffer (a torch tensor)."""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dtype} tensor of shape {tuple(shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def token_bucket(num_tokens: int) -> int:
    """The token-count bucket a batch of `num_tokens` rows belongs to: the next power of two.

    Power-of-two buckets keep the table small (14 entries up to 8192 tokens) while a
    configuration tuned for a bucket stays close to optimal for every count inside it: block
    shapes are powers of two too, so their padding waste is bounded by 2x inside a bucket.
    """
    return next_pow2(max(1, num_tokens))


def attention_bucket(num_seqs: int, max_seq_len: int) -> str:
    """Bucket key of a decode-attention batch: batch and context length, each rounded up to 2^k."""
    return f"b{next_pow2(max(1, num_seqs))}_c{next_pow2(max(1, max_seq_len))}"
