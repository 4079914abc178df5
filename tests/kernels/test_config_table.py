from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernels import config_table
from kernels.silu_mul import silu_and_mul, silu_and_mul_ref
from tests.kernels.device import DEVICE
from tests.kernels.helpers import assert_close


@pytest.fixture(autouse=True)
def _no_table() -> Iterator[None]:
    config_table.use_table(None)
    yield
    config_table.use_table(None)


def _table(path: Path, cfg: dict[str, int]) -> Path:
    path.write_text(
        json.dumps({"schema": 1, "ops": {"silu_mul": {"8": {"config": cfg, "time_us": 1.0}}}}),
        encoding="utf-8",
    )
    return path


def test_wrappers_use_the_installed_table(tmp_path: Path, gen: torch.Generator) -> None:
    x = torch.randn(7, 2 * 100, device=DEVICE, generator=gen)  # 7 tokens -> bucket "8"
    # A block of 3 columns is no power of two: triton refuses it, which proves the entry is read.
    config_table.use_table(
        config_table.ConfigTable.load(_table(tmp_path / "bad.json", {"block_n": 3, "num_warps": 1}))
    )
    with pytest.raises(Exception):  # noqa: B017 - whatever triton raises for a bad tile
        silu_and_mul(x)
    config_table.use_table(
        config_table.ConfigTable.load(_table(tmp_path / "ok.json", {"block_n": 32, "num_warps": 1}))
    )
    assert config_table.lookup("silu_mul", "8") == {"block_n": 32, "num_warps": 1}
    assert_close(silu_and_mul(x).out, silu_and_mul_ref(x).out, torch.float32)
    assert config_table.lookup("silu_mul", "16") is None  # other buckets fall back to the heuristic


def test_environment_variable_names_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _table(tmp_path / "t.json", {"block_n": 64, "num_warps": 2})
    monkeypatch.setenv(config_table.ENV_VAR, str(path))
    monkeypatch.setattr(config_table, "_env_loaded", False)
    assert config_table.lookup("silu_mul", "8") == {"block_n": 64, "num_warps": 2}


def test_rejects_unknown_schema(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"schema": 99, "ops": {}}', encoding="utf-8")
    with pytest.raises(ValueError, match="schema 99"):
        config_table.ConfigTable.load(path)
