"""The load steps a trial tries beyond its target (its capacity probe) are the user's to choose,
in the library, the command line, the portal's form and its API alike, and are bounded: at most
MAX_CAPACITY_STEPS rising multiples above 1 and at most MAX_CAPACITY_MULTIPLE."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.cli import main as tailguard
from tuning.search.job import (
    MAX_CAPACITY_MULTIPLE,
    MAX_CAPACITY_STEPS,
    JobSpec,
    JobSpecError,
    parse_capacity_steps,
    validate,
)


@pytest.mark.parametrize(
    ("text", "steps"),
    [("1.5, 2, 3", (1.5, 2.0, 3.0)), ("2x 4x", (2.0, 4.0)), ("none", ()), (" 0 ", ()), ("1.25", (1.25,))],
)
def test_load_steps_are_read_as_rising_multiples(text: str, steps: tuple[float, ...]) -> None:
    assert parse_capacity_steps(text) == steps


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("2, 1.5", "must rise"),
        ("1.5, 1.5", "must rise"),
        ("1", "above 1"),
        (f"{MAX_CAPACITY_MULTIPLE + 1:g}", f"at most {MAX_CAPACITY_MULTIPLE:g}"),
        ("nan", "above 1"),
        ("two", "multiples of the target rate"),
        (", ".join(str(1.5 + i) for i in range(MAX_CAPACITY_STEPS + 1)), f"at most {MAX_CAPACITY_STEPS}"),
    ],
)
def test_bad_load_steps_are_refused_naming_the_rule(text: str, said: str) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_capacity_steps(text)
    assert info.value.field == "capacity_steps" and said in info.value.message, info.value.message


def test_the_library_checks_the_steps_of_a_spec(model_dir: Path, shared_traces: Path) -> None:
    spec = JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model_dir),
        slo="ttft_p95_ms<=1000",
        peak_rps=1.0,
        capacity_steps=(3.0, 2.0),
    )
    with pytest.raises(JobSpecError, match="must rise"):
        validate(spec)


def test_the_command_refuses_bad_steps_before_any_engine(
    model_dir: Path, shared_traces: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "tune",
        *("--trace", str(shared_traces / "mooncake_synthetic.jsonl"), "--model", str(model_dir)),
        *("--slo", "ttft_p95_ms<=1000", "--peak-rps", "1", "--capacity-steps", "3,2"),
        *("--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "report.json")),
    ]
    assert tailguard(argv) == 1
    assert "capacity_steps: load steps must rise" in capfd.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "report.json").exists()
