from __future__ import annotations

import pytest
import torch

from kernels.rmsnorm import candidate_configs, default_config, fused_add_rmsnorm, fused_add_rmsnorm_ref
from tests.kernels.device import DEVICE, ON_GPU
from tests.kernels.helpers import assert_close, assert_fp8_close

# (tokens, hidden): odd sizes on purpose, so masks at both edges are exercised.
SHAPES = [(1, 4096), (257, 5120), (4096, 8192), (1000, 16384)] if ON_GPU else [(1, 64), (7, 200), (33, 512)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(n: int, h: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    x = torch.randn(n, h, device=DEVICE, dtype=dtype, generator=gen)
    r = torch.randn(n, h, device=DEVICE, dtype=dtype, generator=gen)
    w = torch.rand(h, device=DEVICE, dtype=dtype, generator=gen) + 0.5
    return x, r, w


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [True, False])
def test_matches_reference(
    shape: tuple[int, int], dtype: torch.dtype, with_residual: bool, gen: torch.Generator
) -> None:
    x, r, w = _inputs(*shape, dtype, gen)
    res = r if with_residual else None
    out, res_out = _poisoned(shape, dtype), _poisoned(shape, dtype)
    got = fused_add_rmsnorm(x, res, w, 1e-6, out=out, residual_out=res_out if with_residual else None)
    ref = fused_add_rmsnorm_ref(x, res, w, 1e-6)
    assert got.out is out
    assert_close(got.out, ref.out, dtype)
    if with_residual:
        assert got.residual_out is res_out and ref.residual_out is not None
        assert_close(got.residual_out, ref.residual_out, dtype, "residual_out")
    else:
        assert got.residual_out is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_output_with_per_token_scale(
    shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator
) -> None:
    x, r, w = _inputs(*shape, dtype, gen)
    out = _poisoned(shape, torch.float8_e4m3fn)
    scale = _poisoned((shape[0], 1), torch.float32)
    got = fused_add_rmsnorm(x, r, w, fp8=True, out=out, scale_out=scale)
    ref = fused_add_rmsnorm_ref(x, r, w, fp8=True)
    assert got.scale is scale and ref.scale is not None
    assert_fp8_close(got.out, scale, ref.out, ref.scale)


def test_in_place_residual_update(gen: torch.Generator) -> None:
    x, r, w = _inputs(*SHAPES[1], torch.float16, gen)
    ref = fused_add_rmsnorm_ref(x, r, w)
    got = fused_add_rmsnorm(x, r, w, residual_out=r)
    assert ref.residual_out is not None
    assert_close(r, ref.residual_out, torch.float16, "residual (in place)")
    assert_close(got.out, ref.out, torch.float16)


def test_every_candidate_config_is_correct(gen: torch.Generator) -> None:
    n, h = SHAPES[-1]
    x, r, w = _inputs(n, h, torch.bfloat16, gen)
    ref = fused_add_rmsnorm_ref(x, r, w)
    configs = candidate_configs(h) if ON_GPU else candidate_configs(h)[:3]
    assert configs, f"no candidate config for hidden {h}"
    # The heuristic used where no tuned table covers a bucket need not be a candidate: check it too.
    default = default_config(n, h)
    if default not in configs:
        configs.append(default)
    for cfg in configs:
        out = _poisoned((n, h), torch.bfloat16)
        fused_add_rmsnorm(x, r, w, config=cfg, out=out)
        assert_close(out, ref.out, torch.bfloat16, f"out with {cfg}")


def test_rejects_bad_shapes() -> None:
    x = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        fused_add_rmsnorm(x, None, torch.ones(7, device=DEVICE))
    with pytest.raises(ValueError, match="residual"):
        fused_add_rmsnorm(x, torch.randn(4, 9, device=DEVICE), torch.ones(8, device=DEVICE))
    with pytest.raises(ValueError, match="out must be"):
        fused_add_rmsnorm(x, None, torch.ones(8, device=DEVICE), out=torch.empty(4, 8, dtype=torch.float16))
