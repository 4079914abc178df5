"""The simulator as the tuning search's prior, and its calibration from live trials."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest

from serving.catalog.hardware import get_hardware
from serving.catalog.models import UnknownModel, get_model, model_spec_from_dir
from serving.models import build_tiny_model
from serving.perf.feedback import (
    QUEUE_AMPLIFICATION,
    TRUSTED_SCALE,
    Pair,
    calibration_mismatch,
    correct_from_pairs,
    queue_amplification,
    step_ratio,
)
from serving.perf.model import DATA_DIR, nearest_measured
from tuning.search.job import JobSpec, TrialRecord, plan_job, report, with_prediction
from tuning.search.prior import pairs_from_results, prediction_errors, sim_prior
from tuning.search.trial import TrialResult


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=out, seed=0)
    return out


def test_a_built_tiny_model_is_its_catalog_entry(tiny_model: Path, tmp_path: Path) -> None:
    assert model_spec_from_dir(tiny_model) == get_model("tiny-llama-xs")
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": 7168}))
    with pytest.raises(UnknownModel, match="deepseek_v3"):
        model_spec_from_dir(moe)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(UnknownModel, match="num_attention_heads"):
        model_spec_from_dir(broken)


def _spec(trace: Path, model: Path) -> JobSpec:
    return JobSpec(
        trace_path=str(trace),
        model_path=str(model),
        slo="ttft_p50_ms<=1000,ttft_p95_ms<=3000",
        peak_rps=2.0,
        budget_trials=4,
        duration_s=10,
        repeats=1,
        max_prompt_tokens=256,
        max_output_tokens=16,
    )


def test_plan_ranks_candidates_and_predicts_each_trial(
    tiny_model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    prepared = plan_job(_spec(shared_traces / "azure2023_conv.csv", tiny_model), tmp_path / "work")
    assert prepared.sim is not None and "measured on local-cpu" in prepared.sim_note
    assert prepared.sim_ranked and all(not prepared.space.violations(a) for a in prepared.sim_ranked)
    predicted = prepared.predict(prepared.defaults)
    assert predicted is not None and predicted["source"] == "calibrated"
    assert 0 < predicted["ttft_p50_ms"] <= predicted["ttft_p95_ms"]
    # No tenant history: the calibrated forecast is the base one.
    assert predicted["ttft_p50_ms"] == predicted["base_ttft_p50_ms"]
    assert 0.0 < predicted["base_load_free_share"] <= 1.0
    # The dtype's measured cost is carried: the bf16 path (the checkpoint's dtype, vLLM's default
    # here) is forecast at the bf16/fp32 decode-step ratio the calibration measured on this CPU.
    fp32 = prepared.predict(prepared.reference)
    assert fp32 is not None
    data = json.loads((DATA_DIR / "local_cpu.json").read_text())
    steps = {o["label"]: o["measured_s"] for o in data["observations"] if o["kind"] == "tpot"}
    measured = statistics.median(
        o["measured_s"] / steps[o["label"]]
        for o in data["formats"]["bf16"]["observations"]
        if o["kind"] == "tpot"
    )
    assert predicted["tpot_p50_ms"] / fp32["tpot_p50_ms"] == pytest.approx(measured, rel=0.15)


def test_stored_trials_carry_prediction_and_the_report_its_error(
    tiny_model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    prepared = plan_job(_spec(shared_traces / "azure2023_conv.csv", tiny_model), tmp_path / "work")
    forecast = prepared.predict(prepared.defaults)
    assert forecast is not None
    measured = TrialResult(
        config={},
        status="ok",
        error=None,
        load=(),
        ttft_p50_ms=forecast["ttft_p50_ms"] * 1.5,
        ttft_p95_ms=forecast["ttft_p95_ms"] * 1.5,
        ttft_p95_ci_ms=(0.0, 0.0),
        tpot_p50_ms=forecast["tpot_p50_ms"] * 2.0,
        slo_met=True,
        slo_violations=(),
        sustainable_multiple=1.0,
        cost_per_mtok_usd=1.0,
        correctness={"passed": True},
        reliability={"passed": True},
        capture=None,
    )
    stored = with_prediction(prepared, prepared.defaults, measured)
    assert stored["predicted"]["ttft_p50_ms"] == pytest.approx(forecast["ttft_p50_ms"])
    data = report(prepared, [TrialRecord(1, prepared.defaults, {**stored, "phase": "search"})])
    errors = data["simulator"]["errors"]
    assert errors["num_trials"] == 1
    assert errors["ttft_p50_ms_mape"] == pytest.approx(1 / 3)  # |1 - 1.5| / 1.5
    assert errors["tpot_p50_ms_mape"] == pytest.approx(0.5)


def test_calibration_from_a_tenants_trials_moves_predictions_toward_measurements(
    tiny_model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    spec = _spec(shared_traces / "azure2023_conv.csv", tiny_model)
    base = plan_job(spec, tmp_path / "a")
    forecast = base.predict(base.defaults)
    assert forecast is not None
    # An earlier job of this tenant measured 2x slower decode and +100 ms on TTFT than forecast.
    history = [
        {
            "status": "ok",
            "ttft_p50_ms": forecast["base_ttft_p50_ms"] * 2 + 100,
            "tpot_p50_ms": forecast["base_tpot_p50_ms"] * 2,
            "predicted": forecast,
        }
    ] * 3
    pairs = pairs_from_results(history)
    assert len(pairs) == 3
    calibrated = plan_job(spec, tmp_path / "b", calibration=pairs)
    assert calibrated.sim is not None and calibrated.sim.num_pairs == 3
    assert "corrected from 3 earlier live trial" in calibrated.sim_note
    after = calibrated.predict(calibrated.defaults)
    assert after is not None
    before_err = abs(forecast["tpot_p50_ms"] - history[0]["tpot_p50_ms"])
    after_err = abs(after["tpot_p50_ms"] - history[0]["tpot_p50_ms"])
    assert after_err < 0.5 * before_err
    assert abs(after["ttft_p50_ms"] - history[0]["ttft_p50_ms"]) < abs(
        forecast["ttft_p50_ms"] - history[0]["ttft_p50_ms"]
    )
    # The base forecast stays the stored calibration's, so recomputing never compounds.
    assert after["base_ttft_p50_ms"] == pytest.approx(forecast["base_ttft_p50_ms"])


def test_correction_ignores_failed_and_unpredicted_trials() -> None:
    assert pairs_from_results([{"status": "failed", "predicted": {"base_ttft_p50_ms": 1.0}}]) == []
    assert pairs_from_results([{"status": "ok", "ttft_p50_ms": 5.0}]) == []
    eff, _ = nearest_measured(get_hardware("local-cpu"))
    same = correct_from_pairs(eff, [Pair(math.nan, 1.0, math.nan, 1.0)])
    assert same == eff
    assert prediction_errors([{"status": "ok"}]) == {
        "num_trials": 0,
        "ttft_p50_ms_mape": None,
        "ttft_p95_ms_mape": None,
        "tpot_p50_ms_mape": None,
    }


def test_no_prior_for_a_model_the_catalog_cannot_describe(tmp_path: Path) -> None:
    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    prior, note = sim_prior(str(model), "local-cpu")
    assert prior is None and "mixtral" in note


def test_a_correction_scales_step_times_and_never_moves_the_per_request_overhead() -> None:
    """Measured TTFT 14 s against 7 s predicted at the knee is queueing, and a long-prompt trace's
    TTFT gap is prefill: neither is a constant every request pays. The correction scales the
    engine's step times by the median TPOT ratio and leaves the per-request overhead as
    calibrated, whatever the TTFT gaps (a replay of one tenant's jobs found a shift from them
    tripling another trace's short-prompt TTFT; benchmarks/sim_accuracy.py)."""
    eff, _ = nearest_measured(get_hardware("local-cpu"))
    loaded = [Pair(100.0, 14_000.0, 70.0, 7_000.0) for _ in range(3)]
    long_prompts = [Pair(70.0, 3_300.0, 70.0, 1_500.0) for _ in range(2)]
    corrected = correct_from_pairs(eff, [*loaded, *long_prompts], weight=1.0)
    assert corrected.request_overhead_ms == pytest.approx(eff.request_overhead_ms)
    assert corrected.step_overhead_ms == pytest.approx(eff.step_overhead_ms * 100.0 / 70.0)
    assert corrected.gemm_efficiency == pytest.approx(eff.gemm_efficiency * 70.0 / 100.0)
    assert "step x1.429" in corrected.how
    # damped: half the log-ratio per step with weight 0.5
    half = correct_from_pairs(eff, loaded, weight=0.5)
    assert half.step_overhead_ms == pytest.approx(eff.step_overhead_ms * (100.0 / 70.0) ** 0.5)


def test_a_machine_the_calibration_does_not_describe_is_reported_not_corrected() -> None:
    """Trials whose decode steps run five times the prediction come from another machine: one
    scale cannot carry the calibration over (the AVX2 host of 2026-12-05, replayed, went from a
    p50 TTFT error of 0.88 to 4.1 after one corrected job), so the factors stay as calibrated and
    the prior's basis says to recalibrate; inside the trusted band the correction applies."""
    eff, _ = nearest_measured(get_hardware("local-cpu"))
    slow = [Pair(50.0, 400.0, 10.0, 80.0) for _ in range(3)]
    assert calibration_mismatch(slow) == pytest.approx(5.0)
    kept = correct_from_pairs(eff, slow, weight=1.0)
    assert dataclasses.replace(kept, how=eff.how) == eff
    assert "not corrected: 3 live trial(s) ran x5" in kept.how and "recalibrate" in kept.how
    prior, basis = sim_prior("tiny-llama-s", "local-cpu", slow)
    assert prior is not None and prior.efficiency == eff and prior.mismatch == pytest.approx(5.0)
    assert "NOT corrected" in basis and "recalibrate" in basis
    fast = [Pair(1.0, 8.0, 10.0, 80.0)]  # a tenth of the prediction: as far off the other way
    assert calibration_mismatch(fast) == pytest.approx(0.1)
    # at the band's edge the correction still applies, and says by how much
    edge = [Pair(20.0, 160.0, 10.0, 80.0)]
    assert calibration_mismatch(edge) is None
    corrected = correct_from_pairs(eff, edge, weight=1.0)
    assert corrected.step_overhead_ms == pytest.approx(eff.step_overhead_ms * TRUSTED_SCALE)
    prior, basis = sim_prior("tiny-llama-s", "local-cpu", edge)
    assert prior is not None and prior.mismatch is None and "corrected from 1 earlier" in basis


def test_a_slow_stream_with_a_ttft_as_predicted_is_not_a_slow_engine() -> None:
    """A loaded host that streams tokens at twice the predicted TPOT while the same trials' p50
    TTFT comes out as predicted or faster has not got slower steps (its queues would show it):
    the correction takes only what both ratios agree on."""
    eff, _ = nearest_measured(get_hardware("local-cpu"))
    streaming = [Pair(20.0, 90.0, 10.0, 100.0), Pair(20.0, 100.0, 10.0, 100.0), Pair(15.0, 95.0, 10.0, 100.0)]
    assert step_ratio(streaming) == pytest.approx(1.0)
    kept = correct_from_pairs(eff, streaming, weight=1.0)
    assert kept.step_overhead_ms == pytest.approx(eff.step_overhead_ms)
    # A slower engine shows in both: the smaller of the two is taken, per trial, then the median.
    slower = [Pair(15.0, 300.0, 10.0, 100.0), Pair(18.0, 160.0, 10.0, 100.0), Pair(13.0, 110.0, 10.0, 100.0)]
    assert step_ratio(slower) == pytest.approx(1.5)
    assert correct_from_pairs(eff, slower, weight=1.0).step_overhead_ms == pytest.approx(
        eff.step_overhead_ms * 1.5
    )
    # faster in both: the same, the other way
    assert step_ratio([Pair(5.0, 80.0, 10.0, 100.0)]) == pytest.approx(0.8)
    # a stream three times the prediction with a TTFT as predicted is no other machine either
    assert calibration_mismatch([Pair(30.0, 100.0, 10.0, 100.0)]) is None


def test_a_forecast_records_how_much_of_its_ttft_is_free_of_load() -> None:
    from serving.sim.simulator import TimeBreakdown

    assert TimeBreakdown(5.0, 0.0, 15.0, 0.0, 0.0).load_free_share() == pytest.approx(1.0)
    assert TimeBreakdown(5.0, 60.0, 15.0, 20.0, 0.0).load_free_share() == pytest.approx(0.2)
    assert TimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0).load_free_share() == 1.0
    # Old trial results without the share still give a pair.
    (pair,) = pairs_from_results(
        [
            {
                "status": "ok",
                "ttft_p50_ms": 5.0,
                "tpot_p50_ms": 1.0,
                "predicted": {"base_ttft_p50_ms": 4.0, "base_tpot_p50_ms": 1.0},
            }
        ]
    )
    assert (pair.measured_ttft_p50_ms, pair.predicted_ttft_p50_ms) == (5.0, 4.0)


