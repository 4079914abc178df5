"""The benchmarks' engine: this machine's vLLM CPU engine serving `tiny-llama-s`, always stopped."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serving.engine import EngineConfig, start_engine
from serving.models import build_tiny_model


@contextmanager
def tiny_llama_s_engine(model_dir: Path | None) -> Iterator[tuple[Any, Path, EngineConfig]]:
    """Yields (engine, model directory, config); builds the random-weight model when not given."""
    with tempfile.TemporaryDirectory() as tmp:
        if model_dir is None:
            model_dir = Path(tmp) / "llama-s"
            build_tiny_model(arch="llama", size="s", out_dir=model_dir, seed=0)
        config = EngineConfig.cpu_default(max_model_len=4096, cpu_kv_cache_space_gib=1, seed=0)
        engine = start_engine(model=str(model_dir), config=config, startup_timeout_s=600)
        try:
            yield engine, model_dir, config
        finally:
            engine.stop()
