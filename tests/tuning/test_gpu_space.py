"""The GPU search space: GPU knobs only, the checkpoint's precision as the reference, fit refused
with the memory arithmetic, and every new flag accepted or refused by vLLM's own parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine.config import EngineConfig, InvalidEngineConfig, validate_args, vllm_importable
from tailguard.cli import main as cli_main
from tuning.search.job import HARDWARE, JobSpec, JobSpecError, plan_job
from tuning.search.space import ModelLoadError, build_space, model_info

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def _config_only(root: Path, *, layers: int, hidden: int, inter: int, heads: int = 32, kv: int = 8) -> Path:
    """A model directory as `--load-format dummy` serves it: config.json and a tokenizer file."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": inter,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "head_dim": 128,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.fixture
def llama8b(tmp_path: Path) -> Path:
    return _config_only(tmp_path / "llama-3.1-8b", layers=32, hidden=4096, inter=14336)


@pytest.fixture
def llama70b(tmp_path: Path) -> Path:
    return _config_only(tmp_path / "llama-3.1-70b", layers=80, hidden=8192, inter=28672, heads=64)


def test_gpu_space_has_gpu_knobs_and_no_cpu_ones(llama8b: Path) -> None:
    space = build_space(
        model=model_info(llama8b, require_weights=False),
        hardware=HARDWARE["h200"],
        max_model_len=8192,
        load_format="dummy",
    )
    names = {k.name for k in space.knobs}
    assert {
        "quantization",
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "block_size",
        "cudagraph_mode",
    } <= names
    assert {"async_scheduling", "max_num_batched_tokens", "max_num_seqs"} <= names
    assert "cpu_worker_cores" not in names
    assert "float32" not in space.knob("dtype").values
    config = space.to_config({"cudagraph_mode": "PIECEWISE", "async_scheduling": False, "block_size": 32})
    assert not config.enforce_eager and config.cpu_kv_cache_space_gib is None
    args = config.to_args(model=str(llama8b))
    assert args[args.index("--load-format") + 1] == "dummy"
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"cudagraph_mode": "PIECEWISE"}
    assert "--no-async-scheduling" in args and "--enforce-eager" not in args
    assert "VLLM_CPU_KVCACHE_SPACE" not in config.to_env()


def test_a_model_that_does_not_fit_is_refused_with_the_arithmetic(llama70b: Path) -> None:
    space = build_space(
        model=model_info(llama70b, require_weights=False), hardware=HARDWARE["h200"], max_model_len=8192
    )
    problems = space.violations({})
    assert len(problems) == 1
    assert "does not fit" in problems[0] and "GiB of weights" in problems[0]
    # fp8 weights halve them: the same model then fits, with room for the KV cache
    assert space.violations({"quantization": "fp8"}) == []


def test_weights_are_required_unless_the_job_asks_for_random_ones(llama8b: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="load format 'dummy'"):
        model_info(llama8b)
    spec = JobSpec(
        trace_path=str(TRACES / "azure2023_conv.csv"),
        model_path=str(llama8b),
        slo="ttft_p50_ms<=600",
        peak_rps=2.0,
        hardware="h200",
        max_prompt_tokens=2048,
        max_output_tokens=256,
        max_model_len=4096,
    )
    with pytest.raises(JobSpecError, match="model_path"):
        plan_job(spec, tmp_path / "no-weights")
    with pytest.raises(JobSpecError, match="load_format"):
        plan_job(JobSpec(**{**spec.to_dict(), "load_format": "random"}), tmp_path / "bad-format")
    prepared = plan_job(JobSpec(**{**spec.to_dict(), "load_format": "dummy"}), tmp_path / "dummy")
    # the gate's reference on a GPU is the checkpoint's own precision, and so is the baseline
    assert prepared.reference["dtype"] == "bfloat16"
    assert prepared.space.key(prepared.competent) == prepared.space.key(prepared.reference)
    assert prepared.sim is not None  # the H200 calibration forecasts every trial
    # a GPU host replays with several load-generator processes (one loop cannot keep up)
    assert prepared.plan.client_processes == HARDWARE["h200"].client_processes > 1
    assert HARDWARE["local-cpu"].client_processes == 1


def test_cli_prints_the_gpu_space(llama8b: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        [
            "tune",
            "--trace",
            str(TRACES / "azure2023_conv.csv"),
            "--model",
            str(llama8b),
            "--slo",
            "ttft_p50_ms<=600",
            "--peak-rps",
            "2",
            "--hardware",
            "h200",
            "--load-format",
            "dummy",
            "--json",
            str(tmp_path / "out.json"),
            "--print-space",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "on h200" in out and "cudagraph_mode" in out and "cpu_worker_cores" not in out


@pytest.mark.skipif(not vllm_importable(), reason="vLLM's parser is needed")
def test_vllm_parser_accepts_the_gpu_flags_and_refuses_a_bad_one(llama8b: Path) -> None:
    good = EngineConfig(
        load_format="dummy", block_size=32, async_scheduling=False, cudagraph_mode="FULL_DECODE_ONLY"
    )
    validate_args(good.to_args(model=str(llama8b)))
    with pytest.raises(InvalidEngineConfig) as refused:
        validate_args(EngineConfig(kv_cache_dtype="fp9").to_args(model=str(llama8b)))
    assert refused.value.flag == "--kv-cache-dtype" and "fp9" in str(refused.value)


def test_exports_run_as_given(llama8b: Path, tmp_path: Path) -> None:
    """The chosen configuration's `vllm serve` line parses with vLLM's parser, and the reproduce
    command with Tailguard's own."""
    import shlex

    from tailguard.cli import build_parser
    from tuning.search.export import exports

    spec = JobSpec(
        trace_path=str(TRACES / "azure2023_conv.csv"),
        model_path=str(llama8b),
        slo="ttft_p50_ms<=600",
        peak_rps=2.0,
        hardware="h200",
        max_prompt_tokens=2048,
        max_output_tokens=256,
        max_model_len=4096,
        load_format="dummy",
    )
    prepared = plan_job(spec, tmp_path / "job")
    config = prepared.space.to_config({"max_num_batched_tokens": 16384, "cudagraph_mode": "PIECEWISE"})
    out = exports(spec=spec.to_dict(), config=config, label="test", gpu=True)
    words = shlex.split(out["vllm_serve"])
    assert words[:3] == ["vllm", "serve", str(llama8b)]
    assert "--max-num-batched-tokens" in words and "--port" not in words
    if vllm_importable():
        validate_args(["--model", *words[2:]])
    reproduce = shlex.split(out["reproduce"])
    args = build_parser().parse_args(reproduce[1:])
    assert args.hardware == "h200" and args.load_format == "dummy" and args.max_model_len == 4096
    assert "render-k8s" in out["kubernetes"] and "--hardware h200" in out["kubernetes"]


def test_gpu_benchmark_writes_a_qwen3_shape_that_fits_an_h200(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(TRACES.parents[1]))
    from benchmarks.gpu_tuning import write_shape

    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    model = model_info(write_shape("qwen3-32b", tmp_path / "qwen3-32b", tokenizer), require_weights=False)
    assert model.architecture == "Qwen3ForCausalLM" and 32e9 < model.num_params < 34e9
    space = build_space(model=model, hardware=HARDWARE["h200"], max_model_len=32768)
    assert space.violations({}) == []  # 61 GiB of bf16 weights fit; the KV cache holds a sequence
    (tokenizer / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": {str(i): i for i in range(200_000)}}})
    )
    with pytest.raises(SystemExit, match="exceed"):
        write_shape("qwen3-32b", tmp_path / "too-big", tokenizer)
