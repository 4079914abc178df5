"""Shared fixtures for the workload tests: the public traces ingested once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuning.workload import IngestResult, ingest_path


@pytest.fixture(scope="session")
def mooncake_path(shared_traces: Path) -> Path:
    return shared_traces / "mooncake_synthetic.jsonl"


@pytest.fixture(scope="session")
def azure_path(shared_traces: Path) -> Path:
    return shared_traces / "azure2023_conv.csv"


@pytest.fixture(scope="session")
def mooncake_result(mooncake_path: Path) -> IngestResult:
    return ingest_path(mooncake_path, keep_blocks=True)


@pytest.fixture(scope="session")
def azure_result(azure_path: Path) -> IngestResult:
    return ingest_path(azure_path)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory as `tailguard engine tiny-model` writes it (weights content irrelevant here)."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 4096,
                "intermediate_size": 384,
                "max_position_embeddings": 16384,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (root / "tokenizer.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"\0" * 16)
    return root
