"""Comparison helpers and inputs shared by the kernel tests."""

from __future__ import annotations

import torch

from tests.kernels.device import FP8_REL_TOL, REL_TOL

# A workload profile as `tailguard profile TRACE --json` prints it (the kernels' tuning input).
PROFILE = {
    "num_requests": 1000,
    "duration_s": 100.0,
    "input_tokens": {
        "mean": 1200.0,
        "p50": 1000.0,
        "p90": 3000.0,
        "p95": 4000.0,
        "p99": 9000.0,
        "max": 20000.0,
    },
    "output_tokens": {"mean": 200.0, "p50": 120.0, "p90": 400.0, "p95": 450.0, "p99": 600.0, "max": 1000.0},
    "arrival": {"mean_rps": 10.0, "peak_rps_60s": 20.0, "interarrival_cv": 1.0},
    "prefix": {"reuse_ratio": None},
}


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
