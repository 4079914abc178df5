"""vLLM's fused-MoE table format: names as vLLM builds them, tables it would read, refusals, buckets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine import EngineConfig
from serving.engine import moe_tables as mt
from serving.engine.moe_tables import MoETableError, TableShape

VLLM_CONFIGS = (
    Path(__file__).resolve().parents[2]
    / ".venv/lib/python3.11/site-packages/vllm/model_executor/layers/fused_moe/configs"
)
ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


@pytest.mark.parametrize(
    ("gpu", "device"),
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),  # every H200 variant reads the H200 tables
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        ("AMD Instinct MI300X", "AMD_Instinct_MI300X"),
    ],
)
def test_device_names_as_vllm_writes_them(gpu: str, device: str) -> None:
    assert mt.device_file_name(gpu) == device


def test_file_names_round_trip_and_match_the_tables_vllm_ships() -> None:
    shape = mt.shape_for(
        num_experts=128, moe_intermediate_size=768, tensor_parallel_size=2, gpu_name="NVIDIA H200"
    )
    assert shape.file_name == "E=128,N=384,device_name=NVIDIA_H200.json"
    fp8 = TableShape(128, 768, "NVIDIA_H200", "fp8_w8a8", (128, 128))
    assert fp8.file_name == "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert TableShape.from_file_name(fp8.file_name) == fp8
    if VLLM_CONFIGS.is_dir():
        shipped = sorted(p.name for p in VLLM_CONFIGS.glob("*.json"))
        assert shape.file_name in shipped and fp8.file_name in shipped
        # Every table vLLM ships parses as ours, and reads back under its own name and checks.
        for name in shipped:
            if ",backend=" in name:  # another kernel's tables (AMD's FlyDSL), not the Triton kernel's
                continue
            assert TableShape.from_file_name(name).file_name == name
        table = mt.read_table(VLLM_CONFIGS / shape.file_name, expect=shape)
        assert tuple(table) == mt.BATCH_SIZE_KEYS


def test_write_then_read(tmp_path: Path) -> None:
    shape = TableShape(64, 768, "NVIDIA_H200")
    path = mt.write_table(tmp_path, shape, {8: ENTRY, 1: ENTRY | {"BLOCK_SIZE_N": 32}})
    assert path.name == "E=64,N=768,device_name=NVIDIA_H200.json"
    raw = json.loads(path.read_text())
    assert list(raw) == ["1", "8"]  # vLLM's layout: string keys, ascending
    assert mt.read_table(path, expect=shape) == {1: ENTRY | {"BLOCK_SIZE_N": 32}, 8: ENTRY}
    assert mt.read_folder(tmp_path, device_name="NVIDIA_H200") == {path.name: {1: raw["1"], 8: raw["8"]}}


@pytest.mark.parametrize(
    ("expect", "reason"),
    [
        (TableShape(64, 768, "NVIDIA_H100_80GB_HBM3"), "device NVIDIA_H200, not NVIDIA_H100_80GB_HBM3"),
        (TableShape(64, 768, "NVIDIA_H200", "fp8_w8a8"), "dtype bf16/fp16, not fp8_w8a8"),
        (TableShape(128, 768, "NVIDIA_H200"), "shape E=64,N=768, not E=128,N=768"),
        (TableShape(64, 384, "NVIDIA_H200"), "shape E=64,N=768, not E=64,N=384"),
    ],
)
def test_a_table_for_another_device_dtype_or_shape_is_refused(
    tmp_path: Path, expect: TableShape, reason: str
) -> None:
    path = mt.write_table(tmp_path, TableShape(64, 768, "NVIDIA_H200"), {1: ENTRY})
    with pytest.raises(MoETableError, match="refused") as err:
        mt.read_table(path, expect=expect)
    assert reason in str(err.value)
    with pytest.raises(MoETableError, match="device NVIDIA_H200"):
        mt.read_folder(tmp_path, device_name="NVIDIA_B200")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "object keyed by batch size"),
        ({}, "no entries"),
        ({"x": ENTRY}, "not a batch size"),
        ({"0": ENTRY}, "not a batch size"),
        ({"1": {**ENTRY, "BLOCK_SIZE_M": 48}}, "BLOCK_SIZE_M must be a power of two"),
        ({"1": {**ENTRY, "num_stages": 0}}, r"num_stages must be an integer in \[1, 8\]"),
        ({"1": {**ENTRY, "num_warps": "4"}}, "num_warps must be an integer"),
        ({"1": {k: v for k, v in ENTRY.items() if k != "GROUP_SIZE_M"}}, "missing GROUP_SIZE_M"),
        ({"1": {**ENTRY, "BLOCK_M": 16}}, "unknown field"),
        ({"1": {**ENTRY, "SPLIT_K": 2}}, "SPLIT_K must be 1"),
    ],
)
def test_bad_tables_are_refused_with_the_field(data: object, message: str) -> None:
    with pytest.raises(MoETableError, match=message):
        mt.parse_table(data)


def test_bad_names_and_shapes_are_refused(tmp_path: Path) -> None:
    for name in ("E=8,N=0,device_name=X.json", "moe.json", "E=8,N=16,device_name=a b.json"):
        with pytest.raises(MoETableError):
            TableShape.from_file_name(name)
    with pytest.raises(MoETableError, match="not a mixture of experts"):
        mt.shape_for(num_experts=0, moe_intermediate_size=768, tensor_parallel_size=1, gpu_name="NVIDIA H200")
    with pytest.raises(MoETableError, match="does not split"):
        mt.shape_for(num_experts=8, moe_intermediate_size=768, tensor_parallel_size=5, gpu_name="NVIDIA H200")
    with pytest.raises(MoETableError, match="not a vLLM dtype tag"):
        TableShape(8, 16, "NVIDIA_H200", "FP8,x")
    bad = tmp_path / "E=8,N=16,device_name=NVIDIA_H200.json"
    bad.write_text("{not json")
    with pytest.raises(MoETableError, match="line 1: not JSON"):
        mt.read_table(bad)
    with pytest.raises(MoETableError, match="not a folder"):
        mt.read_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MoETableError, match="holds no table"):
        mt.read_folder(tmp_path / "empty")


def test_nearest_key_is_vllms_rule() -> None:
    keys = mt.BATCH_SIZE_KEYS
    assert mt.nearest_key(keys, 1) == 1
    assert mt.nearest_key(keys, 3) == 2  # tie between 2 and 4: the smaller
    assert mt.nearest_key(keys, 20) == 16  # tie between 16 and 24
    assert mt.nearest_key(keys, 21) == 24
    assert mt.nearest_key(keys, 9000) == 4096


def test_buckets_weigh_time_not_step_counts() -> None:
    # 1000 one-token decode steps of 10 ms, 10 prefill steps of 8192 tokens at 500 ms.
    hist = {1: (1000, 10.0), 8192: (10, 5.0), 3: (10, 0.3), 5: (10, 0.1)}
    buckets = mt.bucket_steps(hist)
    by_key = {b.key: b for b in buckets}
    assert set(by_key) == {1, 2, 4, 8192}  # the grid extends to the largest step
    assert by_key[8192].weight == pytest.approx(5.0 / 15.4)
    assert by_key[1].steps == 1000 and by_key[1].points == ((1, 1.0),)
    assert sum(b.weight for b in buckets) == pytest.approx(1.0)
    # On vLLM's grid alone the 8192-token steps fall to the 4096 entry.
    assert {b.key for b in mt.bucket_steps(hist, keys=mt.BATCH_SIZE_KEYS)} == {1, 2, 4, 4096}
    with pytest.raises(ValueError, match="no step took any time"):
        mt.bucket_steps({4: (0, 0.0)})
    with pytest.raises(ValueError, match="bad entry"):
        mt.bucket_steps({0: (1, 1.0)})


def test_engine_config_points_vllm_at_the_folder() -> None:
    base = EngineConfig(extra_env=(("A", "1"), (mt.ENV_VAR, "/old")))
    config = mt.with_tables(base, "/etc/tailguard/moe-tables")
    assert mt.tables_folder(config) == "/etc/tailguard/moe-tables"
    assert config.to_env() == {"A": "1", mt.ENV_VAR: "/etc/tailguard/moe-tables"}
    assert mt.tables_folder(EngineConfig()) is None
    with pytest.raises(MoETableError, match="absolute path"):
        mt.with_tables(base, "tables")
