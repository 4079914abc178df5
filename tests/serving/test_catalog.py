"""Catalog consistency: every figure sourced and dated, shapes match published sizes, fit refusals."""

from __future__ import annotations

import pytest

from serving.catalog import HARDWARE, MODELS, ModelDoesNotFit, check_fit, get_hardware, get_model
from serving.catalog.hardware import UnknownHardware, hardware_in_regions
from serving.catalog.models import UnknownModel
from serving.models.tiny import SIZES, describe_size

REQUIRED_HARDWARE = {"h100", "h200", "b200", "b300", "mi300x", "mi355x", "tpu-v6e", "trainium2", "local-cpu"}


def test_the_catalog_covers_the_accelerators_customers_choose_between() -> None:
    assert set(HARDWARE) >= REQUIRED_HARDWARE


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_figure_has_a_source_and_a_date(name: str) -> None:
    hw = HARDWARE[name]
    assert "bf16" in hw.dense_tflops or "fp32" in hw.dense_tflops
    assert hw.engines and hw.regions
    for key, figure in hw.figures().items():
        assert figure.source.strip(), f"{name}.{key} has no source"
        assert len(figure.as_of) >= 4 and figure.as_of[:2] == "20", f"{name}.{key} has no date"
        if figure.confirmed:
            assert "UNCONFIRMED" not in figure.source
            assert "http" in figure.source or "measured" in figure.source or "no " in figure.source, (
                f"{name}.{key}: a confirmed figure names where it comes from"
            )
        else:
            assert figure.source.startswith("UNCONFIRMED"), f"{name}.{key}: unconfirmed figures say so"
    for region in hw.regions:
        assert region.code in {"us", "eu", "asia", "local"}
        assert region.confirmed or "UNCONFIRMED" in region.source


def test_datasheet_figures_are_in_plausible_relations() -> None:
    for name, hw in HARDWARE.items():
        if name == "local-cpu":
            continue
        assert hw.memory_gb.value >= 32
        if "fp8" in hw.dense_tflops:
            assert hw.dense_tflops["fp8"].value == pytest.approx(2 * hw.dense_tflops["bf16"].value, rel=0.05)
        if "fp4" in hw.dense_tflops:
            assert hw.dense_tflops["fp4"].value >= hw.dense_tflops["fp8"].value
    assert get_hardware("h200").memory_bandwidth_gbps.value > get_hardware("h100").memory_bandwidth_gbps.value
    # Peak lookups fall back to a wider format the device has (TPU v6e has no fp8 figure).
    assert get_hardware("tpu-v6e").peak_flops("fp8") == get_hardware("tpu-v6e").peak_flops("bf16")


def test_regions_answer_data_residency_questions() -> None:
    eu = {hw.name for hw in hardware_in_regions({"eu"})}
    assert "tpu-v6e" in eu and "local-cpu" not in eu
    assert {hw.name for hw in hardware_in_regions({"local"})} == {"local-cpu"}


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownHardware, match="h200"):
        get_hardware("a100")
    with pytest.raises(UnknownModel, match=r"llama-3\.1-8b"):
        get_model("gpt-5")
    assert get_hardware("CPU").name == "local-cpu"


@pytest.mark.parametrize("name", [m for m in MODELS if MODELS[m].published_params_b])
def test_parameter_counts_match_the_published_sizes(name: str) -> None:
    spec = MODELS[name]
    assert spec.published_params_b is not None
    assert spec.num_parameters() / 1e9 == pytest.approx(spec.published_params_b, rel=0.02)


def test_moe_and_mla_costs() -> None:
    ds = get_model("deepseek-v3")
    assert ds.num_active_parameters() / 1e9 == pytest.approx(37, rel=0.05)
    # MLA caches one 512 + 64 latent per layer: ~70 KB/token in bf16, vs 320 KB for Llama 70B's GQA.
    assert ds.kv_bytes_per_token("bf16") == 61 * 576 * 2
    assert get_model("llama-3.1-70b").kv_bytes_per_token("bf16") == 80 * 2 * 8 * 128 * 2
    assert (
        get_model("llama-3.1-8b").kv_bytes_per_token("fp8")
        == get_model("llama-3.1-8b").kv_bytes_per_token() / 2
    )
    moe = get_model("qwen3-30b-a3b")
    one = moe.weight_bytes_touched(1)
    many = moe.weight_bytes_touched(4096)
    assert moe.num_active_parameters() * 2 <= one < many <= moe.weight_bytes()
    flops, data = moe.decode_cost(1000)
    assert flops > 2 * moe.num_active_parameters() * 0.9 and data > one


