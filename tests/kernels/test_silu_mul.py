from __future__ import annotations

import pytest
import torch

from kernels.silu_mul import candidate_configs, default_config, silu_and_mul, silu_and_mul_ref
from tests.kernels.device import DEVICE, ON_GPU
from tests.kernels.helpers import assert_close, assert_fp8_close

# (tokens, d): the input is [tokens, 2d]
SHAPES = [(1, 14336), (77, 5000), (4096, 14336), (2048, 768)] if ON_GPU else [(1, 64), (5, 300), (17, 1100)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator) -> None:
    n, d = shape
    x = torch.randn(n, 2 * d, device=DEVICE, dtype=dtype, generator=gen) * 3
    out = _poisoned((n, d), dtype)
    got = silu_and_mul(x, out=out)
    assert got.out is out and got.scale is None
    assert_close(out, silu_and_mul_ref(x).out, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_output_with_per_token_scale(
    shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator
) -> None:
    n, d = shape
    x = torch.randn(n, 2 * d, device=DEVICE, dtype=dtype, generator=gen) * 3
    out = _poisoned((n, d), torch.float8_e4m3fn)
    scale = _poisoned((n, 1), torch.float32)
    silu_and_mul(x, fp8=True, out=out, scale_out=scale)
    ref = silu_and_mul_ref(x, fp8=True)
    assert ref.scale is not None
    assert_fp8_close(out, scale, ref.out, ref.scale)


def test_fp8_two_pass_path_for_wide_rows(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows wider than MAX_WHOLE_ROW take the two-pass path; force it at a testable width."""
    from kernels import silu_mul as mod

    monkeypatch.setattr(mod, "MAX_WHOLE_ROW", 0)
    n, d = SHAPES[1]
    x = torch.randn(n, 2 * d, device=DEVICE, dtype=torch.bfloat16, generator=gen) * 3
    out = _poisoned((n, d), torch.float8_e4m3fn)
    scale = _poisoned((n, 1), torch.float32)
    silu_and_mul(x, fp8=True, out=out, scale_out=scale, config={"block_n": 128, "num_warps": 2})
    ref = silu_and_mul_ref(x, fp8=True)
    assert ref.scale is not None
    assert_fp8_close(out, scale, ref.out, ref.scale)


def test_every_candidate_config_is_correct(gen: torch.Generator) -> None:
    n, d = SHAPES[-1]
    x = torch.randn(n, 2 * d, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    ref = silu_and_mul_ref(x).out
    configs = candidate_configs(d) if ON_GPU else candidate_configs(d)[:3]
    for cfg in [*configs, default_config(n, d)]:
        out = _poisoned((n, d), torch.bfloat16)
        silu_and_mul(x, config=cfg, out=out)
        assert_close(out, ref, torch.bfloat16, f"out with {cfg}")


def test_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="2 \\* d"):
        silu_and_mul(torch.randn(3, 7, device=DEVICE))
