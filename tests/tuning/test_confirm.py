"""Numbers a customer can sign: the reference, the phases, confirmation with intervals, the
"no significant gain" outcome, contended trials, caps, host facts and the host lock.

No engine here: trial results are built in the exact shape `run_trial` stores (its own
dataclasses), with TTFT samples drawn from known distributions, so each decision is checked
against a known truth. The live path is measured by `benchmarks/tuning_gain.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.host import (
    ForeignLoadMeter,
    HostBusyError,
    cpu_facts,
    fastest_dtype,
    hold_host,
)
from tuning.search import confirm
from tuning.search.job import (
    ABLATION,
    CONFIRM,
    REFERENCE,
    SEARCH,
    JobSpec,
    JobSpecError,
    Prepared,
    ReferenceFailedError,
    TrialRecord,
    caps_for,
    next_trial,
    plan_job,
    report,
    summarize_job,
    validate,
)
from tuning.search.space import LOCAL_CPU, HardwareTarget
from tuning.search.trial import LoadPoint, TrialResult


@pytest.fixture
def host_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This host's facts file, saying float32 is its fastest dtype (so the competent baseline
    and the naive defaults differ, as on an AVX2 host)."""
    path = tmp_path / "host-facts.json"
    facts = cpu_facts()
    key = f"{facts['cpu_model']}|{facts['num_cpus']}|{','.join(facts['isa'])}"
    path.write_text(json.dumps({key: {**facts, "dtype": "float32", "why": "probe said so (test)"}}))
    monkeypatch.setenv("TAILGUARD_HOST_FACTS", str(path))
    return path


@pytest.fixture
def prepared(model_dir: Path, shared_traces: Path, tmp_path: Path, host_facts: Path) -> Prepared:
    spec = JobSpec(
        trace_path=str(shared_traces / "azure2023_conv.csv"),
        model_path=str(model_dir),
        slo="ttft_p50_ms<=1000,ttft_p95_ms<=4000",
        peak_rps=1.0,
        budget_trials=3,
        duration_s=10,
        confirm_repeats=3,
        finalists=1,
    )
    return plan_job(spec, tmp_path / "work")


def _result(
    rng: np.random.Generator,
    *,
    ttft_ms: float,
    n: int = 200,
    sustains: float = 2.0,
    gates_ok: bool = True,
    foreign_cores: float = 0.02,
    contended: bool = False,
    status: str = "ok",
) -> dict[str, Any]:
    """A measured trial in the shape run_trial stores, TTFTs lognormal around `ttft_ms`."""
    ttfts = np.sort(ttft_ms * rng.lognormal(0.0, 0.25, size=n))
    point = LoadPoint(
        1.0, 0, n, 0, float(np.median(ttfts)), float(np.percentile(ttfts, 95)), 20.0, 900.0, True, (), 3.0
    )
    result = TrialResult(
        config={},
        status=status,
        error=None if status == "ok" else "engine did not start: boom",
        load=(point,),
        ttft_p50_ms=float(np.median(ttfts)),
        ttft_p95_ms=float(np.percentile(ttfts, 95)),
        ttft_p95_ci_ms=(float(np.percentile(ttfts, 93)), float(np.percentile(ttfts, 97))),
        tpot_p50_ms=20.0,
        slo_met=True,
        slo_violations=(),
        sustainable_multiple=sustains,
        cost_per_mtok_usd=0.01 / sustains,
        correctness={"passed": gates_ok, "reasons": [] if gates_ok else ["top-1 agreement 0.61 < 0.9"]},
        reliability={"passed": True, "reasons": []},
        capture=None,
        ttft_sample_ms=tuple(float(v) for v in ttfts),
        foreign_load={"foreign_cores": foreign_cores},
        contended=contended,
    )
    return result.to_dict()


def _captured() -> dict[str, Any]:
    return {"status": "ok", "capture": {"prompt_logprobs": [[{"5": -0.1}]], "greedy": [[5]]}}


