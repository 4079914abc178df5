"""A job's price per device-hour: the hardware target's own, or the one the spec carries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuning.search.job import JobSpec, JobSpecError, plan_job, validate
from tuning.search.space import LOCAL_CPU


@pytest.fixture
def spec(model_dir: Path, shared_traces: Path) -> JobSpec:
    model = model_dir
    return JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model),
        slo="ttft_p95_ms<=1000",
        peak_rps=1.0,
        budget_trials=2,
        strategy="grid",  # no simulator ranking: only the plan matters here
        duration_s=5,
        capacity_steps=(2.0,),
    )


def test_plan_uses_the_specs_price_and_otherwise_the_targets(spec: JobSpec, tmp_path: Path) -> None:
    assert spec.price_per_hour_usd is None
    default = plan_job(spec, tmp_path / "default")
    assert default.plan.price_per_hour_usd == LOCAL_CPU.price_per_hour_usd

    overridden = JobSpec(**{**spec.to_dict(), "price_per_hour_usd": 3.25})
    prepared = plan_job(overridden, tmp_path / "override")
    assert prepared.plan.price_per_hour_usd == 3.25
    # The price travels with the stored spec, so every later step of the job plans with it.
    stored = JobSpec.from_dict(json.loads(json.dumps(overridden.to_dict())))
    assert stored.price_per_hour_usd == 3.25
    assert plan_job(stored, tmp_path / "override").plan.price_per_hour_usd == 3.25
    assert prepared.plan.priced
    # 0 is "not priced" (a pool without a price), not "unset" and not a free machine to rank on.
    unpriced = JobSpec(**{**spec.to_dict(), "price_per_hour_usd": 0.0})
    plan = plan_job(unpriced, tmp_path / "unpriced").plan
    assert plan.price_per_hour_usd == 0.0 and not plan.priced


def test_specs_stored_before_the_field_existed_keep_the_targets_price(spec: JobSpec) -> None:
    old = spec.to_dict()
    del old["price_per_hour_usd"]
    assert JobSpec.from_dict(old).price_per_hour_usd is None


@pytest.mark.parametrize("price", [-0.01, math.nan, math.inf])
def test_a_price_that_is_not_a_cost_is_refused(spec: JobSpec, price: float) -> None:
    with pytest.raises(JobSpecError) as info:
        validate(JobSpec(**{**spec.to_dict(), "price_per_hour_usd": price}))
    assert info.value.field == "price_per_hour_usd"
