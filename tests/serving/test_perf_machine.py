"""The local calibration's machine check: which figures moved since the calibration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from serving.perf.machine import TOLERANCE, check_local_machine, machine_differences

CALIBRATED = {"fp32_tflops": 0.204, "bf16_tflops": 0.944, "memory_bandwidth_gbps": 44.0, "memory_gb": 25.3}


def test_the_same_machine_within_the_tolerance_matches() -> None:
    near = {k: v * (1 + TOLERANCE * 0.9) for k, v in CALIBRATED.items()}
    assert machine_differences(CALIBRATED, near) == []


def test_each_figure_that_moved_is_named_with_both_values() -> None:
    # A later session's machine: fp32 and bf16 matmul and the copy bandwidth all lower.
    now = {"fp32_tflops": 0.0906, "bf16_tflops": 0.135, "memory_bandwidth_gbps": 30.0, "memory_gb": 25.3}
    lines = machine_differences(CALIBRATED, now)
    assert len(lines) == 3
    assert lines[0] == "fp32 matmul 0.0906 TFLOPS now, 0.204 TFLOPS when calibrated (0.44x)"
    assert "bf16 matmul" in lines[1] and "(0.14x)" in lines[1]
    assert lines[2] == "copy bandwidth 30 GB/s now, 44 GB/s when calibrated (0.68x)"
    # Faster counts too: the efficiencies were fitted against the old figures.
    assert machine_differences(CALIBRATED, {"fp32_tflops": 0.3}) == [
        "fp32 matmul 0.3 TFLOPS now, 0.204 TFLOPS when calibrated (1.47x)"
    ]


def test_missing_or_unusable_figures_are_not_differences() -> None:
    assert machine_differences({"fp32_tflops": 0.0}, {"fp32_tflops": 0.1}) == []
    assert machine_differences({}, CALIBRATED) == []
    assert machine_differences(CALIBRATED, {"fp32_tflops": "fast"}) == []


def test_the_check_reads_the_calibration_file(tmp_path: Path) -> None:
    path = tmp_path / "local_cpu.json"
    path.write_text(json.dumps({"measured_at": "2026-12-01T14:22:23+00:00", "hardware": CALIBRATED}))
    same = check_local_machine(path, measured_now=CALIBRATED)
    assert same.matches and same.to_dict()["differences"] == []
    moved = check_local_machine(path, measured_now={**CALIBRATED, "memory_bandwidth_gbps": 30.0})
    data = moved.to_dict()
    assert not moved.matches and data["calibrated_at"] == "2026-12-01T14:22:23+00:00"
    assert data["measured_now"]["memory_bandwidth_gbps"] == 30.0 and len(data["differences"]) == 1


def test_simulating_the_local_cpu_measures_this_machine_against_its_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from serving.sim_commands import register

    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 500, "input_length": 200, "output_length": 8}) + "\n"
            for i in range(5)
        )
    )
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["simulate", "--trace", str(trace), "--model", "tiny-llama-s", "--hardware", "local-cpu", "--json"]
    )
    assert args.func(args) == 0
    check = json.loads(capsys.readouterr().out)["machine_check"]
    # Measured here and now (the values depend on the machine; their presence and shape do not).
    assert check["measured_now"]["fp32_tflops"] > 0 and check["measured_now"]["memory_bandwidth_gbps"] > 0
    assert check["calibrated"]["fp32_tflops"] > 0 and check["calibrated_at"]
    assert check["matches"] == (check["differences"] == [])
    # Other hardware is predicted from its catalog figures: no local check.
    args = parser.parse_args(
        ["simulate", "--trace", str(trace), "--model", "tiny-llama-s", "--hardware", "h200"]
    )
    assert args.func(args) == 0
    assert "machine_check" not in capsys.readouterr().out


def test_a_cpu_engine_on_every_core_is_simulated_with_its_compute_shared_over_them(tmp_path: Path) -> None:
    import os

    from serving.engine.config import EngineConfig
    from serving.sim.api import simulate_trace
    from serving.sim.simulator import cpu_compute_parallelism

    cores = sorted(os.sched_getaffinity(0))
    default = EngineConfig(max_model_len=4096, enforce_eager=True)
    everything = EngineConfig(
        max_model_len=4096,
        enforce_eager=True,
        extra_env=(("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}-{cores[-1]}"),),
    )
    assert cpu_compute_parallelism(default) == 1.0
    if len(cores) < 2:
        return
    # vLLM keeps one core for its frontend: every core is len/(len-1) times the compute.
    assert cpu_compute_parallelism(everything) == pytest.approx(len(cores) / (len(cores) - 1))
    one = EngineConfig(extra_env=(("VLLM_CPU_OMP_THREADS_BIND", "0,1|2"),))
    assert cpu_compute_parallelism(one) == pytest.approx(2 / (len(cores) - 1))  # the first rank's list
    # A long single prefill is compute-bound: faster on every core; the fixed costs stay.
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 3000, "output_length": 2}) + "\n")
    ttft = {
        name: simulate_trace(
            trace, model="tiny-llama-m", hardware="local-cpu", config=config
        ).summary.ttft_ms.p50
        for name, config in (("default", default), ("every core", everything))
    }
    speedup = ttft["default"] / ttft["every core"]
    assert 1.2 < speedup <= len(cores) / (len(cores) - 1)
    # Datasheet hardware ignores the CPU binding.
    assert simulate_trace(
        trace, model="tiny-llama-m", hardware="h200", config=everything
    ).summary.ttft_ms.p50 == (
        simulate_trace(trace, model="tiny-llama-m", hardware="h200", config=default).summary.ttft_ms.p50
    )


def test_the_check_is_the_median_of_several_measurements(tmp_path: Path) -> None:
    """One noisy draw does not decide: the copy bandwidth below swings by a third between draws
    (as it did on this host), and only its median is compared with the calibration."""
    path = tmp_path / "local_cpu.json"
    path.write_text(json.dumps({"measured_at": "2026-12-04T13:13:03+00:00", "hardware": CALIBRATED}))
    bandwidths = iter([44.0, 58.0, 45.0, 43.0, 57.0])

    def measure() -> dict[str, float]:
        return {**CALIBRATED, "memory_bandwidth_gbps": next(bandwidths)}

    check = check_local_machine(path, measure=measure, rounds=5)
    data = check.to_dict()
    assert check.matches, data["differences"]
    assert data["measured_now"]["memory_bandwidth_gbps"] == 45.0
    assert data["measured_range"]["memory_bandwidth_gbps"] == [43.0, 58.0] and data["rounds"] == 5
    # The same draws one at a time: the second alone would have named a different machine.
    assert machine_differences(CALIBRATED, {"memory_bandwidth_gbps": 58.0})
    # A machine that really moved still differs, whatever one draw says.
    slow = iter([30.0, 44.0, 29.0, 31.0, 30.0])
    moved = check_local_machine(path, measure=lambda: {"memory_bandwidth_gbps": next(slow)}, rounds=5)
    assert moved.differences == ["copy bandwidth 30 GB/s now, 44 GB/s when calibrated (0.68x)"]
    with pytest.raises(ValueError, match="1 to 20 rounds"):
        check_local_machine(path, measure=measure, rounds=0)


def _calibration_with(tmp_path: Path, observations: dict[str, float]) -> Path:
    """A calibration file holding these (label: seconds) observations."""
    path = tmp_path / "local_cpu.json"
    rows = [
        {"kind": "ttft", "label": label, "measured_s": s, "steps": []} for label, s in observations.items()
    ]
    path.write_text(json.dumps({"hardware": CALIBRATED, "observations": rows}))
    return path


def test_an_engine_probe_scales_the_calibration_by_what_moved(tmp_path: Path) -> None:
    from serving.perf.machine import EngineSpeed, calibrated_probe_shapes
    from serving.perf.model import load_efficiency

    path = _calibration_with(tmp_path, {"single prefill 512": 0.020, "decode x1 ctx 64": 0.0025})
    assert calibrated_probe_shapes(512, path) == (0.020, 0.0025)
    with pytest.raises(ValueError, match="single prefill 256"):
        calibrated_probe_shapes(256, path)

    # Prefills take 1.5x as long now, decode steps 0.8x.
    speed = EngineSpeed(
        prefill_s=0.030, decode_s=0.002, calibrated_prefill_s=0.020, calibrated_decode_s=0.0025
    )
    assert speed.compute_scale == pytest.approx(1.5) and speed.step_scale == pytest.approx(0.8)
    assert EngineSpeed.from_dict(speed.to_dict()) == speed
    stored = load_efficiency("local-cpu")
    assert stored is not None
    now = speed.correct(stored)
    assert now.gemm_efficiency == pytest.approx(stored.gemm_efficiency / 1.5)
    assert now.attention_efficiency == pytest.approx(stored.attention_efficiency / 1.5)
    assert now.memory_efficiency == pytest.approx(stored.memory_efficiency / 0.8)
    assert now.step_overhead_ms == pytest.approx(stored.step_overhead_ms * 0.8)
    assert now.request_overhead_ms == stored.request_overhead_ms  # the frontend's: not the engine's
    assert "engine probe: prefill x1.500, decode step x0.800" in now.how
    with pytest.raises(ValueError, match="positive and finite"):
        stored.scaled(compute=0.0, step=1.0, why="x")
