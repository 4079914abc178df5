"""The ranking and config-blind arithmetic of benchmarks/sim_accuracy.py, on hand-made numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from benchmarks.sim_accuracy import (
    best_constant,
    kendall_tau_b,
    mape,
    rank_group,
    ranking,
    top_k_hit,
    with_intervals,
)


def test_tau_of_identical_and_reversed_orders() -> None:
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau_b([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)


def test_tau_counts_one_swapped_pair() -> None:
    # 6 pairs, one discordant: (5 - 1) / 6.
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)


def test_tau_b_with_ties_matches_scipy_documented_value() -> None:
    # scipy.stats.kendalltau's own example: tau-b -0.47140452079103173.
    assert kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173)


def test_tau_is_none_when_one_side_is_constant() -> None:
    assert kendall_tau_b([5, 5, 5], [1, 2, 3]) is None
    assert kendall_tau_b([1.0], [2.0]) is None


def test_tau_rejects_unpaired_sequences() -> None:
    with pytest.raises(ValueError):
        kendall_tau_b([1, 2], [1, 2, 3])


def test_top_k_hit() -> None:
    measured = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert top_k_hit([1, 2, 3, 4, 5], measured, 1) == 1.0
    assert top_k_hit([5, 1, 3, 4, 2], measured, 1) == 0.0
    assert top_k_hit([5, 1, 3, 4, 2], measured, 3) == 1.0  # predicted best measured 2nd
    assert top_k_hit([5, 4, 3, 1, 2], measured, 3) == 0.0  # predicted best measured 4th


def test_top_k_hit_shares_a_tie_for_the_predicted_best() -> None:
    measured = [10.0, 20.0, 30.0, 40.0]
    # Configurations 0 and 3 tie as predicted best; only 0 is in the measured top 3.
    assert top_k_hit([1.0, 2.0, 3.0, 1.0], measured, 3) == 0.5
    assert top_k_hit([7.0, 7.0, 7.0, 7.0], measured, 3) == 0.75


def _objective(c: float, values: list[float]) -> float:
    return sum(abs(c - y) / y for y in values)


@pytest.mark.parametrize(
    "values",
    [
        [10.0],
        [10.0, 20.0],
        [10.0, 11.0, 12.0, 100.0],
        [97.4, 101.0, 96.5, 97.4, 97.4, 96.5],
        [5.0, 50.0, 500.0],
    ],
)
def test_best_constant_minimises_the_mape(values: list[float]) -> None:
    c = best_constant(values)
    # The objective is piecewise linear with kinks at the values: its minimum is at one of them.
    brute = min(_objective(y, values) for y in values)
    assert _objective(c, values) == pytest.approx(brute)
    for probe in np.linspace(min(values) * 0.5, max(values) * 1.5, 301):
        assert _objective(c, values) <= _objective(float(probe), values) + 1e-9


def test_best_constant_on_random_values_beats_mean_and_median() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        values = list(rng.lognormal(mean=3.0, sigma=1.0, size=int(rng.integers(2, 10))))
        c = best_constant(values)
        for other in (float(np.mean(values)), float(np.median(values)), *values):
            assert _objective(c, values) <= _objective(other, values) + 1e-9


def test_best_constant_leans_to_the_small_values() -> None:
    # Weights 1/y: the error of 100 against 10 costs 9, of 10 against 100 only 0.9.
    assert best_constant([10.0, 100.0]) == 10.0


def test_best_constant_rejects_non_positive_values() -> None:
    with pytest.raises(ValueError):
        best_constant([0.0, 1.0])
    with pytest.raises(ValueError):
        best_constant([])


def test_rank_group_perfect_prediction() -> None:
    names = ["a", "b", "c"]
    out = rank_group(names, [10.0, 20.0, 30.0], [11.0, 22.0, 33.0])
    assert out["kendall_tau"] == pytest.approx(1.0)
    assert out["top1_agreement"] == 1.0
    assert out["top3_hit"] == 1.0
    assert out["sim_mape"] == pytest.approx(1 / 11)
    # Weights 1/11, 1/22, 1/33: the first alone holds more than half.
    assert out["blind_constant_ms"] == 11.0
    assert out["blind_mape"] == pytest.approx((0 + 11 / 22 + 22 / 33) / 3)
    assert out["measured_order"] == ["a", "b", "c"]


def _row(config: str, trace: str, load: str, live: tuple[float, float], sim: tuple[float, float]) -> dict:
    return {
        "config": config,
        "trace": trace,
        "load": load,
        "live": {"ttft_p50_ms": live[0], "ttft_p95_ms": live[1]},
        "sim": {"ttft_p50_ms": sim[0], "ttft_p95_ms": sim[1]},
    }


def test_ranking_means_over_groups_and_pools_errors_over_cases() -> None:
    rows = [
        # Group 1: the simulator ranks p50 right, p95 reversed.
        _row("a", "t", "light", (10, 100), (10, 300)),
        _row("b", "t", "light", (20, 200), (20, 200)),
        _row("c", "t", "light", (40, 300), (40, 100)),
        # Group 2: p50 reversed.
        _row("a", "t", "loaded", (10, 50), (30, 50)),
        _row("b", "t", "loaded", (30, 60), (10, 60)),
        # A group of one configuration cannot be ranked: left out.
        _row("a", "u", "light", (10, 10), (10, 10)),
        # A case without a measurement is left out of its group.
        _row("b", "u", "light", (math.nan, 10), (10, 10)),
    ]
    out = ranking(rows)
    s = out["summary"]
    assert s["groups"] == 2
    assert s["rank_tau"] == pytest.approx((1.0 + -1.0) / 2)
    assert s["rank_tau_p95"] == pytest.approx((-1.0 + 1.0) / 2)
    assert s["top3_hit_rate"] == pytest.approx(1.0)  # a group of two: everything is in the top 3
    assert s["top1_agreement_rate"] == pytest.approx(0.5)
    sim_p50 = [0, 0, 0, 2.0, 20 / 30]
    assert s["ranked_p50_ttft_mape"] == pytest.approx(float(np.mean(sim_p50)))
    # Blind constants: 10 in both groups (the weight 1/10 outweighs 1/20 + 1/40, and 1/30).
    blind_p50 = [0, 10 / 20, 30 / 40, 0, 20 / 30]
    assert s["blind_p50_ttft_mape"] == pytest.approx(float(np.mean(blind_p50)))
    assert [g["load"] for g in out["groups"]] == ["light", "loaded"]


def test_mape_of_a_constant_equals_the_objective_over_n() -> None:
    values = [3.0, 4.0, 8.0]
    for c in itertools.chain(values, [5.0]):
        assert mape([c] * 3, values) == pytest.approx(_objective(c, values) / 3)


def test_float_noise_in_predictions_is_a_tie() -> None:
    # Two configurations the simulator cannot tell apart, up to rounding in its last digits.
    predicted = [96.52247049368479, 96.52247049368468, 100.0]
    assert kendall_tau_b(predicted, [2.0, 1.0, 3.0]) == kendall_tau_b([1.0, 1.0, 2.0], [2.0, 1.0, 3.0])
    assert top_k_hit(predicted, [30.0, 10.0, 20.0], 1) == 0.5


def test_every_summary_figure_carries_its_interval_beside_it() -> None:
    summary = {"headline": "run", "rank_tau": 0.36, "cases": 24, "tpot_mape": 0.27}
    intervals = {
        "rank_tau": {"value": 0.36, "ci_low": 0.28, "ci_high": 0.41},
        "tpot_mape": {"ci_low": 0.2, "ci_high": 0.3},
    }
    out = with_intervals(summary, intervals)
    assert list(out) == [
        "headline", "rank_tau", "rank_tau_ci_low", "rank_tau_ci_high", "cases",
        "tpot_mape", "tpot_mape_ci_low", "tpot_mape_ci_high",
    ]  # fmt: skip
    assert (out["rank_tau_ci_low"], out["rank_tau_ci_high"]) == (0.28, 0.41)
    assert "cases_ci_low" not in out  # a count has no interval
