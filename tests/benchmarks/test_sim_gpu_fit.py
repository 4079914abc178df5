"""The GPU fit's measured frontend cost: the slope of what single requests spent outside the
engine's queue and prefill, over their prompt length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_gpu_fit import DEFAULT_FIELDS, MEASURED_FIELDS, frontend_token_cost


def _isolated(tmp_path: Path, lengths: list[int], *, ms_per_token: float, fixed_ms: float) -> Path:
    """A live file of single requests whose client TTFT is the engine's prefill plus a frontend
    cost of `fixed_ms` and `ms_per_token` per prompt token."""
    entries = []
    for n in lengths:
        prefill = 2.0 + 0.03 * n
        outside = fixed_ms + ms_per_token * n
        entries.append(
            {
                "prompt_tokens": n,
                # two repeats either side of the mean: the mean is what is measured
                "ttft_ms": [prefill + outside - 1.0, prefill + outside + 1.0],
                "engine": {"prefill_mean_ms": prefill, "queue_mean_ms": 0.0},
            }
        )
    path = tmp_path / "isolated.json"
    path.write_text(json.dumps({"model": "m", "lengths": entries}))
    return path


def test_the_frontend_cost_is_the_slope_outside_the_engine(tmp_path: Path) -> None:
    got = frontend_token_cost(
        _isolated(tmp_path, [256, 1024, 4096, 16384], ms_per_token=0.006, fixed_ms=12.0)
    )
    assert got["ms_per_prompt_token"] == pytest.approx(0.006)
    assert got["intercept_ms"] == pytest.approx(12.0)
    assert got["residual_rms_ms"] == pytest.approx(0.0, abs=1e-9)
    assert got["prompt_tokens"] == [256, 1024, 4096, 16384]


def test_too_few_lengths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="fewer than 3"):
        frontend_token_cost(_isolated(tmp_path, [256, 1024], ms_per_token=0.006, fixed_ms=12.0))


def test_a_measured_cost_is_not_also_fitted() -> None:
    assert "prompt_token_overhead_ms" in MEASURED_FIELDS
    assert not set(MEASURED_FIELDS) & set(DEFAULT_FIELDS)
