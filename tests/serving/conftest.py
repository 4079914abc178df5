"""Fixtures for the serving tests: one tiny model built once, one engine started once.

The machine has two cores shared with other work, so the whole session starts at most one
engine that serves (the launch-failure tests start short-lived ones that die during start-up,
and they run before it: pytest runs a module's tests in file order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.engine import EngineProcess, start_engine
from serving.models import build_tiny_model
from serving.models.tokenizer import build_tokenizer, save_tokenizer
from tests.serving.helpers import engine_config


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~4 MB random-weight Llama with its own tokenizer (built once per session)."""
    out = tmp_path_factory.mktemp("models") / "llama-s"
    build_tiny_model(arch="llama", size="s", out_dir=out, seed=0)
    return out


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the tokenizer of a small Llama-family model (fast: no weights, no torch)."""
    import numpy as np

    out = tmp_path_factory.mktemp("tokenizer") / "llama-xs"
    tokenizer = build_tokenizer(family="llama", vocab_size=2048, rng=np.random.default_rng(0))
    save_tokenizer(tokenizer, family="llama", out_dir=out, model_max_length=8192)
    return out


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """The session's one real vLLM engine serving the tiny model; always stopped at the end."""
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    process = start_engine(
        model=str(tiny_model_dir), config=engine_config(), log_path=log, startup_timeout_s=600
    )
    try:
        yield process
    finally:
        process.stop()
