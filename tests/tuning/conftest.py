"""Shared fixtures for the workload tests: the public traces ingested once per session."""

from __future__ import annotations

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