def test_prefill_and_decode_costs_scale_as_expected() -> None:
    spec = get_model("llama-3.1-8b")
    f1, _ = spec.prefill_cost(1000)
    f2, _ = spec.prefill_cost(2000)
    assert 2.0 < f2 / f1 < 2.5  # linear part plus a quadratic attention part
    d_short, b_short = spec.decode_cost(100)
    d_long, b_long = spec.decode_cost(10_000)
    assert d_long > d_short and b_long - b_short == pytest.approx(9900 * spec.kv_bytes_per_token())


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_local_tiny_models_are_in_the_catalog_with_the_builders_shapes(size: str) -> None:
    spec = get_model(f"tiny-llama-{size}")
    shape = SIZES[size]
    assert (spec.hidden_size, spec.num_layers, spec.num_kv_heads) == (
        shape.hidden_size,
        shape.num_hidden_layers,
        shape.num_key_value_heads,
    )
    approx_m = float(describe_size(size).split("~")[1].split("M")[0])
    assert spec.num_parameters() / 1e6 == pytest.approx(approx_m, rel=0.06, abs=0.05)


def test_the_s_model_has_the_exact_parameter_count_of_the_built_checkpoint() -> None:
    # `tailguard engine tiny-model --size s` reports 1,836,160 parameters (vocab 4096).
    assert get_model("tiny-llama-s").num_parameters() == 1_836_160


def test_memory_fit_refuses_with_the_reason_and_a_way_out() -> None:
    llama70 = get_model("llama-3.1-70b")
    with pytest.raises(ModelDoesNotFit, match=r"141\.1 GB of bf16 weights.*tensor parallel.*fp8"):
        check_fit(llama70, get_hardware("h100"))
    with pytest.raises(ModelDoesNotFit):
        check_fit(llama70, get_hardware("h100"), num_devices=2)
    four = check_fit(llama70, get_hardware("h100"), num_devices=4)
    assert four.kv_capacity_tokens > 100_000
    assert check_fit(llama70, get_hardware("h200"), weight_format="fp8").kv_capacity_tokens > 0
    deepseek = get_model("deepseek-v3")
    assert check_fit(deepseek, get_hardware("h200"), num_devices=8).weight_format == "fp8"
    with pytest.raises(ModelDoesNotFit):
        check_fit(deepseek, get_hardware("h100"), num_devices=8)
    with pytest.raises(ModelDoesNotFit, match="at most 8 devices"):
        check_fit(deepseek, get_hardware("h100"), num_devices=16)
    with pytest.raises(ModelDoesNotFit):
        check_fit(get_model("llama-3.1-8b"), get_hardware("tpu-v6e"), weight_format="fp32")
    with pytest.raises(ModelDoesNotFit, match="KV-cache tokens"):
        check_fit(get_model("llama-3.1-8b"), get_hardware("tpu-v6e"), min_kv_tokens=10_000_000)


def test_the_cpu_kv_space_fixes_the_cache_size() -> None:
    spec = get_model("tiny-llama-s")
    fit = check_fit(
        spec, get_hardware("local-cpu"), weight_format="fp32", kv_cache_format="fp32", kv_cache_bytes=2**30
    )
    assert fit.kv_capacity_tokens == 2**30 // spec.kv_bytes_per_token("fp32")


def test_the_local_machine_s_region_is_the_deployment_s_to_declare(monkeypatch: pytest.MonkeyPatch) -> None:
    """A self-hosted portal in a US data centre says so (LOCAL_HARDWARE_REGION=us): the local CPU
    is then US hardware for residency rules, in the catalog and in tuning jobs alike, read when
    asked (a process that sets it after import sees it), never frozen at import."""
    from serving.catalog import HARDWARE
    from serving.catalog.hardware import hardware_in_regions
    from tuning.search.space import LOCAL_CPU

    assert get_hardware("local-cpu").region_codes() == {"local"} and LOCAL_CPU.residency() == "local"
    monkeypatch.setenv("LOCAL_HARDWARE_REGION", " US ")
    assert get_hardware("local-cpu").region_codes() == {"us"} and LOCAL_CPU.residency() == "us"
    assert dict(HARDWARE.items())["local-cpu"].regions[0].code == "us"
    assert "local-cpu" in {hw.name for hw in hardware_in_regions({"us"})}
    # Cloud entries keep their datasheet regions.
    assert "us" in get_hardware("h100").region_codes() and "local" not in get_hardware("h100").region_codes()
