"""Comparison helpers shared by the kernel tests."""

from __future__ import annotations

import torch

from tests.kernels.conftest import FP8_REL_TOL, REL_TOL


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in `out` gives NaN, which fails every bound."""
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm())


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "out") -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out.float()).all(), f"{what}: unwritten (NaN-poisoned) or non-finite elements"
    err = rel_err(out, ref)
    assert err < REL_TOL[dtype], f"{what}: relative error {err:.3g} over {REL_TOL[dtype]:g} for {dtype}"
    # A norm bound can hide a few wrong elements in a large tensor; bound the worst one too.
    worst = float((out.double() - ref.double()).abs().max())
    scale = float(ref.double().abs().max())
    assert worst <= 20 * REL_TOL[dtype] * scale, f"{what}: max abs error {worst:.3g} (ref max {scale:.3g})"


def assert_fp8_close(
    q: torch.Tensor, scale: torch.Tensor, ref_q: torch.Tensor, ref_scale: torch.Tensor
) -> None:
    """Quantised output: the scales match the reference's, the dequantised values its values."""
    assert q.dtype == torch.float8_e4m3fn
    assert torch.isfinite(scale).all(), "scale: unwritten elements"
    # Both scales come from float32 arithmetic on the same inputs.
    assert_close(scale, ref_scale, torch.float16, "scale")
    deq = q.float() * scale
    ref = ref_q.float() * ref_scale
    assert torch.isfinite(deq).all(), "fp8 out: unwritten (NaN-poisoned) elements"
    err = rel_err(deq, ref)
    assert err < FP8_REL_TOL, f"fp8 out: relative error {err:.3g}"
    # The same float32 value rounds to the same code; codes may differ by one step only where
    # the kernel's float32 value and the reference's straddle a rounding boundary.
    same = (q.view(torch.uint8) == ref_q.view(torch.uint8)).float().mean().item()
    assert same > 0.97, f"only {same:.1%} of fp8 codes equal the reference's"