def _run(
    prepared: Prepared,
    history: list[TrialRecord],
    ttft_of: Any,
    rng: np.random.Generator,
    *,
    limit: int = 60,
    **extra: Any,
) -> list[TrialRecord]:
    """Drive the job to its end, answering each planned trial with `ttft_of(planned)`."""
    for _ in range(limit):
        planned = next_trial(prepared, history)
        if planned is None:
            return history
        if planned.phase == REFERENCE:
            result = _captured()
        else:
            result = _result(rng, ttft_ms=ttft_of(planned), **extra)
        history.append(TrialRecord(len(history), planned.assignment, {**result, **planned.stamp()}))
    raise AssertionError("the job did not end")


def test_the_reference_is_captured_first_retried_once_then_the_job_stops(prepared: Prepared) -> None:
    first = next_trial(prepared, [])
    assert first is not None and first.phase == REFERENCE and not first.measure
    assert first.assignment["dtype"] == "float32"
    failed = {"status": "failed", "error": "engine did not start: out of memory", "phase": REFERENCE}
    history = [TrialRecord(0, first.assignment, failed)]
    retry = next_trial(prepared, history)
    assert retry is not None and retry.phase == REFERENCE  # a fresh engine, once
    history.append(TrialRecord(1, retry.assignment, failed))
    with pytest.raises(ReferenceFailedError, match=r"did not start in 2 attempts.*out of memory"):
        next_trial(prepared, history)
    # Never judged against itself: nothing after a failed reference is a candidate.
    assert summarize_job(prepared, history).winner is None


def test_search_starts_from_the_competent_baseline_and_excludes_the_reference(prepared: Prepared) -> None:
    assert prepared.competent["dtype"] == "float32" and prepared.defaults["dtype"] is None
    history = [TrialRecord(0, prepared.reference, {**_captured(), "phase": REFERENCE})]
    planned = next_trial(prepared, history)
    assert planned is not None and planned.phase == SEARCH
    assert planned.assignment == prepared.competent
    rep = report(prepared, history)
    assert rep["baselines"]["competent"] == prepared.competent
    assert rep["trials"][0]["phase"] == REFERENCE


def test_a_clear_gain_is_confirmed_with_intervals_and_attributed(prepared: Prepared) -> None:
    rng = np.random.default_rng(1)

    def ttft(planned: Any) -> float:
        if planned.phase == SEARCH:
            return 450.0  # what the search finds on its own is slower than the planted point
        # The truth: max_num_seqs=8 halves TTFT; prefix caching (on either way) changes nothing.
        return 400.0 * (0.5 if planned.assignment.get("max_num_seqs") == 8 else 1.0)

    history = [TrialRecord(0, prepared.reference, {**_captured(), "phase": REFERENCE})]
    competent = next_trial(prepared, history)
    assert competent is not None and competent.assignment == prepared.competent
    history.append(TrialRecord(1, competent.assignment, {**_result(rng, ttft_ms=400.0), "phase": SEARCH}))
    # Which point the search tries second is TPE's and the simulator's business: plant a good one.
    good = {**prepared.competent, "max_num_seqs": 8, "enable_prefix_caching": True}
    history.append(TrialRecord(2, good, {**_result(rng, ttft_ms=200.0), "phase": SEARCH}))
    history = _run(prepared, history, ttft, rng)

    phases = [r.phase for r in history]
    assert phases.count(SEARCH) == prepared.spec.budget_trials
    confirms = [r for r in history if r.phase == CONFIRM]
    # competent, naive and one finalist, three interleaved rounds: ABC BCA CAB.
    assert [r.subject for r in confirms] == [
        "competent", "naive", "finalist-1",
        "naive", "finalist-1", "competent",
        "finalist-1", "competent", "naive",
    ]  # fmt: skip
    rep = report(prepared, history)
    conf = rep["confirmation"]
    assert conf["complete"] and conf["outcome"] == "gain" and conf["winner_subject"] == "finalist-1"
    ratio = conf["subjects"]["finalist-1"]["vs_competent"]["ttft_p50_ms"]
    assert ratio["ci_low"] < ratio["value"] < ratio["ci_high"] < 1.0
    assert 0.4 < ratio["value"] < 0.6
    for figure in ("ttft_p50_ms", "ttft_p95_ms", "sustainable_multiple"):
        est = conf["subjects"]["competent"]["figures"][figure]
        assert est["ci_low"] <= est["value"] <= est["ci_high"]
    selection = rep["selection"]
    assert selection["outcome"] == "gain"
    assert history[selection["winner"]].assignment == good
    # Two knobs changed against the competent baseline: each reverted alone, three rounds each.
    ablation = [r for r in history if r.phase == ABLATION]
    assert sorted({r.subject for r in ablation}) == ["without enable_prefix_caching", "without max_num_seqs"]
    assert len(ablation) == 6
    shares = conf["ablation"]["shares"]
    assert shares["max_num_seqs"]["share_of_gain"] > 0.8
    assert abs(shares["enable_prefix_caching"]["share_of_gain"]) < 0.3
    rows = {k: v["ttft_p50_ratio_vs_competent"] for k, v in shares.items()}
    assert rows["max_num_seqs"]["ci_high"] > 0.9  # without it, no gain left


