"""The search budget's minimum holds in the library itself, not only in the portal's form and API
(issue 24 item 4): a budget below a baseline and one candidate is refused by `validate` with the
message the portal shows, and `tailguard tune` says it in one line with exit status 2, before
it reads anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.cli import main as tailguard
from tuning.search.job import (
    BUDGET_MIN_ERROR,
    MAX_BUDGET_TRIALS,
    MIN_BUDGET_TRIALS,
    JobSpec,
    JobSpecError,
    validate,
)

REPO = Path(__file__).resolve().parents[2]


def _spec(model_dir: Path, shared_traces: Path, budget: int) -> JobSpec:
    return JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model_dir),
        slo="ttft_p95_ms<=1000",
        peak_rps=1.0,
        budget_trials=budget,
    )


@pytest.mark.parametrize("budget", [MIN_BUDGET_TRIALS - 1, 0, -3])
def test_the_library_refuses_a_budget_that_cannot_search(
    model_dir: Path, shared_traces: Path, budget: int
) -> None:
    with pytest.raises(JobSpecError) as info:
        validate(_spec(model_dir, shared_traces, budget))
    assert (info.value.field, info.value.message) == ("budget_trials", BUDGET_MIN_ERROR)


def test_the_library_takes_the_minimum_and_refuses_past_the_maximum(
    model_dir: Path, shared_traces: Path
) -> None:
    validate(_spec(model_dir, shared_traces, MIN_BUDGET_TRIALS))
    with pytest.raises(JobSpecError) as info:
        validate(_spec(model_dir, shared_traces, MAX_BUDGET_TRIALS + 1))
    assert info.value.field == "budget_trials" and str(MAX_BUDGET_TRIALS) in info.value.message


def _argv(tmp_path: Path, budget: str, *extra: str) -> list[str]:
    # The trace and the model do not exist: the budget is refused before either is read.
    return [
        "tune",
        *("--trace", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path / "no-model")),
        *("--slo", "ttft_p95_ms<=1000", "--peak-rps", "1", "--budget-trials", budget),
        *("--json", str(tmp_path / "out.json"), *extra),
    ]


@pytest.mark.parametrize("extra", [(), ("--pool", "cpu-pool")])
def test_the_cli_refuses_it_in_one_line_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]
) -> None:
    assert tailguard(_argv(tmp_path, "1", *extra)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"tailguard tune: --budget-trials 1: {BUDGET_MIN_ERROR}\n"
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.json.work").exists()


def test_the_installed_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", *_argv(tmp_path, "0")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"tailguard tune: --budget-trials 0: {BUDGET_MIN_ERROR}"]
    assert "Traceback" not in done.stderr and done.stdout == ""
