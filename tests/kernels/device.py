"""Where the kernel tests run and how closely they must match, decided once per session.

tests/kernels/conftest.py reads ON_GPU to switch Triton to its CPU interpreter before triton is
first imported; test modules import these names from here (never from the conftest).
"""

from __future__ import annotations

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TAILGUARD_KERNELS_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if ON_GPU else "cpu"

# ||out - ref|| / ||ref|| bounds by the dtype the kernel computes and stores in.
REL_TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# e4m3 keeps 3 mantissa bits: a round-off of up to 1/16 of each value, ~3% in norm.
FP8_REL_TOL = 0.05