def test_queue_amplification_is_the_forecasts_move_in_units_of_the_scales() -> None:
    # Steps alone: a 1.5x scale moves a forecast at most 1.5x (fixed costs do not scale).
    assert queue_amplification(100.0, 150.0, 1.5) == pytest.approx(1.0)
    assert queue_amplification(100.0, 120.0, 1.5) < 1.0
    # Queueing: 4x for a 1.5x scale is log 4 / log 1.5 = 3.4 times the steps' own move.
    assert queue_amplification(100.0, 400.0, 1.5) == pytest.approx(math.log(4) / math.log(1.5))
    assert queue_amplification(100.0, 25.0, 1 / 1.5) == pytest.approx(math.log(4) / math.log(1.5))
    # Nothing to say without both figures or without a scale.
    for base, corrected, scale in ((None, 1.0, 1.5), (1.0, math.nan, 1.5), (0.0, 1.0, 1.5), (1.0, 2.0, 1.0)):
        assert queue_amplification(base, corrected, scale) is None


def test_a_forecast_where_queueing_multiplies_the_correction_says_so(
    tiny_model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    import numpy as np

    from tuning.search import prior
    from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl

    # A tenant whose engine ran 1.9x the predicted step time, inside the band a correction trusts.
    pairs = [Pair(19.0, 190.0, 10.0, 100.0)] * 3
    trace = shared_traces / "azure2023_conv.csv"
    plan = plan_job(
        dataclasses.replace(_spec(trace, tiny_model), peak_rps=0.5), tmp_path / "plan", calibration=pairs
    )
    assert plan.sim is not None and plan.sim.scale == pytest.approx(1.9**0.75)
    forecast = plan.predict(plan.defaults)
    assert forecast is not None and "saturation_sensitive" not in forecast
    # Unloaded, the correction applies, and moves the forecast no further than the steps do.
    assert (
        forecast["base_ttft_p50_ms"]
        < forecast["ttft_p50_ms"]
        <= forecast["base_ttft_p50_ms"] * plan.sim.scale
    )
    # Raise the rate until the slower engine saturates where the stored calibration's does not.
    sample = ingest_path(str(trace), keep_blocks=True)
    flagged = None
    for rps in np.geomspace(8.0, 2048.0, 25):
        path = tmp_path / f"w{rps:.0f}.jsonl"
        with path.open("wb") as out:
            write_mooncake_jsonl(
                synthesize(sample, target_rps=float(rps), duration_s=10, rng=np.random.default_rng(0)), out
            )
        forecast = prior.predict(
            plan.sim,
            plan.space,
            plan.defaults,
            workload=str(path),
            max_prompt_tokens=256,
            max_output_tokens=16,
        )
        if "saturation_sensitive" in forecast:
            flagged = forecast
            break
    assert flagged is not None, "no rate saturated the corrected engine first"
    assert "at saturation" in flagged["saturation_sensitive"]
    # The corrected figures stand (withholding them scored worse on held-out runs), and the move
    # they made is the queue's, not the steps' alone.
    assert flagged["ttft_p50_ms"] > flagged["base_ttft_p50_ms"] * plan.sim.scale
    moved = queue_amplification(flagged["base_ttft_p50_ms"], flagged["ttft_p50_ms"], plan.sim.scale)
    assert moved is not None and moved > QUEUE_AMPLIFICATION
