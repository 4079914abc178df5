"""Engine configuration rendering and validation (no engine started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine import EngineConfig, InvalidEngineConfig, validate_args, vllm_importable


def test_renders_server_flags() -> None:
    config = EngineConfig(
        dtype="float32",
        max_model_len=4096,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
        scheduling_policy="priority",
        speculative_method="ngram",
        num_speculative_tokens=3,
        ngram_prompt_lookup_max=3,
        tensor_parallel_size=2,
        enforce_eager=True,
        served_model_name="m",
        extra_args=("--max-logprobs", "5"),
    )
    args = config.to_args(model="/models/x", port=9000)
    joined = " ".join(args)
    assert args[:6] == ["--model", "/models/x", "--host", "127.0.0.1", "--port", "9000"]
    assert "--dtype float32" in joined and "--max-model-len 4096" in joined
    assert "--max-num-seqs 16" in joined and "--max-num-batched-tokens 2048" in joined
    assert "--no-enable-chunked-prefill" in args and "--enable-prefix-caching" in args
    assert "--scheduling-policy priority" in joined and "--tensor-parallel-size 2" in joined
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert "--enforce-eager" in args and args[-2:] == ["--max-logprobs", "5"]


def test_engine_defaults_are_left_to_the_engine() -> None:
    args = EngineConfig().to_args(model="m")
    for flag in (
        "--max-num-seqs",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ):
        assert flag not in args


def test_environment_and_api_key_stay_out_of_repr() -> None:
    config = EngineConfig(cpu_kv_cache_space_gib=2, extra_env=(("VLLM_X", "1"),), api_key="sk-secret")
    assert config.to_env() == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_X": "1"}
    assert "sk-secret" not in repr(config)
    assert "api_key" not in config.to_mapping()


def test_from_file_round_trip_and_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"dtype": "float32", "max_num_seqs": 8, "extra_env": {"A": "b"}}))
    config = EngineConfig.from_file(path)
    assert config.max_num_seqs == 8 and config.extra_env == (("A", "b"),)
    toml = tmp_path / "engine.toml"
    toml.write_text('dtype = "bfloat16"\nenable_prefix_caching = false\n')
    assert EngineConfig.from_file(toml).enable_prefix_caching is False
    path.write_text(json.dumps({"max_num_seq": 8}))
    with pytest.raises(InvalidEngineConfig, match="max_num_seq"):
        EngineConfig.from_file(path)


def test_out_of_range_values_name_the_flag() -> None:
    with pytest.raises(InvalidEngineConfig) as excinfo:
        EngineConfig(max_num_seqs=0)
    assert excinfo.value.flag == "--max-num-seqs"
    with pytest.raises(InvalidEngineConfig):
        EngineConfig(speculative_method="ngram")


@pytest.mark.skipif(not vllm_importable(), reason="validation uses vLLM's own parser")
def test_vllm_parser_refuses_with_the_flag_named() -> None:
    validate_args(EngineConfig.cpu_default(max_num_seqs=4).to_args(model="/models/x"))
    with pytest.raises(InvalidEngineConfig) as excinfo:
        validate_args(EngineConfig(extra_args=("--no-such-flag",)).to_args(model="/models/x"))
    assert excinfo.value.flag == "--no-such-flag"
    with pytest.raises(InvalidEngineConfig) as excinfo:
        validate_args(EngineConfig(kv_cache_dtype="int3").to_args(model="/models/x"))
    assert excinfo.value.flag == "--kv-cache-dtype"
