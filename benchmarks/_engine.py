"""The benchmarks' engine: this machine's vLLM CPU engine serving `tiny-llama-s`, always stopped;
and steady decode, the step time at a batch size, measured on any engine."""

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


def steady_decode_tpots(
    url: str, *, batch: int, bursts: int, prompt_tokens: int, output_tokens: int, seed: int
) -> list[float]:
    """TPOTs (ms) of `bursts` bursts of `batch` requests sent at once, short prompts, outputs of a
    fixed length: after the first token every step is a decode step of `batch` sequences, so TPOT
    is the engine's step time at that batch. One client process per 32 streams keeps the
    client's event loop out of the figure."""
    from serving.loadgen.api import replay_generated

    tpots: list[float] = []
    for burst in range(bursts):
        result = replay_generated(
            endpoint=url,
            num_requests=batch,
            rate_rps=batch * 1000.0,  # all sent within a millisecond or so
            arrival_cv=0.0,
            num_prompt_tokens=prompt_tokens,
            num_output_tokens=output_tokens,
            seed=seed + burst,
            progress=False,
            client_processes=min(8, -(-batch // 32)),
        )
        tpots += [round(r.tpot_ms, 4) for r in result.requests if r.tpot_ms is not None]
    return tpots
