"""The bootstrap shapes benchmark result files report their intervals with (benchmarks/_stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks._stats import interval, pooled_interval, pooled_ratio_interval, ratio_interval


def test_interval_of_repeats_holds_the_sample_median_and_narrows_with_more_repeats():
    rng = np.random.default_rng(1)
    few = interval(rng.normal(10.0, 1.0, 8).tolist())
    many = interval(rng.normal(10.0, 1.0, 400).tolist())
    for fig in (few, many):
        assert fig["ci_low"] <= fig["value"] <= fig["ci_high"]
    assert many["ci_low"] < 10.0 < many["ci_high"]
    assert many["ci_high"] - many["ci_low"] < few["ci_high"] - few["ci_low"]


def test_one_repeat_has_a_value_but_no_interval():
    assert interval([3.0]) == {"value": 3.0, "ci_low": None, "ci_high": None}
    assert ratio_interval([2.0], [1.0]) == {"value": 2.0, "ci_low": None, "ci_high": None}


def test_paired_ratio_sees_a_consistent_difference_that_drifting_rounds_would_hide():
    # Each round drifts a lot, the second arm is always 20% slower in its round: pairing keeps
    # the ratio's interval tight around 1/1.2, below 1.
    drift = np.array([1.0, 3.0, 0.5, 2.0, 5.0, 0.8, 1.5, 4.0])
    fig = ratio_interval((drift / 1.2).tolist(), drift.tolist())
    assert fig["value"] == pytest.approx(1 / 1.2, rel=1e-3)
    assert fig["ci_high"] < 1.0


def test_paired_ratio_refuses_unpaired_repeats():
    with pytest.raises(ValueError, match="paired"):
        ratio_interval([1.0, 2.0], [1.0])


def test_pooled_interval_resamples_whole_blocks():
    # Within-block values identical: the only spread is between blocks, which the interval carries.
    blocks = [[v] * 50 for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
    fig = pooled_interval(blocks, np.median)
    assert fig["value"] == pytest.approx(3.5)
    assert fig["ci_low"] <= 2.5 and fig["ci_high"] >= 4.5  # a request-level bootstrap would be ~3.5 +- 0.5


def test_pooled_ratio_of_two_identical_arms_holds_one_and_a_doubled_arm_does_not():
    rng = np.random.default_rng(7)
    b = [rng.exponential(100.0, 40).tolist() for _ in range(8)]
    fig = pooled_ratio_interval(b, b, lambda x: float(np.percentile(x, 95)))
    assert fig["value"] == 1.0
    assert fig["ci_low"] < 1.0 < fig["ci_high"]
    slower = [[v * 2 for v in block] for block in b]
    assert pooled_ratio_interval(slower, b, np.median)["ci_low"] > 1.0
