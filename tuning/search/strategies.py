"""Search strategies: which configuration to try next, given what has been measured.

Both strategies are stateless between calls: they rebuild their view from the trial history,
so a job resumed on another worker proposes exactly what it would have proposed.

- `GridStrategy` is the plain grid of vLLM's `benchmarks/auto_tune` script: every
  `max_num_seqs` x `max_num_batched_tokens` pair, other knobs left alone.
- `TPEStrategy` is Optuna's tree-structured Parzen estimator over the whole space, seeded with
  prior candidates (the reference, the engine defaults, and the simulator's ranking when one is
  given) before it starts modelling.

Where a pool has several idle engine hosts, `propose_batch` gives up to that many distinct
candidates at once, each proposed knowing the ones before it are in flight (Optuna's constant
liar for TPE: a pending trial counts as a bad one, so the next ask moves away from it). The
batch depends only on the history and its size, never on which trial finishes first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tuning.search.space import SearchSpace

# What a failed or SLO-missing trial scores, so the model learns to steer away from it. Above any
# real cost per million tokens.
PENALTY = 1e6


@dataclass(frozen=True)
class Observation:
    assignment: Mapping[str, Any] = field(hash=False)
    # Lower is better (cost per million tokens, or p95 TTFT in ms on hardware that is not
    # priced); PENALTY-scaled when the SLO or a gate failed;
    # None when the trial crashed before measuring.
    objective: float | None


def _key(assignment: Mapping[str, Any], space: SearchSpace) -> tuple[Any, ...]:
    return space.key(assignment)


class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    def propose(self, space: SearchSpace, history: Sequence[Observation]) -> dict[str, Any] | None:
        """The next assignment to try, or None when the strategy has nothing left."""


def propose_batch(
    strategy: Strategy, space: SearchSpace, history: Sequence[Observation], size: int
) -> list[dict[str, Any]]:
    """Up to `size` distinct assignments to measure at once (fewer when the strategy runs out).
    A strategy without its own batch mode proposes one at a time."""
    batch = getattr(strategy, "propose_batch", None)
    if batch is not None:
        proposed: list[dict[str, Any]] = batch(space, history, size)
        return proposed
    one = strategy.propose(space, history)
    return [] if one is None else [one]


@dataclass(frozen=True)
class GridStrategy:
    """auto_tune's grid: max_num_seqs x max_num_batched_tokens, everything else at the baseline."""

    name: str = "grid"
    max_num_seqs: tuple[int, ...] = (8, 16, 32, 64)
    max_num_batched_tokens: tuple[int, ...] = (512, 1024, 2048, 4096)
    fixed: Mapping[str, Any] = field(default_factory=dict, hash=False)  # e.g. the user's dtype flag

    def points(self, space: SearchSpace) -> list[dict[str, Any]]:
        out = []
        for seqs, budget in itertools.product(self.max_num_seqs, self.max_num_batched_tokens):
            point = {**self.fixed, "max_num_seqs": seqs, "max_num_batched_tokens": budget}
            if not space.violations(point):
                out.append(point)
        return out

    def propose(self, space: SearchSpace, history: Sequence[Observation]) -> dict[str, Any] | None:
        batch = self.propose_batch(space, history, 1)
        return batch[0] if batch else None

    def propose_batch(
        self, space: SearchSpace, history: Sequence[Observation], size: int
    ) -> list[dict[str, Any]]:
        tried = {_key(o.assignment, space) for o in history}
        return [p for p in self.points(space) if _key(p, space) not in tried][: max(0, size)]


@dataclass(frozen=True)
class TPEStrategy:
    name: str = "tpe"
    seed: int = 0
    priors: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)  # tried first, in order
    n_startup_trials: int = 3  # random points before TPE models (after the priors)

    def propose(self, space: SearchSpace, history: Sequence[Observation]) -> dict[str, Any] | None:
        return self._propose(space, history, ())

    def propose_batch(
        self, space: SearchSpace, history: Sequence[Observation], size: int
    ) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while len(batch) < size:
            candidate = self._propose(space, history, batch)
            if candidate is None:
                break
            batch.append(candidate)
        return batch

    def _propose(
        self, space: SearchSpace, history: Sequence[Observation], pending: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any] | None:
        """The next assignment given the measured `history` and the `pending` ones (proposed in
        this batch, not measured): never one of either."""
        tried = {_key(o.assignment, space) for o in history} | {_key(p, space) for p in pending}
        for prior in self.priors:
            if _key(prior, space) not in tried and not space.violations(prior):
                return dict(prior)
        if len(tried) >= space.size:
            return None
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        encode, decode = _codec(space)
        distributions: dict[str, optuna.distributions.BaseDistribution] = {
            k.name: optuna.distributions.CategoricalDistribution(list(range(len(k.values))))
            for k in space.knobs
        }
        # The seed moves with the batch position, so the random start-up points of one batch
        # differ; with nothing pending this is exactly the one-at-a-time proposal.
        seed = self.seed + len(history) + len(pending)
        sampler = optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=self.n_startup_trials,
            multivariate=True,
            # The constant liar: pending trials count as bad ones, so the batch spreads out.
            constant_liar=bool(pending),
        )
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for obs in history:
            value = PENALTY * 10 if obs.objective is None or math.isnan(obs.objective) else obs.objective
            study.add_trial(
                optuna.trial.create_trial(
                    params=encode(obs.assignment), distributions=distributions, value=value
                )
            )
        for assignment in pending:
            study.add_trial(
                optuna.trial.create_trial(
                    params=encode(assignment),
                    distributions=distributions,
                    state=optuna.trial.TrialState.RUNNING,
                )
            )
        for _ in range(64):
            trial = study.ask(distributions)
            candidate = decode(trial.params)
            if _key(candidate, space) in tried or space.violations(candidate):
                # Tell the model this region is out, so the next ask moves away from it.
                study.tell(trial, PENALTY * 10)
                continue
            return candidate
        # The sampler keeps returning tried or invalid points: enumerate what is left, seeded.
        rng = np.random.default_rng(seed)
        remaining = [p for p in _all_points(space) if _key(p, space) not in tried and not space.violations(p)]
        return remaining[int(rng.integers(len(remaining)))] if remaining else None


def _codec(space: SearchSpace):  # type: ignore[no-untyped-def]
    def encode(assignment: Mapping[str, Any]) -> dict[str, int]:
        full = {**space.baseline(), **assignment}
        return {k.name: k.values.index(full[k.name]) for k in space.knobs}

    def decode(params: Mapping[str, int]) -> dict[str, Any]:
        return {k.name: k.values[params[k.name]] for k in space.knobs}

    return encode, decode


def _all_points(space: SearchSpace) -> list[dict[str, Any]]:
    names = [k.name for k in space.knobs]
    return [
        dict(zip(names, combo, strict=True)) for combo in itertools.product(*(k.values for k in space.knobs))
    ]
