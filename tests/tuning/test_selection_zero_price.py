"""A hardware entry priced at $0 (the catalog accepts it) gives candidates a cost of 0: selection
must still choose, never divide by the cheapest cost (issue 27 finding 9)."""

from __future__ import annotations

from tuning.search.selection import Candidate, select


def _free(trial: int, cost: float, p95: float, ci: tuple[float, float], knobs: int) -> Candidate:
    return Candidate(
        trial=trial,
        label=f"t{trial}",
        num_changed_knobs=knobs,
        slo_met=True,
        slo_violations=(),
        gates_passed=True,
        gate_reasons=(),
        cost_per_mtok_usd=cost,
        ttft_p50_ms=p95 / 2,
        ttft_p95_ms=p95,
        ttft_p95_ci_ms=ci,
    )


def test_zero_price_hardware_ties_on_cost_and_the_simpler_configuration_wins() -> None:
    result = select([_free(0, 0.0, 500, (400, 600), knobs=3), _free(1, 0.0, 520, (420, 620), knobs=1)])
    assert result.winner == 1 and result.tie
    assert "$0.0000" in result.reasons[0]


def test_zero_cost_beats_any_positive_cost_and_is_not_a_tie() -> None:
    result = select([_free(0, 0.0, 800, (780, 820), knobs=2), _free(1, 0.001, 300, (280, 320), knobs=1)])
    assert result.winner == 0 and not result.tie
    assert result.pareto == (0, 1)


def test_zero_cost_with_a_clearly_faster_tied_candidate() -> None:
    result = select([_free(0, 0.0, 800, (780, 820), knobs=1), _free(1, 0.0, 300, (280, 320), knobs=3)])
    assert result.winner == 1 and not result.tie
