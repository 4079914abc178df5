"""Hardware with no price (a pool created without one, the operator's own machine, a price of
0) gives no cost to rank on: selection and the search rank on latency alone, never divide by or
compare costs of 0, and say why (issue 27 finding 9, issue 20)."""

from __future__ import annotations

from tuning.search.job import objective
from tuning.search.selection import Candidate, select
from tuning.search.slo import parse_slo


def _trial(trial: int, cost: float | None, p95: float, ci: tuple[float, float], knobs: int) -> Candidate:
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


def test_not_priced_the_clearly_fastest_wins_whatever_its_knobs() -> None:
    result = select(
        [_trial(0, None, 800, (780, 820), knobs=1), _trial(1, None, 300, (280, 320), knobs=3)], priced=False
    )
    assert result.winner == 1 and not result.tie
    assert "not priced, so ranked by latency" in result.summary and "$" not in result.summary
    assert result.reasons[0] == "met the SLO but p95 TTFT 800 ms vs 300 ms (not priced)"
    assert result.pareto == ()  # no cost axis


def test_not_priced_within_the_noise_the_simplest_wins() -> None:
    result = select(
        [
            _trial(0, None, 500, (400, 600), knobs=3),
            _trial(1, None, 520, (420, 620), knobs=1),
            _trial(2, None, 900, (880, 920), knobs=0),  # clearly slower: not in the tie
        ],
        priced=False,
    )
    assert result.winner == 1 and result.tie
    assert "(tie; the winner is simpler)" in result.reasons[0]
    assert result.reasons[2] == "met the SLO but p95 TTFT 900 ms vs 520 ms (not priced)"


def test_costs_of_zero_are_no_price_and_never_rank() -> None:
    # Results stored while a $0 price still made a cost of 0: ranked by latency, as unpriced.
    result = select([_trial(0, 0.0, 800, (780, 820), knobs=1), _trial(1, 0.0, 300, (280, 320), knobs=3)])
    assert result.winner == 1 and "not priced" in result.summary and "$0.0000" not in result.summary
    # A zero cost beside a priced one is no cost, not the cheapest.
    mixed = select([_trial(0, 0.0, 300, (280, 320), knobs=0), _trial(1, 0.002, 800, (780, 820), knobs=2)])
    assert mixed.winner == 1 and mixed.reasons[0] == "no cost measured"
    assert mixed.pareto == (1,)


def test_priced_hardware_still_ranks_on_cost() -> None:
    result = select([_trial(0, 0.004, 300, (280, 320), knobs=0), _trial(1, 0.002, 800, (780, 820), knobs=2)])
    assert result.winner == 1 and "lowest cost per million tokens ($0.0020)" in result.summary


def test_the_search_minimises_latency_when_not_priced() -> None:
    slo = parse_slo("ttft_p95_ms<=1000")
    ok = {
        "status": "ok",
        "slo_met": True,
        "correctness": {"passed": True},
        "reliability": {"passed": True},
        "ttft_p95_ms": 420.0,
        "cost_per_mtok_usd": None,
    }
    assert objective(ok, slo, priced=False) == 420.0
    # Before: a zero cost scored every passing configuration 0, so the search learned nothing.
    assert objective({**ok, "cost_per_mtok_usd": 0.0}, slo, priced=False) == 420.0
    assert objective({**ok, "cost_per_mtok_usd": 0.3}, slo) == 0.3
