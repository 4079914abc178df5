"""The H200 engine overheads fitted on live vLLM runs (benchmarks/sim_gpu_fit.py): loaded, used,
said so in the basis; the CPU calibration untouched."""

from __future__ import annotations

import dataclasses
import json

import pytest

from serving.catalog.hardware import get_hardware
from serving.catalog.models import get_model
from serving.engine.config import EngineConfig
from serving.loadgen.results import ReplaySummary
from serving.loadgen.traces import TraceRequest
from serving.perf.model import (
    DATA_DIR,
    LIVE_FIT_FIELDS,
    PRIORS_CLAUSE,
    Efficiency,
    apply_live_fit,
    load_efficiency,
    nearest_measured,
)
from serving.sim import simulate

LIVE = DATA_DIR / "h200_live.json"
pytestmark = pytest.mark.skipif(not LIVE.exists(), reason="no live fit stored for the H200")


def _requests(rate_rps: float, n: int) -> list[TraceRequest]:
    # Chat-like lengths at a steady rate, as loaded as the live trials (some 300 streams open):
    # there the per-sequence and per-token costs decide the step time.
    return [
        TraceRequest(arrival_s=i / rate_rps, num_prompt_tokens=600 + 97 * (i % 7), num_output_tokens=200)
        for i in range(n)
    ]


def _summary(
    efficiency: Efficiency | None, hardware: str = "h200", model: str = "llama-3.1-8b"
) -> ReplaySummary:
    return simulate(
        _requests(40.0, 300),
        model=get_model(model),
        hardware=get_hardware(hardware),
        config=EngineConfig(dtype="bfloat16" if hardware == "h200" else "auto", max_model_len=4096),
        efficiency=efficiency,
    ).summary


def test_h200_loads_the_fitted_overheads_with_their_provenance() -> None:
    live = json.loads(LIVE.read_text())
    fitted = load_efficiency("h200")
    prior = load_efficiency("h200", live=False)
    assert fitted is not None and prior is not None
    assert live["fitted"] and set(live["fitted"]) <= set(LIVE_FIT_FIELDS)
    for name in LIVE_FIT_FIELDS:  # what the fit set, else the operator calibration's own
        expected = live["fitted"].get(name, getattr(prior, name))
        assert getattr(fitted, name) == pytest.approx(float(expected))
    # The operator profile's roofline factors are not touched by the live fit.
    for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency", "comm_efficiency"):
        assert getattr(fitted, name) == getattr(prior, name)
    assert PRIORS_CLAUSE in prior.how and PRIORS_CLAUSE not in fitted.how
    assert "fitted to live vLLM runs" in fitted.how and "knee probe" in fitted.how
    assert live["sources"] and live["commit"] and live["fitted_at"]
    _, basis = nearest_measured(get_hardware("h200"))
    assert "fitted to live vLLM runs" in basis


def test_fitted_overheads_raise_h200_predictions_towards_the_live_runs() -> None:
    # Under the trials' load, live TTFT and TPOT were 1.5-3x the priors' predictions: the fit
    # must move both up.
    prior = load_efficiency("h200", live=False)
    fitted_summary = _summary(None)  # the simulator's own choice: the stored, fitted calibration
    prior_summary = _summary(prior)
    assert fitted_summary.ttft_ms.p50 > prior_summary.ttft_ms.p50
    assert fitted_summary.tpot_ms.p50 > prior_summary.tpot_ms.p50


def test_cpu_calibration_and_predictions_are_unchanged() -> None:
    raw = json.loads((DATA_DIR / "local_cpu.json").read_text())["efficiency"]
    stored = Efficiency.from_mapping(raw)
    assert not (DATA_DIR / "local_cpu_live.json").exists()
    assert load_efficiency("local-cpu") == stored == load_efficiency("local-cpu", live=False)
    eff, basis = nearest_measured(get_hardware("local-cpu"))
    assert eff == stored and "live vLLM" not in basis
    assert _summary(None, "local-cpu", "tiny-llama-s") == _summary(stored, "local-cpu", "tiny-llama-s")


def test_a_live_fit_sets_only_engine_overheads() -> None:
    base = load_efficiency("h200", live=False)
    assert base is not None
    with pytest.raises(ValueError, match="only"):
        apply_live_fit(base, {"fitted": {"gemm_efficiency": 0.1}})
    with pytest.raises(ValueError, match="non-negative"):
        apply_live_fit(base, {"fitted": {"step_overhead_ms": -1.0}})
    no_clause = dataclasses.replace(base, how="profiled")
    out = apply_live_fit(no_clause, {"fitted": {"step_overhead_ms": 7.0}, "how": "fitted on runs X"})
    assert out.step_overhead_ms == 7.0 and out.how == "profiled; fitted on runs X"