def test_no_significant_gain_keeps_the_baseline(prepared: Prepared) -> None:
    rng = np.random.default_rng(2)
    history = [TrialRecord(0, prepared.reference, {**_captured(), "phase": REFERENCE})]
    # Every configuration is the same engine speed; the search's single samples differ by noise
    # (one of them looked 8% faster).
    history.append(TrialRecord(1, prepared.competent, {**_result(rng, ttft_ms=400.0), "phase": SEARCH}))
    lucky = {**prepared.competent, "max_num_batched_tokens": 4096}
    history.append(TrialRecord(2, lucky, {**_result(rng, ttft_ms=370.0), "phase": SEARCH}))
    history = _run(prepared, history, lambda planned: 400.0, rng)
    rep = report(prepared, history)
    assert rep["confirmation"]["outcome"] == "no_significant_gain"
    assert rep["selection"]["outcome"] == "no_significant_gain"
    assert rep["selection"]["summary"].startswith("No significant gain: keep the baseline")
    # The baseline is what gets deployed, and nothing was ablated.
    assert history[rep["selection"]["winner"]].assignment == prepared.competent
    assert not [r for r in history if r.phase == ABLATION]


def test_a_contended_trial_is_excluded_and_its_block_measured_again(prepared: Prepared) -> None:
    rng = np.random.default_rng(3)
    history = [TrialRecord(0, prepared.reference, {**_captured(), "phase": REFERENCE})]
    history.append(TrialRecord(1, prepared.competent, {**_result(rng, ttft_ms=400.0), "phase": SEARCH}))
    # The fastest-looking search trial ran while something else loaded the host.
    noisy = {**prepared.competent, "max_num_seqs": 16}
    history.append(
        TrialRecord(
            2, noisy, {**_result(rng, ttft_ms=100.0, foreign_cores=0.9, contended=True), "phase": SEARCH}
        )
    )
    selection = summarize_job(prepared, history)
    assert "contended" in selection.reasons[2]
    planned = next_trial(prepared, history)
    assert planned is not None and planned.phase == SEARCH
    history.append(TrialRecord(3, planned.assignment, {**_result(rng, ttft_ms=300.0), "phase": SEARCH}))
    # The contended trial is never a finalist.
    first_confirm = next_trial(prepared, history)
    assert first_confirm is not None and first_confirm.phase == CONFIRM
    rep_subjects = report(prepared, history)["confirmation"]["subjects"]
    assert rep_subjects["finalist-1"]["assignment"] != noisy
    # A contended confirmation block earns its subject one extra round.
    history.append(
        TrialRecord(
            4,
            first_confirm.assignment,
            {**_result(rng, ttft_ms=400.0, foreign_cores=1.2, contended=True), **first_confirm.stamp()},
        )
    )
    history = _run(prepared, history, lambda planned: 400.0, rng)
    confirms = [r for r in history if r.phase == CONFIRM]
    assert len(confirms) == 3 * 3 + 1
    subject = first_confirm.subject
    summary = report(prepared, history)["confirmation"]["subjects"][subject]
    assert summary["blocks"] == 3 and len(summary["excluded"]) == 1 and "contended" in summary["excluded"][0]


