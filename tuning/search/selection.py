"""Choosing the winner among measured candidates, and saying why the others lost."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """What selection needs to know about one finished trial."""

    trial: int  # trial number in the job
    label: str  # short human description of the configuration
    num_changed_knobs: int  # against the engine defaults: fewer is simpler
    slo_met: bool
    slo_violations: tuple[str, ...]
    gates_passed: bool
    gate_reasons: tuple[str, ...]
    cost_per_mtok_usd: float | None  # at the highest load it sustained within the SLO
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p95_ci_ms: tuple[float, float]  # bootstrap 95% interval
    error: str | None = None  # the trial crashed: why


@dataclass(frozen=True)
class Selection:
    winner: int | None  # trial number
    tie: bool  # the winner did not beat the runner-up by more than the noise
    summary: str  # one paragraph a person reads
    reasons: dict[int, str]  # trial -> why it won or lost
    pareto: tuple[int, ...]  # trials on the p95-TTFT-vs-cost frontier
    best_achievable: int | None  # when nothing met the SLO: the closest trial
    # "gain" / "no_significant_gain" (decided by confirmation with intervals), "pending" (still
    # confirming) or "unconfirmed" (the search's single measurements only)
    outcome: str = "unconfirmed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "tie": self.tie,
            "summary": self.summary,
            "reasons": {str(k): v for k, v in self.reasons.items()},
            "pareto": list(self.pareto),
            "best_achievable": self.best_achievable,
            "outcome": self.outcome,
        }


def _has_cost(c: Candidate) -> bool:
    """Whether the candidate carries a cost to rank on. A cost of 0 only comes from hardware
    with no price (0 per hour): it is no figure to rank on, not a free configuration."""
    return c.cost_per_mtok_usd is not None and c.cost_per_mtok_usd > 0


def pareto_front(candidates: Sequence[Candidate]) -> tuple[int, ...]:
    """Trials no other trial beats on both p95 TTFT and cost, among those that passed the gates
    and measured both (a candidate a gate rejected is not an option, however fast). Empty when
    the hardware is not priced: there is no cost axis."""
    points = [
        c
        for c in candidates
        if c.error is None and c.gates_passed and _has_cost(c) and not math.isnan(c.ttft_p95_ms)
    ]
    front = []
    for c in points:
        dominated = any(
            o.ttft_p95_ms <= c.ttft_p95_ms
            and o.cost_per_mtok_usd <= c.cost_per_mtok_usd  # type: ignore[operator]
            and (o.ttft_p95_ms < c.ttft_p95_ms or o.cost_per_mtok_usd < c.cost_per_mtok_usd)  # type: ignore[operator]
            for o in points
        )
        if not dominated:
            front.append(c.trial)
    return tuple(sorted(front))


def _cost(c: Candidate) -> float:
    return math.inf if c.cost_per_mtok_usd is None else c.cost_per_mtok_usd


def _within(cost: float, base_cost: float, fraction: float) -> bool:
    """Whether `cost` is within `fraction` of `base_cost` (the cheapest). Multiplied, never
    divided, though only positive costs reach it (unpriced hardware is ranked by latency)."""
    return cost - base_cost <= fraction * base_cost


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def select(
    candidates: Sequence[Candidate], *, priced: bool = True, cost_tie_fraction: float = 0.05
) -> Selection:
    """Lowest cost per million tokens among candidates meeting the SLO and passing the gates.

    Costs within `cost_tie_fraction` of each other are a tie on cost; then the lower p95 TTFT wins
    if its bootstrap interval clears the other's, and otherwise the simpler configuration wins.
    When the hardware is not priced (`priced` False, or no candidate has a positive cost: a
    price of 0 gives every candidate a cost of 0), candidates are ranked by p95 TTFT alone.
    """
    reasons: dict[int, str] = {}
    passed = []
    for c in candidates:
        if c.error is not None:
            reasons[c.trial] = f"trial failed: {c.error}"
        elif not c.gates_passed:
            reasons[c.trial] = "rejected by a gate: " + "; ".join(c.gate_reasons)
        elif not c.slo_met:
            reasons[c.trial] = "missed the SLO: " + "; ".join(c.slo_violations)
        else:
            passed.append(c)
    priced = priced and any(_has_cost(c) for c in passed)
    eligible = []
    for c in passed:
        if _has_cost(c) if priced else not math.isnan(c.ttft_p95_ms):
            eligible.append(c)
        else:
            reasons[c.trial] = "no cost measured" if priced else "no p95 TTFT measured"
    pareto = pareto_front(candidates) if priced else ()
    if not eligible:
        measured = [c for c in candidates if c.error is None and not math.isnan(c.ttft_p95_ms)]
        best = min(measured, key=lambda c: (not c.gates_passed, c.ttft_p95_ms)) if measured else None
        summary = "No configuration met the SLO and passed the gates."
        if best is not None:
            summary += (
                f" The closest was trial {best.trial} ({best.label}): p50 TTFT {best.ttft_p50_ms:,.0f} ms, "
                f"p95 {best.ttft_p95_ms:,.0f} ms ({'; '.join(best.slo_violations) or 'gates: ' + '; '.join(best.gate_reasons)})."
            )
        return Selection(None, False, summary, reasons, pareto, best.trial if best else None)

    if not priced:
        return _select_by_latency(eligible, reasons)
    eligible.sort(key=lambda c: (_cost(c), c.num_changed_knobs, c.trial))
    winner = eligible[0]
    tie = False
    why = f"lowest cost per million tokens (${winner.cost_per_mtok_usd:.4f}) among the {len(eligible)} that met the SLO and passed the gates"
    if len(eligible) > 1:
        runner = eligible[1]
        base_cost = _cost(winner)
        if _within(_cost(runner), base_cost, cost_tie_fraction):
            tied = [c for c in eligible if _within(_cost(c), base_cost, cost_tie_fraction)]
            fastest = min(tied, key=lambda c: c.ttft_p95_ms)
            others = [c for c in tied if c is not fastest]
            if all(
                not _overlap(fastest.ttft_p95_ci_ms, o.ttft_p95_ci_ms)
                and fastest.ttft_p95_ci_ms[1] < o.ttft_p95_ci_ms[0]
                for o in others
            ):
                winner = fastest
                why = f"tied on cost with {len(others)} other(s) and the clearly lowest p95 TTFT ({fastest.ttft_p95_ms:,.0f} ms, interval clear of the rest)"
            else:
                tie = True
                winner = min(tied, key=lambda c: (c.num_changed_knobs, c.cost_per_mtok_usd, c.trial))
                why = (
                    f"a tie within the noise with {len(tied) - 1} other(s) (cost within {cost_tie_fraction:.0%}, "
                    f"p95 TTFT intervals overlapping): the simplest configuration ({winner.num_changed_knobs} changed knobs) wins"
                )
    reasons[winner.trial] = "winner: " + why
    for c in eligible:
        if c.trial != winner.trial:
            reasons[c.trial] = (
                f"met the SLO but cost ${c.cost_per_mtok_usd:.4f}/Mtok vs ${winner.cost_per_mtok_usd:.4f}"
                + (" (tie; the winner is simpler)" if tie else "")
            )
    summary = (
        f"Trial {winner.trial} ({winner.label}) wins: {why}. It serves p50 TTFT {winner.ttft_p50_ms:,.0f} ms, "
        f"p95 {winner.ttft_p95_ms:,.0f} ms at the target load."
    )
    return Selection(winner.trial, tie, summary, reasons, pareto, None)


def _select_by_latency(eligible: Sequence[Candidate], reasons: dict[int, str]) -> Selection:
    """The winner on hardware with no price: the lowest p95 TTFT, unless its bootstrap interval
    overlaps others' (a tie within the noise), when the simplest of those wins."""
    ranked = sorted(eligible, key=lambda c: (c.ttft_p95_ms, c.num_changed_knobs, c.trial))
    fastest = ranked[0]
    tied = [c for c in ranked if c is fastest or _overlap(fastest.ttft_p95_ci_ms, c.ttft_p95_ci_ms)]
    tie = len(tied) > 1
    if tie:
        winner = min(tied, key=lambda c: (c.num_changed_knobs, c.ttft_p95_ms, c.trial))
        why = (
            f"not priced, so ranked by latency: a tie within the noise with {len(tied) - 1} other(s) "
            f"(p95 TTFT intervals overlapping): the simplest configuration ({winner.num_changed_knobs} changed knobs) wins"
        )
    else:
        winner = fastest
        why = (
            f"not priced, so ranked by latency: the lowest p95 TTFT ({winner.ttft_p95_ms:,.0f} ms) among the "
            f"{len(eligible)} that met the SLO and passed the gates"
        )
    reasons[winner.trial] = "winner: " + why
    for c in eligible:
        if c.trial != winner.trial:
            reasons[c.trial] = (
                f"met the SLO but p95 TTFT {c.ttft_p95_ms:,.0f} ms vs {winner.ttft_p95_ms:,.0f} ms (not priced)"
                + (" (tie; the winner is simpler)" if tie and c in tied else "")
            )
    summary = (
        f"Trial {winner.trial} ({winner.label}) wins: {why}. It serves p50 TTFT {winner.ttft_p50_ms:,.0f} ms, "
        f"p95 {winner.ttft_p95_ms:,.0f} ms at the target load."
    )
    return Selection(winner.trial, tie, summary, reasons, (), None)
