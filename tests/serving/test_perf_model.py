"""Step-latency model: roofline behaviour, basis of predictions, and the calibration fit."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from serving.catalog import get_hardware, get_model
from serving.perf import (
    ACCELERATOR_PRIOR,
    Efficiency,
    StepShape,
    StepTimeModel,
    load_efficiency,
    nearest_measured,
)
from serving.perf.calibrate import (
    Observation,
    decode_shape,
    fit_efficiency,
    predict_observation,
    prefill_shape,
    trimmed_mean,
)
from serving.perf.model import DATA_DIR, apply_moe_fit

GPU_EFF = dataclasses.replace(ACCELERATOR_PRIOR, hardware="test", measured=True, how="test")


def test_decode_of_a_big_dense_model_is_bound_by_weight_bandwidth() -> None:
    model = StepTimeModel(
        get_model("llama-3.1-70b"), get_hardware("h200"), weight_format="fp8", efficiency=GPU_EFF
    )
    t = model.step_time(decode_shape(1, 100))
    weights_s = get_model("llama-3.1-70b").weight_bytes("fp8") / (4800e9 * GPU_EFF.memory_efficiency)
    assert t.gemm_s == pytest.approx(weights_s, rel=1e-9)
    # Batching decodes is almost free while memory-bound; a long prefill is compute-bound.
    t64 = model.step_time(decode_shape(64, 100))
    assert t64.gemm_s == pytest.approx(t.gemm_s, rel=1e-9)
    prefill = model.step_time(prefill_shape(8192))
    flops = 8192 * get_model("llama-3.1-70b").linear_flops_per_token()
    assert prefill.gemm_s >= flops / (1979e12 * GPU_EFF.gemm_efficiency) * 0.999


def test_step_time_grows_with_tokens_context_and_sequences() -> None:
    model = StepTimeModel(get_model("llama-3.1-8b"), get_hardware("h100"), efficiency=GPU_EFF)
    base = model.step_time(decode_shape(32, 1000)).total_s
    assert model.step_time(decode_shape(32, 8000)).total_s > base
    assert model.step_time(prefill_shape(4096)).total_s > model.step_time(prefill_shape(1024)).total_s
    shape = decode_shape(32, 1000)
    fast = model.step_seconds(
        shape.num_tokens, shape.num_seqs, shape.num_sampled, 0.0, 0, shape.decode_ctx_tokens
    )
    assert fast == pytest.approx(model.step_time(shape).total_s, rel=1e-12)


def test_tensor_parallel_splits_compute_and_adds_communication() -> None:
    spec, hw = get_model("llama-3.1-70b"), get_hardware("h100")
    one = StepTimeModel(spec, hw, weight_format="fp8", efficiency=GPU_EFF).step_time(prefill_shape(4096))
    four = StepTimeModel(spec, hw, weight_format="fp8", tensor_parallel_size=4, efficiency=GPU_EFF).step_time(
        prefill_shape(4096)
    )
    assert one.comm_s == 0 and four.comm_s > 0
    assert four.gemm_s == pytest.approx(one.gemm_s / 4, rel=1e-9)


def test_moe_decode_reads_only_the_experts_it_hits() -> None:
    spec = get_model("qwen3-30b-a3b")
    model = StepTimeModel(spec, get_hardware("h200"), efficiency=GPU_EFF)
    small = model.step_time(decode_shape(1, 10)).gemm_s
    large = model.step_time(decode_shape(256, 10)).gemm_s
    assert small < large <= spec.weight_bytes() / (4800e9 * GPU_EFF.memory_efficiency) * 1.0001


def test_a_fitted_moe_op_costs_the_routed_experts_on_their_own_roofline() -> None:
    fit = {"moe_floor_us": 20.0, "moe_memory_efficiency": 0.8, "moe_gemm_efficiency": 0.3}
    fitted = apply_moe_fit(GPU_EFF, {"fitted": fit, "how": "test fit"})
    assert fitted.moe_measured and not GPU_EFF.moe_measured and fitted.how.endswith("test fit")
    h200 = get_hardware("h200")
    # A dense model is costed exactly as before.
    dense = get_model("llama-3.1-8b")
    for shape in (decode_shape(1, 100), decode_shape(64, 1000), prefill_shape(4096)):
        assert StepTimeModel(dense, h200, efficiency=fitted).step_time(shape) == StepTimeModel(
            dense, h200, efficiency=GPU_EFF
        ).step_time(shape)
    spec = get_model("qwen3-30b-a3b")
    before = StepTimeModel(spec, h200, efficiency=GPU_EFF)
    after = StepTimeModel(spec, h200, efficiency=fitted)
    assert before.moe_seconds(8) == 0.0  # not fitted: the experts are inside the dense roofline
    expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    one_token = 8 * expert * 2 * spec.num_moe_layers / (4800e9 * 0.8)  # 8 experts streamed
    floor = spec.num_moe_layers * 20e-6
    assert after.moe_seconds(1) == pytest.approx(one_token + floor, rel=1e-3)
    # Prefill chunks are bound by the grouped GEMMs' FLOPs at the fitted share of peak.
    flops = 8192 * 2 * 8 * expert * spec.num_moe_layers
    assert after.moe_seconds(8192) == pytest.approx(flops / (h200.peak_flops("bf16") * 0.3) + floor, rel=1e-3)
    for shape in (decode_shape(1, 100), decode_shape(256, 100), prefill_shape(8192)):
        step = after.step_time(shape)
        assert step.gemm_s == pytest.approx(
            max(
                (shape.num_tokens * (spec.linear_flops_per_token() - 2 * 8 * expert * spec.num_moe_layers)
                 + shape.num_sampled * spec.lm_head_flops_per_sampled_token()) / (h200.peak_flops("bf16") * GPU_EFF.gemm_efficiency),
                (spec.weight_bytes() - spec.num_experts * expert * spec.num_moe_layers * 2)
                / (4800e9 * GPU_EFF.memory_efficiency),
            )
            + after.moe_seconds(shape.num_tokens),
            rel=1e-6,
        )  # fmt: skip
        assert after.step_seconds(
            shape.num_tokens, shape.num_seqs, shape.num_sampled, shape.prefill_attn_pairs,
            shape.prefill_cached_tokens, shape.decode_ctx_tokens,
        ) == pytest.approx(step.total_s)  # fmt: skip
    for bad in ({**fit, "moe_gemm_efficiency": 1.5}, {**fit, "moe_floor_us": -1.0}, {"moe_floor_us": 1.0}):
        with pytest.raises(ValueError):
            apply_moe_fit(GPU_EFF, {"fitted": bad})


def test_every_prediction_says_whether_it_was_measured() -> None:
    cpu = load_efficiency("local-cpu")
    assert cpu is not None and cpu.measured and "fitted" in cpu.how
    _, basis = nearest_measured(get_hardware("local-cpu"))
    assert basis.startswith("measured on local-cpu")
    eff, basis = nearest_measured(get_hardware("b200"))
    assert basis.startswith("datasheet of b200 + ")
    if load_efficiency("h200") is None:
        assert eff is ACCELERATOR_PRIOR and "not measured" in basis
    else:
        assert "efficiency of h200" in basis


def test_a_profiled_gpu_without_its_own_live_fit_borrows_the_h200_engine_costs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import serving.perf.model as perf_model

    profiled = dataclasses.replace(
        ACCELERATOR_PRIOR,
        hardware="h100",
        memory_efficiency=0.83,
        measured=True,
        how="GEMM/attention/memory efficiencies fitted to a torch operator profile on NVIDIA H100; "
        "step, request and communication costs are priors, not measured",
    )
    (tmp_path / "h100.json").write_text(json.dumps({"efficiency": profiled.to_mapping()}))
    live = {"fitted": {"step_overhead_ms": 0.9, "request_overhead_ms": 18.0}, "how": "fitted on H200 runs"}
    (tmp_path / "h200_live.json").write_text(json.dumps(live))
    monkeypatch.setattr(perf_model, "DATA_DIR", tmp_path)
    eff, basis = nearest_measured(get_hardware("h100"))
    # The operators are the H100's own; the engine's costs are the H200 live fit's, and both
    # the efficiency and the basis say the latter were borrowed.
    assert eff.memory_efficiency == 0.83 and eff.step_overhead_ms == 0.9 and eff.request_overhead_ms == 18.0
    assert basis.startswith("measured on h100") and "borrowed from the h200 live fit" in basis
    assert "priors, not measured" not in eff.how
    # Its own live fit, once there, replaces the borrowed one.
    (tmp_path / "h100_live.json").write_text(json.dumps({"fitted": {"step_overhead_ms": 0.5}, "how": "own"}))
    eff, basis = nearest_measured(get_hardware("h100"))
    assert eff.step_overhead_ms == 0.5 and "borrowed" not in basis


def test_the_code_state_is_the_launchers_statement_on_a_copied_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.perf.calibrate import code_state

    monkeypatch.delenv("TAILGUARD_GIT_COMMIT", raising=False)
    here = code_state()
    assert here["commit"] == "unknown" or len(str(here["commit"])) == 40  # 'unknown' outside a checkout
    assert "source" not in here
    monkeypatch.setenv("TAILGUARD_GIT_COMMIT", "b" * 40)
    monkeypatch.setenv("TAILGUARD_GIT_DIRTY", "0")
    assert code_state(("h200_profile.py",))["commit"] == "b" * 40
    assert code_state()["dirty"] is False
    monkeypatch.delenv("TAILGUARD_GIT_DIRTY")  # unstated: counted dirty, never assumed clean
    assert code_state()["dirty"] is True


def test_calibration_recovers_known_factors_from_synthetic_observations() -> None:
    truth = Efficiency(
        "local-cpu", 0.5, 0.25, 1e6, 1.0, 0.0, 2.0, 0.1, 0.0, 15.0, True, "synthetic", stream_overhead_ms=6.0
    )
    spec = get_model("tiny-llama-s")
    model = StepTimeModel(
        spec, get_hardware("local-cpu"), weight_format="fp32", compute_format="fp32", efficiency=truth
    )
    obs = [Observation("ttft", f"p{p}", 0.0, (prefill_shape(p),)) for p in (32, 256, 1024, 2000)]
    obs += [
        Observation("ttft", f"p32 with {k}", 0.0, (prefill_shape(32),), open_streams=k) for k in (1, 2, 4)
    ]
    obs += [
        Observation("tpot", f"d{n}x{c}", 0.0, (decode_shape(n, c),))
        for n, c in ((1, 64), (8, 64), (32, 64), (1, 1500), (4, 1000))
    ]
    obs = [dataclasses.replace(o, measured_s=predict_observation(o, model)) for o in obs]
    fitted = fit_efficiency(obs, spec, hardware_name="local-cpu", compute_format="fp32", how="test")
    assert fitted.request_overhead_ms == pytest.approx(15.0, rel=0.02)
    assert fitted.stream_overhead_ms == pytest.approx(6.0, rel=0.02)
    assert fitted.step_overhead_ms == pytest.approx(2.0, rel=0.05)
    assert fitted.gemm_efficiency == pytest.approx(0.5, rel=0.05)
    refit = StepTimeModel(
        spec, get_hardware("local-cpu"), weight_format="fp32", compute_format="fp32", efficiency=fitted
    )
    for o in obs:
        assert predict_observation(o, refit) == pytest.approx(o.measured_s, rel=0.02)


def test_calibration_fits_the_roofline_it_predicts_with_where_memory_binds() -> None:
    # Decode steps of this truth are bound by the weights' bytes, prefills by their FLOPs: a fit
    # of the sum of both would share each step between them and the max-form model would then
    # predict the decode steps too fast.
    truth = Efficiency("local-cpu", 0.5, 0.4, 0.2, 1.0, 0.0, 1.0, 0.08, 0.0, 7.0, True, "synthetic")
    spec = get_model("tiny-llama-s")
    model = StepTimeModel(
        spec, get_hardware("local-cpu"), weight_format="fp32", compute_format="fp32", efficiency=truth
    )
    obs = [Observation("ttft", f"p{p}", 0.0, (prefill_shape(p),)) for p in (32, 128, 512, 1024, 2000, 3000)]
    obs += [
        Observation("tpot", f"d{n}x{c}", 0.0, (decode_shape(n, c),))
        for n, c in ((1, 64), (4, 64), (16, 64), (32, 64), (1, 3000), (4, 1000), (8, 512))
    ]
    obs = [dataclasses.replace(o, measured_s=predict_observation(o, model)) for o in obs]
    decode = model.step_time(decode_shape(8, 512))
    assert decode.gemm_s == pytest.approx(model._weight_bytes(8) * model._s_per_byte)  # memory binds
    fitted = fit_efficiency(obs, spec, hardware_name="local-cpu", compute_format="fp32", how="test")
    refit = StepTimeModel(
        spec, get_hardware("local-cpu"), weight_format="fp32", compute_format="fp32", efficiency=fitted
    )
    for o in obs:
        assert predict_observation(o, refit) == pytest.approx(o.measured_s, rel=0.02), o.label


def test_a_step_with_no_tokens_takes_no_time() -> None:
    model = StepTimeModel(get_model("tiny-llama-s"), get_hardware("local-cpu"), weight_format="fp32")
    empty = StepShape(0, 0, 0, 0, 0.0, 0, 0)
    assert model.step_time(empty).total_s == 0.0 and model.step_seconds(0, 0, 0, 0.0, 0, 0) == 0.0


def test_the_operator_profile_fit_recovers_a_known_roofline(tmp_path: Path) -> None:
    from serving.perf.h200_profile import HELD_OUT, PROFILED, TOKENS, fit, held_out_errors, linear_shapes

    peak, bw = 989e12, 4800e9
    rows = []
    for name in PROFILED:
        for layer, k, n in linear_shapes(get_model(name)):
            for m in TOKENS:
                flops, data = 2.0 * m * k * n, 2.0 * (m * k + k * n + m * n)
                seconds = max(flops / (peak * 0.75), data / (bw * 0.8)) + 6e-6
                rows.append(
                    {
                        "op": "gemm",
                        "model": name,
                        "layer": layer,
                        "m": m,
                        "k": k,
                        "n": n,
                        "flops": flops,
                        "bytes": data,
                        "seconds": seconds,
                    }
                )
    profile = tmp_path / "ops.json"
    profile.write_text(
        json.dumps(
            {
                "device": "NVIDIA H200 (synthetic rows)",
                "commit": "a" * 40,
                "dirty": False,
                "torch": "x",
                "measured_at": "2026-11-30T00:00:00",
                "how": "synthetic",
                "rows": rows,
            }
        )
    )
    out = fit(profile, tmp_path / "h200.json")
    gemm = out["fit"]["classes"]["gemm"]
    assert gemm["compute_efficiency"] == pytest.approx(0.75, abs=0.03)
    assert gemm["memory_efficiency"] == pytest.approx(0.8, abs=0.03)
    assert out["held_out_mape"] < 0.03 and set(out["held_out_models"]) == set(HELD_OUT)
    assert out["efficiency"]["measured"] and "priors" in out["efficiency"]["how"]
    # The calibration names the commit its profile was measured at.
    assert (out["measured_commit"], out["measured_dirty"]) == ("a" * 40, False)
    # The stored fit gives back one error per held-out operator, whose mean is the stored MAPE
    # (sim_accuracy draws the MAPE's interval from them).
    errors = held_out_errors(json.loads((tmp_path / "h200.json").read_text()))
    held_out_rows = [r for r in rows if r["model"] in HELD_OUT]
    assert len(errors) == len(held_out_rows) > 0

    # The same timings named as an H100's are fitted against the H100's datasheet (less memory
    # bandwidth, the same bf16 peak): the same compute efficiency, a higher memory efficiency.
    h100 = json.loads(profile.read_text())
    h100["device"] = "NVIDIA H100 80GB HBM3"
    profile.write_text(json.dumps(h100))
    h100_fit = fit(profile, tmp_path / "h100.json")
    assert h100_fit["efficiency"]["hardware"] == "h100"
    assert h100_fit["fit"]["classes"]["gemm"]["compute_efficiency"] == pytest.approx(0.75, abs=0.03)
    assert h100_fit["fit"]["classes"]["gemm"]["memory_efficiency"] > gemm["memory_efficiency"] + 0.1
    # A GPU the catalog does not profile is refused, not fitted against another's datasheet.
    h100["device"] = "NVIDIA A100-SXM4-80GB"
    profile.write_text(json.dumps(h100))
    with pytest.raises(ValueError, match="A100"):
        fit(profile, tmp_path / "a100.json")
    assert sum(errors) / len(errors) == pytest.approx(out["held_out_mape"], rel=1e-9)


def test_live_feedback_moves_the_calibration_towards_the_measurements() -> None:
    from serving.engine import EngineConfig
    from serving.loadgen.results import ReplaySummary
    from serving.loadgen.traces import TraceRequest
    from serving.perf.feedback import correct_efficiency
    from serving.sim import simulate

    base = load_efficiency("local-cpu")
    assert base is not None
    spec, hw = get_model("tiny-llama-s"), get_hardware("local-cpu")

    def run(eff: Efficiency, trace: list[TraceRequest]) -> ReplaySummary:
        model = StepTimeModel(spec, hw, weight_format="fp32", efficiency=eff)
        return simulate(
            trace, model=spec, hardware=hw, config=EngineConfig.cpu_default(), step_model=model
        ).summary

    # The engine the trials met: every step 1.6x the calibration's (a slower host) and 30 ms more
    # per request outside the engine (what the correction is built to find).
    slower = dataclasses.replace(
        base.scaled(compute=1.6, step=1.6, why="test"),
        request_overhead_ms=base.request_overhead_ms + 30.0,
    )
    # Requests far enough apart that none queues, even once the correction scales every step by
    # the TPOT ratio (whatever machine the stored calibration was measured on).
    one = [TraceRequest(0.0, 800, 20)]
    ratio = run(slower, one).tpot_ms.mean / run(base, one).tpot_ms.mean
    gap_s = 3.0 * ratio * run(slower, one).e2e_ms.mean / 1000.0
    trace = [TraceRequest(i * gap_s, 800, 20) for i in range(20)]
    live, predicted = run(slower, trace), run(base, trace)
    corrected = correct_efficiency(base, [(live, predicted)], weight=1.0)
    after = run(corrected, trace)
    assert abs(after.tpot_ms.mean - live.tpot_ms.mean) < abs(predicted.tpot_ms.mean - live.tpot_ms.mean)
    assert abs(after.ttft_ms.p50 - live.ttft_ms.p50) < abs(predicted.ttft_ms.p50 - live.ttft_ms.p50)
    assert "corrected from 1 live trial" in corrected.how


def test_h200_factors_from_the_kernel_benchmarks_ceilings(tmp_path: Path) -> None:
    from serving.perf.h200_profile import from_kernel_benchmark

    kernels = tmp_path / "kernels.json"
    kernels.write_text(
        json.dumps(
            {
                "machine": "NVIDIA H200",
                "date": "2026-11-30",
                "versions": {},
                "ceilings": {"bf16_matmul_flop_per_s": 0.7 * 989e12, "copy_bytes_per_s": 0.9 * 4800e9},
                "cases": [{"case": "decode_attention", "bw_frac": 0.8}, {"case": "rmsnorm", "bw_frac": 0.95}],
            }
        )
    )
    out = from_kernel_benchmark(kernels, tmp_path / "h200.json")
    eff = out["efficiency"]
    assert eff["gemm_efficiency"] == pytest.approx(0.7) and eff["memory_efficiency"] == pytest.approx(0.72)
    assert out["held_out_mape"] is None and "priors, not measured" in eff["how"]
    assert Efficiency.from_mapping(eff).measured


def test_the_measured_format_factors_reproduce_the_engines_bf16_runs() -> None:
    """The bf16 factors come from the CPU engine's own bf16 runs (`calibrate --dtype bfloat16`):
    with them the model predicts those runs, and the measured bf16/fp32 step-time ratio (on this
    machine's vLLM CPU kernels bf16 is nowhere near its matmul peak's promise)."""
    import statistics

    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import get_model
    from serving.perf.calibrate import DATA_DIR
    from serving.perf.model import StepTimeModel, nearest_measured

    data = json.loads((DATA_DIR / "local_cpu.json").read_text())
    eff, _ = nearest_measured(get_hardware("local-cpu"))
    assert "bf16" in eff.format_factors and "bf16" in eff.format_memory_factors
    model, hw = get_model(data["engine"]["model"]), get_hardware("local-cpu")
    fp32 = StepTimeModel(model, hw, weight_format="fp32", efficiency=eff)
    bf16 = StepTimeModel(model, hw, weight_format="bf16", compute_format="bf16", efficiency=eff)
    measured_fp32 = {o["label"]: Observation.from_mapping(o) for o in data["observations"]}
    errors, measured_ratio, predicted_ratio = [], [], []
    for raw in data["formats"]["bf16"]["observations"]:
        obs = Observation.from_mapping(raw)
        errors.append(abs(predict_observation(obs, bf16) - obs.measured_s) / obs.measured_s)
        base = measured_fp32[obs.label]
        if obs.open_streams == 0:  # the streams' probes measure the API server, not a format
            measured_ratio.append(obs.measured_s / base.measured_s)
            predicted_ratio.append(predict_observation(obs, bf16) / predict_observation(base, fp32))
    assert statistics.median(errors) <= 0.15
    assert statistics.median(predicted_ratio) == pytest.approx(statistics.median(measured_ratio), rel=0.15)


def test_the_stream_cost_estimate_ignores_a_probe_that_waited_for_a_whole_stream() -> None:
    # 27 probes: most near 30 ms, a few moderately late, one that waited 1.5 s for the background.
    probes = [0.030] * 20 + [0.045] * 4 + [0.060, 0.080, 1.500]
    assert trimmed_mean(probes, 0.2) == pytest.approx(0.030 + (0.045 - 0.030) * 2 / 17, rel=1e-9)
    # A plain mean is decided by the one outlier; the median ignores the moderate delays too.
    assert sum(probes) / len(probes) > 0.08
    assert trimmed_mean([0.01], 0.2) == 0.01
    with pytest.raises(ValueError, match="no values"):
        trimmed_mean([], 0.2)
    with pytest.raises(ValueError, match="trim"):
        trimmed_mean([1.0], 0.5)


def test_refit_fits_the_stored_observations_again_and_keeps_them(tmp_path: Path) -> None:
    from serving.perf.calibrate import main as calibrate

    stored = json.loads((DATA_DIR / "local_cpu.json").read_text())
    path = tmp_path / "local_cpu.json"
    path.write_text(json.dumps(stored))
    assert calibrate(["--refit", "--out", str(path)]) == 0
    refitted = json.loads(path.read_text())
    assert refitted["observations"] == stored["observations"]
    assert refitted["measured_at"] == stored["measured_at"]
    assert refitted["refitted"]["how"].startswith("python -m serving.perf.calibrate --refit")
    assert "; refitted " in refitted["efficiency"]["how"]
    assert [r["label"] for r in refitted["fit"]] == [o["label"] for o in stored["observations"]]
    for row in refitted["fit"]:
        assert row["fitted_ms"] > 0 and math.isfinite(row["fitted_ms"])
    # the fit leaves the median observation within 15% (its measurements are medians of rounds)
    errors = sorted(abs(r["fitted_ms"] / r["measured_ms"] - 1) for r in refitted["fit"])
    assert errors[len(errors) // 2] < 0.15


def test_refit_without_stored_observations_says_so_and_writes_nothing(tmp_path: Path) -> None:
    from serving.perf.calibrate import main as calibrate

    path = tmp_path / "local_cpu.json"
    path.write_text(json.dumps({"hardware": {"fp32_tflops": 0.2}}))
    with pytest.raises(SystemExit, match="no stored observations"):
        calibrate(["--refit", "--out", str(path)])
    assert json.loads(path.read_text()) == {"hardware": {"fp32_tflops": 0.2}}
    with pytest.raises(SystemExit, match="no calibration to refit"):
        calibrate(["--refit", "--out", str(tmp_path / "absent.json")])


def test_a_cpu_format_without_its_own_calibration_says_so_in_the_basis() -> None:
    fitted = Efficiency("local-cpu", 0.5, 0.4, 0.2, 1.0, 0.0, 1.0, 0.08, 0.0, 7.0, True, "fp32 fit")
    spec, cpu = get_model("tiny-llama-s"), get_hardware("local-cpu")
    bf16 = StepTimeModel(spec, cpu, weight_format="bf16", efficiency=fitted)
    assert "bf16 not calibrated on this host" in bf16.basis
    timed = dataclasses.replace(fitted, format_factors={"bf16": 2.0}, format_memory_factors={"bf16": 2.0})
    assert "not calibrated" not in StepTimeModel(spec, cpu, weight_format="bf16", efficiency=timed).basis
    assert "not calibrated" not in StepTimeModel(spec, cpu, weight_format="fp32", efficiency=fitted).basis


def test_the_token_compute_share_grows_with_the_model_where_the_constant_cost_does_not() -> None:
    # A per-token cost that is a share of the token's linear-layer compute time costs an 8B model
    # far less per token than a 70B one; the constant per-token cost costs both alike.
    base = load_efficiency("h200", live=False)
    assert base is not None
    quiet = dataclasses.replace(base, token_overhead_ms=0.0, token_compute_share=0.0)
    share = dataclasses.replace(quiet, token_compute_share=0.3)
    constant = dataclasses.replace(quiet, token_overhead_ms=0.006)

    def per_token_ms(model: str, eff: Efficiency) -> float:
        m = StepTimeModel(get_model(model), get_hardware("h200"), efficiency=eff)
        q = StepTimeModel(get_model(model), get_hardware("h200"), efficiency=quiet)
        return (m.step_parts(4096, 1, 1, 0.0, 0, 0)[3] - q.step_parts(4096, 1, 1, 0.0, 0, 0)[3]) / 4096 * 1000

    small, large = per_token_ms("llama-3.1-8b", share), per_token_ms("llama-3.1-70b", share)
    assert 0 < small < large / 5  # the 70B has about 9x the 8B's linear-layer FLOPs per token
    assert per_token_ms("llama-3.1-8b", constant) == pytest.approx(per_token_ms("llama-3.1-70b", constant))


def test_a_split_attention_costs_a_mixed_steps_chunks_and_decodes_each_at_its_own_roofline() -> None:
    """With `attention_split` 1 a step holding a prompt chunk beside decodes pays the chunk's
    compute and the decodes' KV reads, summed; 0 keeps the one roofline (the slower side). A step
    of one kind costs the same either way, and a live fit may not set the form outside [0, 1]."""
    from serving.perf.model import apply_live_fit

    hardware = get_hardware("h200")
    model = get_model("llama-3.1-8b")
    whole = StepTimeModel(model, hardware, efficiency=GPU_EFF)
    split = StepTimeModel(model, hardware, efficiency=dataclasses.replace(GPU_EFF, attention_split=1.0))
    half = StepTimeModel(model, hardware, efficiency=dataclasses.replace(GPU_EFF, attention_split=0.5))
    # A 1,024-token chunk 8,192 tokens into its prompt, beside 64 decodes of 8,192 tokens' context.
    chunk, cached, decodes, ctx = 1024, 8192, 64, 8192
    mixed = StepShape(
        num_prefill_tokens=chunk,
        num_decode_tokens=decodes,
        num_seqs=decodes + 1,
        num_sampled=decodes,
        prefill_attn_pairs=chunk * (cached + (chunk + 1) / 2.0),
        prefill_cached_tokens=cached,
        decode_ctx_tokens=decodes * ctx,
    )
    a0, a1, ah = (m.step_time(mixed).attention_s for m in (whole, split, half))
    s_flop = 1.0 / (hardware.peak_flops("bf16") * GPU_EFF.attention_efficiency)
    s_byte = model.kv_bytes_per_token("bf16") / (
        hardware.memory_bandwidth_bytes_per_s * GPU_EFF.memory_efficiency
    )
    prefill_flops = mixed.prefill_attn_pairs * model.attention_flops_per_pair(decode=False)
    decode_flops = mixed.decode_ctx_tokens * model.attention_flops_per_pair(decode=True)
    chunks_s = max(prefill_flops * s_flop, (cached + chunk + decodes) * s_byte)
    decodes_s = max(decode_flops * s_flop, mixed.decode_ctx_tokens * s_byte)
    assert a1 == pytest.approx(chunks_s + decodes_s, rel=1e-9)
    kv_all = mixed.decode_ctx_tokens + cached + mixed.num_tokens
    assert a0 == pytest.approx(max((prefill_flops + decode_flops) * s_flop, kv_all * s_byte), rel=1e-9)
    assert a0 < a1 and ah == pytest.approx((a0 + a1) / 2, rel=1e-9)
    # The hot path agrees with step_time.
    parts = (
        mixed.num_tokens,
        mixed.num_seqs,
        mixed.num_sampled,
        mixed.prefill_attn_pairs,
        cached,
        mixed.decode_ctx_tokens,
    )
    assert split.step_seconds(*parts) == pytest.approx(split.step_time(mixed).total_s, rel=1e-12)
    for one_kind in (decode_shape(decodes, ctx), prefill_shape(1, 4096)):
        assert split.step_time(one_kind).attention_s == pytest.approx(whole.step_time(one_kind).attention_s)
    with pytest.raises(ValueError, match="attention_split must be in"):
        apply_live_fit(GPU_EFF, {"fitted": {"attention_split": 2.0}})
    with pytest.raises(ValueError, match="attention_split must be in"):
        StepTimeModel(model, hardware, efficiency=dataclasses.replace(GPU_EFF, attention_split=-1.0))


def test_a_step_outside_the_cuda_graphs_costs_at_least_the_eager_floor() -> None:
    from serving.engine import EngineConfig
    from serving.loadgen.traces import TraceRequest
    from serving.perf.model import nearest_measured
    from serving.sim import simulate

    model, hw = get_model("llama-3.1-8b"), get_hardware("h100")
    stored, _ = nearest_measured(hw)
    floored = dataclasses.replace(stored, eager_step_floor_ms=200.0, eager_layer_floor_us=0.0)
    plain = StepTimeModel(model, hw, efficiency=floored)  # graphs unknown: no floor
    inside = StepTimeModel(model, hw, efficiency=floored, graph_max_tokens=512)
    args = (1024, 1, 1, 1024 * 512.5, 0, 0)
    assert plain.step_seconds(*args) < 0.200
    assert inside.step_seconds(*args) == pytest.approx(0.200)
    assert sum(inside.step_parts(*args)) == pytest.approx(0.200)  # the gap is the host's overhead
    small = (512, 1, 1, 512 * 256.5, 0, 0)  # inside the graphs: as before
    assert inside.step_seconds(*small) == pytest.approx(plain.step_seconds(*small))
    eager = StepTimeModel(model, hw, efficiency=floored, graph_max_tokens=0)  # enforce_eager
    assert eager.step_seconds(1, 1, 1, 0.0, 0, 1000) == pytest.approx(0.200)
    with pytest.raises(ValueError, match="eager_step_floor_ms"):
        StepTimeModel(model, hw, efficiency=dataclasses.replace(stored, eager_step_floor_ms=-1.0))
    # In the simulator: a 2,048-token prompt at a budget of 1,024 takes two floored steps, its
    # decodes (one sequence, inside the graphs) none; the graphs go with enforce_eager.
    trace = [TraceRequest(arrival_s=0.0, num_prompt_tokens=2048, num_output_tokens=4)]
    config = EngineConfig(max_num_batched_tokens=1024, max_model_len=4096)
    base = simulate(trace, model=model, hardware=hw, config=config, efficiency=stored)
    with_floor = simulate(trace, model=model, hardware=hw, config=config, efficiency=floored)
    assert with_floor.requests[0].ttft_ms > base.requests[0].ttft_ms
    assert with_floor.busy_s == pytest.approx(
        base.busy_s - sum(s for n, (_, s) in base.step_tokens.items() if n > 512) + 2 * 0.200
    )
    assert with_floor.requests[0].tpot_ms == pytest.approx(base.requests[0].tpot_ms)
    eager_config = EngineConfig(max_num_batched_tokens=1024, max_model_len=4096, enforce_eager=True)
    all_eager = simulate(trace, model=model, hardware=hw, config=eager_config, efficiency=floored)
    assert all_eager.requests[0].tpot_ms == pytest.approx(200.0, rel=0.05)


def test_the_eager_floor_has_a_part_per_layer_and_scales_with_the_steps() -> None:
    from serving.perf.model import apply_eager_fit, nearest_measured

    hw = get_hardware("h100")
    stored, _ = nearest_measured(hw)
    fit = apply_eager_fit(stored, {"fitted": {"eager_step_floor_ms": 1.0, "eager_layer_floor_us": 500.0}})
    assert (fit.eager_step_floor_ms, fit.eager_layer_floor_us) == (1.0, 500.0)
    small, big = get_model("llama-3.1-8b"), get_model("qwen3-8b")  # 32 and 36 layers
    for model, floor_s in ((small, 0.001 + 32 * 0.0005), (big, 0.001 + 36 * 0.0005)):
        steps = StepTimeModel(model, hw, efficiency=fit, graph_max_tokens=512)
        assert steps.eager_floor_s == pytest.approx(floor_s)
        assert steps.step_seconds(600, 1, 1, 600 * 300.5, 0, 0) >= floor_s - 1e-12
    # `scaled` (a slower engine) lengthens the floor with the other fixed costs
    slow = fit.scaled(compute=2.0, step=2.0, why="test")
    assert (slow.eager_step_floor_ms, slow.eager_layer_floor_us) == (2.0, 1000.0)
    for bad in (
        {},
        {"eager_step_floor_ms": -1.0},
        {"step_overhead_ms": 1.0},
        {"eager_layer_floor_us": float("nan")},
    ):
        with pytest.raises(ValueError, match="eager-floor fit"):
            apply_eager_fit(stored, {"fitted": bad})
    with pytest.raises(ValueError, match="eager_layer_floor_us"):
        StepTimeModel(small, hw, efficiency=dataclasses.replace(stored, eager_layer_floor_us=-1.0))