def test_confirmation_off_is_labelled_unconfirmed(prepared: Prepared) -> None:
    from dataclasses import replace

    quick = replace(prepared, spec=replace(prepared.spec, confirm_repeats=0))
    rng = np.random.default_rng(4)
    history = [TrialRecord(0, quick.reference, {**_captured(), "phase": REFERENCE})]
    history = _run(quick, history, lambda planned: 400.0, rng)
    assert [r.phase for r in history].count(CONFIRM) == 0
    selection = summarize_job(quick, history)
    assert selection.outcome == "unconfirmed" and "Unconfirmed" in selection.summary
    assert selection.winner != 0  # the reference is never a candidate


def test_confirmation_bootstrap_is_two_level_and_paired() -> None:
    rng = np.random.default_rng(5)

    def blocks(subject: str, center: float, spread: float) -> list[confirm.Block]:
        out = []
        for r in range(4):
            engine = center * (1 + spread * rng.standard_normal())  # engine-to-engine noise
            ttfts = tuple(float(v) for v in engine * rng.lognormal(0, 0.2, size=150))
            out.append(confirm.Block(subject, r, r, ttfts, 20.0, 2.0, True, True, False))
        return out

    same_a, same_b = blocks("a", 300, 0.15), blocks("b", 300, 0.15)
    r = confirm.ratio(same_a, same_b, np.random.default_rng(0), rounds=1000)["ttft_p50_ms"]
    # Two sets of engines of one configuration, 15% engine-to-engine noise: their observed ratio
    # is off 1 by chance, and the interval must say so (a bootstrap over 4 blocks alone did not).
    assert abs(r.value - 1.0) > 0.1
    assert r.ci_low < 1.0 < r.ci_high
    assert confirm.significant_gain({"ttft_p50_ms": r, "sustainable_multiple": r}) is None


def test_caps_default_from_the_profile_and_every_report_says_what_they_clip(
    prepared: Prepared, model_dir: Path
) -> None:
    caps = caps_for(input_p99=3000.0, output_p99=500.0, model_max_len=16384, hardware=LOCAL_CPU)
    assert (caps.max_prompt_tokens, caps.max_output_tokens) == (1024, 64)  # the CPU's replay limit
    assert caps.max_model_len == 1280  # the caps rounded up to 256
    gpu = HardwareTarget("h200", "us", 1, 100.0, 3.0, device_kind="gpu")
    full = caps_for(input_p99=3000.0, output_p99=500.0, model_max_len=16384, hardware=gpu)
    assert (full.max_prompt_tokens, full.max_output_tokens) == (3000, 500)
    given = caps_for(
        input_p99=3000.0, output_p99=500.0, model_max_len=16384, hardware=LOCAL_CPU, max_prompt_tokens=2000
    )
    assert given.max_prompt_tokens == 2000
    effect = prepared.caps
    assert effect["num_requests"] > 0 and 0 <= effect["affected_share"] <= 1
    assert effect["line"] in report(prepared, [])["caps"]["line"]
    if effect["requests_affected"]:
        assert "capped" in effect["line"] and "%" in effect["line"]
    # A cap the context cannot hold, or a context the model cannot serve, is refused up front.
    for changes, field in [
        ({"max_prompt_tokens": 2000, "max_output_tokens": 64, "max_model_len": 2048}, "max_model_len"),
        ({"max_model_len": 10**6}, "max_model_len"),
        ({"peak_rps": 1e7}, "peak_rps"),
        ({"peak_rps": 400.0, "duration_s": 3600}, "peak_rps"),
        ({"budget_trials": 10**6}, "budget_trials"),
        ({"confirm_repeats": 2}, "confirm_repeats"),
    ]:
        with pytest.raises(JobSpecError) as info:
            validate(JobSpec(**{**prepared.spec.to_dict(), **changes}))
        assert info.value.field == field, info.value


