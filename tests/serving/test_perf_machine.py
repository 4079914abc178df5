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
    path = tmp_path / "cpu_local.json"
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
        ["simulate", "--trace", str(trace), "--model", "tiny-llama-s", "--hardware", "cpu-local", "--json"]
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
