"""An engine killed mid-trial (kill -9 of the vLLM server while the trial replays its load): the
trial is recorded as failed and says so, the host's measuring lock is free again, and the job
goes on with its next trial on a fresh engine. Two engine starts: the killed one and the next.

This is the code an agent runs for each trial of a pool (portal/pools/trials.py calls the same
`execute`), here in the test's own process so the kill can be aimed at the measuring phase."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from serving.engine.launcher import EngineProcess
from serving.models.tiny import build_tiny_model
from tuning.search import gates, trial
from tuning.search.job import REFERENCE, SEARCH, JobSpec, TrialRecord, plan_job, run_trials

pytestmark = [pytest.mark.engine]


def test_an_engine_killed_while_measuring_fails_its_trial_frees_the_host_and_the_job_goes_on(
    shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=model, seed=0)
    lock = tmp_path / "host.lock"
    monkeypatch.setenv("TAILGUARD_HOST_LOCK", str(lock))
    spec = JobSpec(
        trace_path=str(shared_traces / "mooncake_synthetic.jsonl"),
        model_path=str(model),
        slo="ttft_p50_ms<=60000,ttft_p95_ms<=60000",
        peak_rps=1.0,
        budget_trials=2,
        strategy="grid",
        duration_s=5,
        repeats=1,
        capacity_steps=(),
        confirm_repeats=0,
        max_prompt_tokens=128,
        max_output_tokens=8,
        max_model_len=512,
    )
    prepared = plan_job(spec, tmp_path / "work")
    # The reference is recorded already and the gate passes whatever it compares: this test is
    # about the engine dying, not about correctness (and it saves an engine start).
    captured = {"status": "ok", "capture": {"prompt_logprobs": [], "greedy": []}, "phase": REFERENCE}
    history = [TrialRecord(0, dict(prepared.reference), captured)]
    monkeypatch.setattr(
        trial.gates,
        "compare",
        lambda reference, answers, *, change_type, thresholds: gates.CorrectnessVerdict(
            passed=True,
            change_type=change_type,
            top1_agreement=1.0,
            mean_kl=0.0,
            greedy_exact=True,
            positions=0,
            reasons=(),
        ),
    )
    engines: list[EngineProcess] = []
    real_start, real_replay = trial.start_engine, trial._replay

    def start_engine(**kwargs: Any) -> EngineProcess:
        engines.append(real_start(**kwargs))
        return engines[-1]

    def replay(plan: Any, url: str, multiple: float, repeat: int) -> Any:
        if len(engines) != 1:
            return real_replay(plan, url, multiple, repeat)
        # The first trial: kill -9 its engine a moment into the load (the trial is measuring).
        killer = threading.Timer(1.0, os.kill, (engines[0].engine_pid, signal.SIGKILL))
        killer.start()
        try:
            return real_replay(plan, url, multiple, repeat)
        finally:
            killer.join()

    monkeypatch.setattr(trial, "start_engine", start_engine)
    monkeypatch.setattr(trial, "_replay", replay)
    lock_free_after: dict[int, bool] = {}

    def on_trial(records: list[TrialRecord]) -> None:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock_free_after[records[-1].number] = True
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            lock_free_after[records[-1].number] = False
        finally:
            os.close(fd)

    try:
        run_trials(prepared, history, tmp_path / "work", on_trial=on_trial)
    finally:
        for engine in engines:
            engine.stop()
    assert [r.number for r in history] == [0, 1, 2] and [r.phase for r in history[1:]] == [SEARCH, SEARCH]
    killed, following = history[1].result, history[2].result
    assert killed["status"] == "failed"
    assert "died while the trial measured: killed by signal 9 (SIGKILL)" in killed["error"], killed["error"]
    assert f"pid {engines[0].engine_pid}" in killed["error"]
    # The host was free as soon as the failed trial was recorded, and the job went on: the next
    # trial started its own engine and measured.
    assert lock_free_after == {1: True, 2: True}
    assert len(engines) == 2 and following["status"] == "ok", following.get("error")
    assert following["load"] and following["correctness"]["passed"]
    # Nothing of either engine is left running.
    assert all(not e.alive() and not e.leftover_pids() for e in engines)