def test_fastest_dtype_is_probed_once_per_host_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAILGUARD_HOST_FACTS", str(tmp_path / "facts.json"))
    calls = []

    def probe() -> dict[str, float]:
        calls.append(1)
        return {"fp32_tflops": 0.2, "bf16_tflops": 0.1}

    first = fastest_dtype(device_kind="cpu", checkpoint_dtype="bfloat16", probe=probe)
    again = fastest_dtype(device_kind="cpu", checkpoint_dtype="bfloat16", probe=probe)
    assert first["dtype"] == again["dtype"] == "float32" and len(calls) == 1
    assert "0.100 vs fp32 0.200" in first["why"] and first["cpu_model"]
    assert fastest_dtype(device_kind="gpu", checkpoint_dtype="bfloat16")["dtype"] == "bfloat16"


def test_one_measurement_per_host_and_the_waiter_says_what_it_waits_for(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with hold_host(holder="job A trial 3", path=lock):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(30)
    seen: list[str] = []
    waiting = hold_host(holder="job B trial 0", path=lock, wait_s=0.3, poll_s=0.05, on_wait=seen.append)
    with pytest.raises(HostBusyError, match="job A trial 3"), waiting:
        pytest.fail("the host was handed over while another measurement held it")
    assert seen and "job A trial 3" in seen[0]
    release.set()
    thread.join(30)
    with hold_host(holder="job B trial 0", path=lock, wait_s=5, poll_s=0.05) as hold:
        assert hold.waited_for == ""


def test_foreign_load_counts_other_processes_not_our_own_children() -> None:
    # Each spinner burns one CPU-second, however busy the machine is (then it takes longer), and
    # the assertions are on CPU-seconds (cores x window), so other load cannot fail them.
    spin = "import time\nwhile time.process_time() < 1.0: pass\n"
    # Our own child (like the engine and the load generator): ours, not foreign.
    meter = ForeignLoadMeter().start()
    subprocess.run([sys.executable, "-c", spin], check=True)
    own = meter.stop()
    assert own.ours_cores * own.window_s > 0.8, own
    # A process that is not our descendant (double-forked away, like a neighbour's job).
    launcher = (
        "import os, subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {spin!r}], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
    )
    meter = ForeignLoadMeter().start()
    out = subprocess.run([sys.executable, "-c", launcher], check=True, capture_output=True, text=True)
    pid = int(out.stdout.strip())
    while _running(pid):
        time.sleep(0.05)
    foreign = meter.stop()
    assert foreign.foreign_cores * foreign.window_s > 0.8, foreign
    assert foreign.foreign_cores > foreign.ours_cores


def test_foreign_load_keeps_an_orphaned_engine_worker_ours_up_to_its_last_sighting(tmp_path: Path) -> None:
    # Like an engine stopped inside a window: its worker (our grandchild, 1 CPU-second spent
    # before the window opened) outlives the server process and is orphaned. Only its in-window
    # work as our descendant is ours; before the fix its whole pre-window lifetime disappeared
    # from "ours" and the window's own work of the tree read as foreign (ours ~0).
    marker = tmp_path / "half"
    worker = (
        "import sys, time\n"
        "while time.process_time() < 1.0: pass\n"
        "open(sys.argv[1], 'w').write('1')\n"
        "while time.process_time() < 1.6: pass\n"
        "open(sys.argv[1] + '.done', 'w').write('1')\n"
        "while time.process_time() < 1.8: pass\n"
    )
    server = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {worker!r}, sys.argv[1]])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", server, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        worker_pid = int(proc.stdout.readline())
        while not marker.exists():
            time.sleep(0.02)
        meter = ForeignLoadMeter(poll_s=0.1).start()
        done = Path(f"{marker}.done")
        while not done.exists():
            time.sleep(0.02)
        time.sleep(0.2)  # one more reading of the worker as ours
    finally:
        proc.kill()  # the server dies first: the worker is orphaned and finishes away from us
        proc.wait()
    while _running(worker_pid):
        time.sleep(0.02)
    sample = meter.stop()
    ours_cpu_s = sample.ours_cores * sample.window_s
    # ~0.6 CPU-s of the worker in the window as ours; its first second is not in the window.
    assert 0.3 < ours_cpu_s < 1.0, sample
    with pytest.raises(ValueError, match="poll_s"):
        ForeignLoadMeter(poll_s=0)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_gpu_meter_names_foreign_gpu_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here, so `nvidia-smi` is a stand-in script printing its CSV for the two queries the
    meter makes; the processes it lists are real: one our child, one double-forked away."""
    from serving.engine.host import GpuMeter

    assert GpuMeter().start().stop() is None or shutil.which("nvidia-smi")  # no GPU: nothing recorded
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", launcher], check=True, capture_output=True, text=True)
    neighbour = int(out.stdout.strip())
    try:
        smi = tmp_path / "nvidia-smi"
        smi.write_text(
            "#!/bin/sh\n"
            'case "$1" in\n'
            "  --query-gpu=count) echo 1 ;;\n"
            '  --query-gpu=utilization.gpu,memory.used) echo "87, 120000" ;;\n'
            f"  --query-compute-apps=pid) echo {child.pid}; echo {neighbour}; echo 999999999 ;;\n"
            "esac\n"
        )
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        meter = GpuMeter(poll_s=0.05).start()
        sample = meter.stop()
        assert sample is not None and sample.samples >= 1
        assert sample.util_mean_pct == 87.0 and sample.memory_used_max_mib == 120000.0
        assert sample.foreign_pids == (neighbour,) and sample.contended
        assert sample.unattributed_pids == (999999999,)  # another container's: recorded, not counted
    finally:
        child.kill()
        os.kill(neighbour, 9)


def test_a_faster_p50_with_a_significantly_worse_tail_is_not_a_gain() -> None:
    # The H200 run (benchmarks/results/gpu_tuning_azure_conv.json) had this shape: the finalist's
    # p50 TTFT within noise of vLLM's defaults and its p95 significantly worse. A p50 that is
    # clearly better must not carry a tail that is clearly worse either.
    faster = confirm.Estimate(0.80, 0.70, 0.90)
    same = confirm.Estimate(1.0, 1.0, 1.0)
    worse_tail = confirm.Estimate(2.3, 1.7, 3.2)
    ratios = {
        "ttft_p50_ms": faster,
        "ttft_p95_ms": worse_tail,
        "tpot_p50_ms": same,
        "sustainable_multiple": same,
    }
    assert confirm.significant_gain(ratios) is None
    assert confirm.significant_regressions(ratios) == ["p95 TTFT 2.30x the baseline (95% interval 1.70-3.20)"]
    assert confirm.significant_gain({**ratios, "ttft_p95_ms": confirm.Estimate(1.1, 0.9, 1.3)}) is not None

    result = confirm.SubjectResult(
        subject="finalist-1",
        assignment={"max_num_seqs": 256},
        blocks=3,
        excluded=(),
        figures={},
        vs_competent=ratios,
        vs_naive=None,
        slo_met_blocks=3,
        gates_passed_blocks=3,
        trials=(1, 2, 3),
    )
    verdict = confirm.decide({"finalist-1": result}, ["finalist-1"])
    assert verdict.outcome == "no_significant_gain" and verdict.winner == confirm.COMPETENT
    assert "significantly worse: p95 TTFT 2.30x" in verdict.line
