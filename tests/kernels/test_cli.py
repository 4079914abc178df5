from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels.cli import register
from tests.kernels.device import ON_GPU
from tests.kernels.helpers import PROFILE


def _run(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tailguard")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE), encoding="utf-8")
    return path


@pytest.mark.skipif(ON_GPU, reason="checks the behaviour on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_fails(
    profile_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "table.json"
    status = _run(
        ["kernels", "tune", "--model", "mixtral-8x7b", "--profile", str(profile_file), "--out", str(out)]
    )
    assert status != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_bad_inputs_are_explained(
    profile_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["kernels", "tune", "--model", "no-such-model", "--profile", str(profile_file)]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"input_tokens": {}}', encoding="utf-8")
    assert _run(["kernels", "tune", "--model", "llama-3.1-8b", "--profile", str(bad)]) == 2
    assert "output_tokens" in capsys.readouterr().err or "input_tokens" in capsys.readouterr().err
    assert (
        _run(["kernels", "tune", "--model", "llama-3.1-8b", "--profile", str(tmp_path / "missing.json")]) == 2
    )
    assert "cannot read profile" in capsys.readouterr().err


def test_model_from_a_config_json(tmp_path: Path) -> None:
    from kernels.models import resolve_model

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_attention_heads": 16,
                "num_key_value_heads": 4,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
            }
        ),
        encoding="utf-8",
    )
    m = resolve_model(str(tmp_path))
    assert (m.head_dim, m.num_kv_heads, m.num_experts, m.moe_intermediate_size) == (64, 4, 8, 4096)


@pytest.mark.gpu
def test_tune_writes_a_table_the_wrappers_read(profile_file: Path, tmp_path: Path) -> None:
    from kernels import config_table

    out = tmp_path / "table.json"
    status = _run(
        [
            "kernels",
            "tune",
            "--model",
            "qwen3-30b-a3b",
            "--profile",
            str(profile_file),
            "--out",
            str(out),
            "--rep-ms",
            "5",
        ]
    )
    assert status == 0
    table = json.loads(out.read_text())
    assert set(table["ops"]) == {"rmsnorm", "silu_mul", "decode_attention", "moe_gemm"}
    for op, entries in table["ops"].items():
        for bucket, entry in entries.items():
            assert entry["time_us"] > 0, (op, bucket)
            assert entry["config"] in [c["config"] for c in entry["candidates"]]
    loaded = config_table.ConfigTable.load(out)
    assert loaded.lookup("rmsnorm", next(iter(table["ops"]["rmsnorm"]))) is not None
