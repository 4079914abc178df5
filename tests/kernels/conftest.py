"""Kernel tests run on the GPU when there is one, otherwise in Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, and conftest files are imported
before the test modules, so this is the place. The choice is made once per session:

- a CUDA GPU: kernels are compiled and the tests use full-size shapes;
- no GPU: TRITON_INTERPRET=1 and small shapes (the interpreter executes every program instance
  in numpy; a full-size shape would take hours).

TAILGUARD_KERNELS_INTERPRET=1 forces the interpreter even where a GPU exists.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from tests.kernels.device import DEVICE, ON_GPU

if not ON_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "triton was imported before tests/kernels/conftest.py could enable its interpreter"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here, or TAILGUARD_KERNELS_INTERPRET=1)")
    for item in items:
        if "gpu" in item.keywords and "tests/kernels" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh, seeded generator per test: fresh random inputs, reproducible failures."""
    return torch.Generator(device=DEVICE).manual_seed(int.from_bytes(os.urandom(4), "little"))
