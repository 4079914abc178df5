"""What-if forecasts across the hardware catalog (the simulator, no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.catalog.hardware import get_hardware
from serving.catalog.models import get_model
from serving.sim.api import LatencyTargets, load_requests
from tuning.whatif import RATE_HIGH, forecast, sample_rate_rps

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "azure2023_conv.csv"
TARGETS = LatencyTargets(ttft_p50_ms=600, ttft_p95_ms=1500)


@pytest.fixture(scope="module")
def requests() -> list:  # type: ignore[type-arg]
    return load_requests(TRACE, max_requests=60)


def _by_name(rows):  # type: ignore[no-untyped-def]
    return {r.hardware: r for r in rows}


def test_each_hardware_is_predicted_on_its_own_calibration_or_withheld(requests) -> None:  # type: ignore[no-untyped-def]
    hardware = [get_hardware(n) for n in ("local-cpu", "h200", "h100", "tpu-v6e")]
    rows = _by_name(
        forecast(
            requests,
            model=get_model("tiny-llama-s"),
            hardware=hardware,
            targets=TARGETS,
            max_prompt_tokens=1024,
            max_output_tokens=64,
        )
    )
    cpu, h200, h100, tpu = rows["local-cpu"], rows["h200"], rows["h100"], rows["tpu-v6e"]
    assert (
        cpu.withheld is None
        and cpu.calibration is not None
        and cpu.calibration.startswith("measured on local-cpu")
    )
    assert cpu.ttft_p50_ms is not None and cpu.ttft_p95_ms is not None and cpu.ttft_p50_ms <= cpu.ttft_p95_ms
    assert cpu.usd_per_million_tokens is None  # an unpriced machine is not a free one
    assert h200.calibration is not None and h200.calibration.startswith("measured on h200")
    # The H100 has its own operator profile; its engine costs are the H200 live fit's, borrowed.
    assert h100.calibration is not None and h100.calibration.startswith("measured on h100")
    assert "borrowed from the h200 live fit" in h100.calibration
    assert h200.usd_per_million_tokens is not None and h200.usd_per_million_tokens > 0
    # A TPU has no calibration of its kind: no figures, and the reason.
    assert tpu.withheld is not None and "no calibration measured on a tpu" in tpu.withheld
    assert tpu.ttft_p50_ms is None and tpu.sustainable_rps is None and tpu.usd_per_million_tokens is None


def test_the_operators_price_sets_the_cost(requests) -> None:  # type: ignore[no-untyped-def]
    h200 = get_hardware("h200")
    kwargs = {
        "model": get_model("tiny-llama-s"),
        "hardware": [h200],
        "targets": TARGETS,
        "max_prompt_tokens": 1024,
        "max_output_tokens": 64,
    }
    (catalog,) = forecast(requests, **kwargs)  # type: ignore[arg-type]
    (doubled,) = forecast(requests, prices={"h200": 2 * h200.price_per_hour_usd.value}, **kwargs)  # type: ignore[arg-type]
    assert catalog.usd_per_million_tokens is not None and doubled.usd_per_million_tokens is not None
    assert doubled.usd_per_million_tokens == pytest.approx(2 * catalog.usd_per_million_tokens)
    assert doubled.price_per_device_hour_usd == pytest.approx(2 * h200.price_per_hour_usd.value)
    # A machine the catalog does not price costs what its operator says it does.
    cpu = get_hardware("local-cpu")
    (priced,) = forecast(requests, **{**kwargs, "hardware": [cpu]}, prices={"local-cpu": 0.5})  # type: ignore[arg-type]
    assert priced.usd_per_million_tokens is not None and priced.usd_per_million_tokens > 0


def test_a_model_too_large_for_a_node_is_withheld_with_the_fit_report(requests) -> None:  # type: ignore[no-untyped-def]
    (cpu,) = forecast(
        requests,
        model=get_model("llama-3.1-70b"),
        hardware=[get_hardware("local-cpu")],
        targets=TARGETS,
        max_prompt_tokens=1024,
        max_output_tokens=64,
    )
    assert (
        cpu.withheld is not None
        and cpu.withheld.startswith("does not fit one node")
        and "does not fit" in cpu.withheld
    )
    assert cpu.devices is None and cpu.ttft_p50_ms is None


def test_the_sustainable_rate_is_bounded_both_ways(requests) -> None:  # type: ignore[no-untyped-def]
    kwargs = {
        "model": get_model("tiny-llama-s"),
        "hardware": [get_hardware("h200")],
        "max_prompt_tokens": 1024,
        "max_output_tokens": 64,
    }
    (lax,) = forecast(requests, targets=LatencyTargets(ttft_p50_ms=1e6, ttft_p95_ms=1e6), **kwargs)  # type: ignore[arg-type]
    rate = sample_rate_rps(requests)
    assert rate is not None
    assert lax.sustainable_at_least and lax.sustainable_rps == pytest.approx(RATE_HIGH * rate)
    (strict,) = forecast(requests, targets=LatencyTargets(ttft_p50_ms=0.001), **kwargs)  # type: ignore[arg-type]
    assert (
        strict.meets_targets is False and strict.sustainable_rps is None and not strict.sustainable_at_least
    )


def test_an_empty_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="no requests"):
        forecast(
            [],
            model=get_model("tiny-llama-s"),
            hardware=[get_hardware("h200")],
            targets=TARGETS,
            max_prompt_tokens=16,
            max_output_tokens=16,
        )
