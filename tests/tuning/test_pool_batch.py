"""Batches of search trials for a pool of several hosts, without an engine: the strategies'
batch proposals, the job's batch planning, and the run loop recording a batch in trial order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuning.search.job import (
    CONFIRM,
    REFERENCE,
    SEARCH,
    JobSpec,
    PlannedTrial,
    Prepared,
    TrialRecord,
    next_trial,
    next_trials,
    plan_job,
    run_trials,
)
from tuning.search.space import LOCAL_CPU, build_space, model_info
from tuning.search.strategies import GridStrategy, Observation, TPEStrategy, propose_batch

CAPTURED = {"status": "ok", "capture": {"prompt_logprobs": [], "greedy": []}, "phase": REFERENCE}


def _key(space: Any, point: dict[str, Any]) -> str:
    return json.dumps({**space.baseline(), **point}, sort_keys=True)


def test_tpe_batches_are_distinct_pending_aware_and_deterministic(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    strategy = TPEStrategy(seed=3, priors=({"dtype": "float32"},), n_startup_trials=2)
    history: list[Observation] = []
    # The first batch starts with the prior; its first point is the one-at-a-time proposal.
    first = strategy.propose_batch(space, history, 3)
    assert first[0] == {"dtype": "float32"} == strategy.propose(space, history)
    assert len({_key(space, p) for p in first}) == 3
    for point in first:
        history.append(Observation(point, 1.0 + (point.get("max_num_seqs") or 256) / 100))
    # Past the start-up points TPE models; with the others pending, each ask moves elsewhere.
    for _ in range(3):
        batch = strategy.propose_batch(space, history, 4)
        assert len(batch) == 4 and all(not space.violations(p) for p in batch)
        keys = {_key(space, p) for p in batch}
        assert len(keys) == 4 and not keys & {_key(space, o.assignment) for o in history}
        # The same history gives the same batch (no dependence on timing or call order).
        assert strategy.propose_batch(space, history, 4) == batch
        history += [Observation(p, 2.0) for p in batch]
    # The generic helper uses the strategy's own batch mode.
    assert propose_batch(strategy, space, history, 2) == strategy.propose_batch(space, history, 2)


def test_grid_batches_walk_the_grid_once(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    grid = GridStrategy()
    history: list[Observation] = []
    while batch := grid.propose_batch(space, history, 3):
        assert len(batch) <= 3
        history += [Observation(p, 1.0) for p in batch]
    seen = [(o.assignment["max_num_seqs"], o.assignment["max_num_batched_tokens"]) for o in history]
    assert len(seen) == len(set(seen)) == len(grid.points(space))


class _OneAtATime:
    """A strategy with no batch mode of its own."""

    name = "one"

    def propose(self, space: Any, history: Sequence[Observation]) -> dict[str, Any] | None:
        return {"max_num_seqs": 8} if not history else None


def test_a_strategy_without_a_batch_mode_proposes_one(model_dir: Path) -> None:
    space = build_space(model=model_info(model_dir), hardware=LOCAL_CPU, max_model_len=2048)
    assert propose_batch(_OneAtATime(), space, [], 4) == [{"max_num_seqs": 8}]


def _prepared(model_dir: Path, shared_traces: Path, tmp_path: Path, **changes: Any) -> Prepared:
    spec = JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model_dir),
        slo="ttft_p95_ms<=1000",
        peak_rps=1.0,
        budget_trials=5,
        duration_s=10,
        **changes,
    )
    return plan_job(spec, tmp_path / "work")


def test_only_the_search_is_planned_in_batches(model_dir: Path, shared_traces: Path, tmp_path: Path) -> None:
    prepared = _prepared(model_dir, shared_traces, tmp_path, confirm_repeats=3, finalists=1)
    # The reference comes alone, whatever the hosts.
    assert [p.phase for p in next_trials(prepared, [], slots=4)] == [REFERENCE]
    history = [TrialRecord(0, dict(prepared.reference), CAPTURED)]
    # One host: exactly the one-at-a-time plan.
    assert next_trials(prepared, history, slots=1) == [next_trial(prepared, history)]
    batch = next_trials(prepared, history, slots=4)
    assert [p.phase for p in batch] == [SEARCH] * 4
    assert batch[0] == next_trial(prepared, history)  # the competent baseline first, as always
    assert len({_key(prepared.space, p.assignment) for p in batch}) == 4
    # Never past the budget: 5 search trials, 4 measured, so a batch of one is left.
    measured = {
        "status": "ok",
        "slo_met": True,
        "cost_per_mtok_usd": 1.0,
        "ttft_p50_ms": 100.0,
        "ttft_p95_ms": 200.0,
        "correctness": {"passed": True},
        "reliability": {"passed": True},
        "phase": SEARCH,
    }
    history += [TrialRecord(1 + i, p.assignment, measured) for i, p in enumerate(batch)]
    assert len(next_trials(prepared, history, slots=4)) == 1
    history.append(TrialRecord(5, next_trials(prepared, history, slots=4)[0].assignment, measured))
    # Confirmation rounds are compared with each other: one at a time, on one host at a time.
    following = next_trials(prepared, history, slots=4)
    assert [p.phase for p in following] == [CONFIRM]


class _Pool:
    """Two hosts that finish a batch's trials in reverse order (the later trial first)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.finished: list[int] = []

    def capacity(self) -> int:
        return 2

    def run_batch(
        self,
        prepared: Prepared,
        history: Sequence[TrialRecord],
        batch: Sequence[tuple[int, PlannedTrial]],
        work_dir: Path,
    ) -> list[dict[str, Any]]:
        self.batches.append([n for n, _ in batch])
        results = {}
        for number, planned in reversed(batch):
            self.finished.append(number)
            if planned.phase == REFERENCE:
                results[number] = dict(CAPTURED)
            else:
                results[number] = {"status": "failed", "error": f"made up {number}", **planned.stamp()}
        return [results[n] for n, _ in batch]


def test_a_batch_is_recorded_in_trial_order_whichever_finished_first(
    model_dir: Path, shared_traces: Path, tmp_path: Path
) -> None:
    prepared = _prepared(model_dir, shared_traces, tmp_path, confirm_repeats=0)
    pool = _Pool()
    saved: list[list[int]] = []
    history = run_trials(
        prepared,
        [],
        tmp_path / "work",
        executor=pool,
        on_trial=lambda records: saved.append([r.number for r in records]),
    )
    # The reference alone, then the 5 search trials two at a time (the budget caps the last).
    assert pool.batches == [[0], [1, 2], [3, 4], [5]]
    assert pool.finished[1:3] == [2, 1]
    assert [r.number for r in history] == [0, 1, 2, 3, 4, 5]
    assert [r.phase for r in history] == [REFERENCE] + [SEARCH] * 5
    assert saved[-1] == [0, 1, 2, 3, 4, 5] and saved[1] == [0, 1]
    assert all(r.result["error"] == f"made up {r.number}" for r in history[1:])
