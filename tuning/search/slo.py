"""Service-level objectives as people write them: "ttft_p50_ms<=600,ttft_p95_ms<=1500"."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from serving.loadgen.results import SLO, LatencyStats, ReplaySummary

_TERM = re.compile(r"^(ttft|tpot|e2e)_p(50|90|95|99)_ms\s*<=\s*([0-9]+(?:\.[0-9]+)?)$")


class SLOParseError(ValueError):
    """An SLO string that cannot be read; the message names the term and the problem."""


@dataclass(frozen=True)
class Objective:
    metric: str  # "ttft" | "tpot" | "e2e"
    percentile: int  # 50, 90, 95 or 99
    limit_ms: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile}_ms"

    def value(self, summary: ReplaySummary) -> float:
        stats: LatencyStats = getattr(summary, f"{self.metric}_ms")
        return float(getattr(stats, f"p{self.percentile}"))


@dataclass(frozen=True)
class SLOTarget:
    objectives: tuple[Objective, ...]

    def __str__(self) -> str:
        return ",".join(f"{o.name}<={o.limit_ms:g}" for o in self.objectives)

    def limit(self, name: str) -> float | None:
        return next((o.limit_ms for o in self.objectives if o.name == name), None)

    def violations(self, summary: ReplaySummary) -> list[str]:
        """Plain-language reasons the summary misses the SLO (empty when it meets it)."""
        out = []
        for objective in self.objectives:
            value = objective.value(summary)
            if math.isnan(value):
                out.append(f"{objective.name} was not measured")
            elif value > objective.limit_ms:
                out.append(f"{objective.name} {value:,.0f} > {objective.limit_ms:,.0f}")
        return out

    def met_by(self, summary: ReplaySummary) -> bool:
        return not self.violations(summary)

    def per_request(self) -> SLO:
        """The per-request SLO the load generator counts goodput with: the loosest limit of each
        metric (a request "meets" the SLO when it is inside the tail the SLO tolerates)."""
        loosest: dict[str, float] = {}
        for o in self.objectives:
            loosest[o.metric] = max(loosest.get(o.metric, 0.0), o.limit_ms)
        return SLO(ttft_ms=loosest.get("ttft"), tpot_ms=loosest.get("tpot"), e2e_ms=loosest.get("e2e"))


def parse_slo(text: str) -> SLOTarget:
    terms = [t.strip() for t in (text or "").split(",")]
    if not any(terms):
        raise SLOParseError("the SLO is empty; write e.g. ttft_p50_ms<=600,ttft_p95_ms<=1500")
    objectives: list[Objective] = []
    for number, term in enumerate(terms, start=1):
        match = _TERM.match(term)
        if match is None:
            raise SLOParseError(
                f"term {number} ({term!r}) is not <metric>_p<50|90|95|99>_ms<=<number> "
                "with metric ttft, tpot or e2e"
            )
        limit = float(match[3])
        if not 0 < limit < 3_600_000:
            raise SLOParseError(f"term {number} ({term!r}): the limit must be between 0 and 3,600,000 ms")
        objective = Objective(metric=match[1], percentile=int(match[2]), limit_ms=limit)
        if any(o.name == objective.name for o in objectives):
            raise SLOParseError(f"term {number} ({term!r}) repeats {objective.name}")
        objectives.append(objective)
    return SLOTarget(objectives=tuple(objectives))
