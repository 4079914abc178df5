"""Real vLLM engine tests (slow; one engine for the whole session, see conftest.py).

Order matters: the start-up failure tests come first so that they never overlap the session's
serving engine, and the shutdown test comes last.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from serving.engine import (
    EngineConfig,
    EngineLaunchError,
    EngineProcess,
    InvalidEngineConfig,
    process_group_members,
    spawn_engine,
    start_engine,
)
from serving.loadgen import (
    SLO,
    PromptSynthesizer,
    PromptTokenizer,
    ReplayResult,
    ReplaySettings,
    RequestResult,
    Target,
    read_trace,
    replay,
)
from serving.loadgen.api import replay_trace
from serving.metrics import scrape, snapshot_delta
from tests.serving.helpers import engine_config

pytestmark = pytest.mark.engine


def test_invalid_config_is_refused_before_launch(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    config = EngineConfig.cpu_default(extra_args=("--max-num-seqz", "4"))
    with pytest.raises(InvalidEngineConfig) as excinfo:
        spawn_engine(model=str(tiny_model_dir), config=config, log_path=log)
    assert excinfo.value.flag == "--max-num-seqz"
    assert "--max-num-seqz" in str(excinfo.value)
    assert not log.exists(), "nothing may be launched for a refused config"

    with pytest.raises(InvalidEngineConfig) as excinfo:
        spawn_engine(model=str(tiny_model_dir), config=EngineConfig(dtype="float33"), log_path=log)
    assert excinfo.value.flag == "--dtype"


def test_crash_during_startup_raises_with_the_engines_own_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A checkpoint naming an architecture vLLM does not know: the flags are valid, so the engine
    # starts, and then fails while building its model config.
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    config_path = broken / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["TailguardNoSuchForCausalLM"]
    config_path.write_text(json.dumps(config))
    started = time.monotonic()
    with pytest.raises(EngineLaunchError) as excinfo:
        start_engine(model=str(broken), config=engine_config(), log_path=tmp_path / "engine.log")
    error = excinfo.value
    assert time.monotonic() - started < 300
    assert any("TailguardNoSuchForCausalLM" in line for line in error.engine_errors), error.engine_errors
    assert "TailguardNoSuchForCausalLM" in str(error).split("engine log, last lines")[0]
    assert error.log_tail, "the error carries the engine's last log lines"
    assert process_group_members(_engine_pgid_from_log(tmp_path / "engine.log")) == []


def _engine_pgid_from_log(log: Path) -> int:
    # vLLM's API server logs its own pid (the process group leader) as "(APIServer pid=N)".
    for line in log.read_text().splitlines():
        if line.startswith("(APIServer pid="):
            return int(line.split("pid=", 1)[1].split(")", 1)[0])
    raise AssertionError("no APIServer pid in the engine log")


def test_killing_the_caller_leaves_no_engine_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A separate program starts an engine and is then SIGKILLed: it gets no chance to clean up,
    # so only the watchdog can stop the engine's process tree.
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from serving.engine import EngineConfig, spawn_engine
        engine = spawn_engine(model={str(tiny_model_dir)!r}, config=EngineConfig.cpu_default(),
                              log_path=Path({str(tmp_path / "engine.log")!r}))
        print(engine.engine_pid, flush=True)
        time.sleep(600)
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        engine_pgid = int(caller.stdout.readline())
        # Wait until vLLM has spawned its engine-core process, so there is a tree to clean up.
        deadline = time.monotonic() + 180
        while len(process_group_members(engine_pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(process_group_members(engine_pgid)) >= 2, "vLLM should have spawned its engine core"
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=10)
    deadline = time.monotonic() + 60
    while process_group_members(engine_pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_group_members(engine_pgid) == []


def test_engine_launches_and_is_healthy(engine: EngineProcess, tiny_model_dir: Path) -> None:
    assert engine.alive()
    assert engine.healthy()
    assert engine.endpoint.model_name == str(tiny_model_dir)
    log = engine.log_path.read_text()
    assert "--enforce-eager" in log.splitlines()[0], "the log starts with the command line"
    assert "Application startup complete" in log
    # the start-up phases a ranking case records, read from this real engine's log (eager: no
    # compilation, no graphs)
    from benchmarks.sim_rank_gpu import engine_startup

    phases = engine_startup(log)
    assert phases["weights_s"] is not None and phases["init_engine_s"] is not None
    assert phases["compile_s"] is None and phases["graph_capture_s"] is None


def _replay_slice(
    engine: EngineProcess, trace: Path, *, api: str, max_requests: int, time_scale: float
) -> tuple[list[RequestResult], ReplayResult]:
    result = replay_trace(
        endpoint=engine.base_url,
        trace=trace,
        api=api,
        max_requests=max_requests,
        time_scale=time_scale,
        max_prompt_tokens=1536,
        max_output_tokens=8,
        progress=False,
        request_timeout_s=120,
        slo=SLO(ttft_ms=60_000),
    )
    return list(result.requests), result


def test_replay_mooncake_slice_records_ttft_for_every_request(
    engine: EngineProcess, shared_traces: Path
) -> None:
    requests, result = _replay_slice(
        engine, shared_traces / "mooncake_synthetic.jsonl", api="completions", max_requests=8, time_scale=0.5
    )
    assert len(requests) == 8
    for r in requests:
        assert r.error is None, r.error
        assert r.ttft_ms is not None and r.ttft_ms > 0
        # The endpoint counted exactly the tokens we synthesised.
        assert r.num_prompt_tokens_reported == r.num_prompt_tokens
        assert r.num_output_tokens == r.max_output_tokens
    summary = result.summary
    assert summary.num_errors == 0 and summary.ttft_ms.count == 8
    assert summary.slo_attainment == 1.0


def test_replay_azure_slice_over_chat_records_ttft_for_every_request(
    engine: EngineProcess, shared_traces: Path
) -> None:
    # The first Azure requests are seconds apart: replay them 20x faster.
    requests, result = _replay_slice(
        engine, shared_traces / "azure2023_conv.csv", api="chat", max_requests=8, time_scale=0.05
    )
    assert len(requests) == 8
    assert all(r.error is None and r.ttft_ms is not None for r in requests)
    assert all(r.num_prompt_tokens_reported == r.num_prompt_tokens for r in requests)
    assert result.summary.tpot_ms.count == 8


def test_shared_prefix_blocks_hit_the_engines_prefix_cache(
    engine: EngineProcess, tiny_model_dir: Path, shared_traces: Path
) -> None:
    # Two Mooncake requests that share leading blocks, short enough for the tiny engine.
    trace = read_trace(shared_traces / "mooncake_synthetic.jsonl", max_requests=200)
    pair = None
    for i, first in enumerate(trace):
        if not first.hash_ids or first.num_prompt_tokens > 3500:
            continue
        for second in trace[i + 1 :]:
            if second.hash_ids[:2] == first.hash_ids[:2] and second.num_prompt_tokens <= 3500:
                pair = (first, second)
                break
        if pair:
            break
    assert pair is not None, "the trace slice should contain a shared prefix"
    shared_blocks = 0
    for a, b in zip(pair[0].hash_ids, pair[1].hash_ids, strict=False):
        if a != b:
            break
        shared_blocks += 1

    tokenizer = PromptTokenizer(tiny_model_dir)
    target = Target(base_url=engine.base_url, model=engine.endpoint.model_name)
    settings = ReplaySettings(
        endpoint=target.base_url,
        model=target.model,
        api="completions",
        source="mooncake pair",
        time_scale=1.0,
        rate_scale=1.0,
        rate_rps=None,
        arrival_cv=None,
        max_requests=2,
        max_prompt_tokens=None,
        max_output_tokens=4,
        ignore_eos=True,
        seed=0,
        tokenizer=str(tiny_model_dir),
    )
    before = scrape(engine.base_url)
    # Sent 3 s apart so the first prefill is done (and cached) before the second arrives.
    result = replay(
        list(pair),
        [0.0, 3.0],
        target=target,
        synthesizer=PromptSynthesizer(tokenizer, seed=0),
        settings=settings,
        progress=False,
    )
    after = scrape(engine.base_url)
    assert result.summary.num_errors == 0
    delta = snapshot_delta(before, after)
    shared_tokens = shared_blocks * 512
    assert delta.prefix_cache_queries_tokens >= pair[0].num_prompt_tokens + pair[1].num_prompt_tokens - 2
    # vLLM caches whole blocks of 128 tokens here: at most one block of the shared prefix is lost.
    assert delta.prefix_cache_hits_tokens >= shared_tokens - 128, delta
    assert delta.prefix_cache_hit_rate > 0.4


def test_metrics_snapshot_of_the_live_engine(engine: EngineProcess, shared_traces: Path) -> None:
    # Its own requests (the engine is shared by the module): it holds whichever tests ran before.
    before = scrape(engine.base_url)
    requests, _ = _replay_slice(
        engine, shared_traces / "mooncake_synthetic.jsonl", api="completions", max_requests=4, time_scale=0.5
    )
    assert all(r.error is None for r in requests)
    snapshot = scrape(engine.base_url)
    assert snapshot.prompt_tokens_total - before.prompt_tokens_total >= sum(
        r.num_prompt_tokens for r in requests
    )
    assert snapshot.ttft_s.count - before.ttft_s.count == 4
    assert snapshot.ttft_s.quantile(0.5) > 0
    assert not math.isnan(snapshot.prefix_cache_hit_rate)
    # The steps vLLM's tokens-per-iteration histogram records are those that sample: at least one
    # per generated token of the longest request, at most one per generated token; it counts each
    # prompt's computed tokens (less its prefix-cache hit) in the step of its first token, and
    # every generated token. The module's engine has served these prompts before: the hits are
    # real here, and at most the prefix cache's hit tokens are left out.
    delta = snapshot_delta(before, snapshot)
    steps = delta.step_tokens
    generated = snapshot.generation_tokens_total - before.generation_tokens_total
    prompted = snapshot.prompt_tokens_total - before.prompt_tokens_total
    assert max(r.num_output_tokens for r in requests) <= steps.count <= generated
    assert prompted - delta.prefix_cache_hits_tokens + generated <= steps.sum <= prompted + generated


def test_the_engine_probe_times_the_calibrated_shapes_on_the_running_engine(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The speed probe a prediction for this engine carries: the calibration's own prefill and
    decode shapes timed on the live engine, each beside the calibrated figure it is read against."""
    from serving.perf.machine import DECODE_LABEL, probe_engine_speed

    calibration = tmp_path / "local_cpu.json"
    rows = [
        {"kind": "ttft", "label": "single prefill 128", "measured_s": 0.010, "steps": []},
        {"kind": "tpot", "label": DECODE_LABEL, "measured_s": 0.002, "steps": []},
    ]
    calibration.write_text(json.dumps({"observations": rows}))
    before = scrape(engine.base_url)
    speed = probe_engine_speed(
        engine.base_url,
        engine.endpoint.model_name,
        tiny_model_dir,
        seed=5,
        prefill_tokens=128,
        path=calibration,
    )
    delta = snapshot_delta(before, scrape(engine.base_url))
    assert speed.prefill_tokens == 128 and speed.calibrated_prefill_s == 0.010
    assert speed.prefill_s > 0 and speed.decode_s > 0
    assert speed.compute_scale == speed.prefill_s / 0.010 and speed.step_scale == speed.decode_s / 0.002
    # Three single prefills of 128 tokens and one decode request of 64: in fresh words, no cache hit.
    assert delta.prompt_tokens.count == 4 and delta.prompt_tokens.sum == 3 * 128 + 64
    assert delta.prefix_cache_hit_rate == 0.0


def test_single_requests_of_each_length_are_timed_one_at_a_time(
    engine: EngineProcess, tmp_path: Path
) -> None:
    """The single-request measurement the eager-floor fit and a ranking run's floor probe share
    (`benchmarks.sim_gpu_isolated.measure_lengths`): per length one unmeasured request, then each
    measured one alone, with the engine's own prefill time of each."""
    from benchmarks.sim_gpu_isolated import measure_lengths

    before = scrape(engine.base_url)
    seen: list[int] = []
    entries = measure_lengths(
        engine.base_url,
        [64, 96],
        repeats=2,
        output_tokens=4,
        work=tmp_path,
        after_each=lambda entry: seen.append(entry["prompt_tokens"]),
    )
    delta = snapshot_delta(before, scrape(engine.base_url))
    assert seen == [64, 96] and [e["prompt_tokens"] for e in entries] == [64, 96]
    for entry in entries:
        assert entry["requests"] == 2 and entry["errors"] == 0 and len(entry["ttft_ms"]) == 2
        each = entry["engine"]["prefill_ms_each"]
        assert len(each) == 2 and all(v is not None and v > 0 for v in each)
    # three requests a length (the unmeasured one first), each in words no other request used
    assert delta.prompt_tokens.count == 6 and delta.prompt_tokens.sum == 3 * 64 + 3 * 96
    assert delta.prefix_cache_hit_rate == 0.0


def test_replay_command_writes_json(engine: EngineProcess, shared_traces: Path, tmp_path: Path) -> None:
    from tailguard.cli import main

    out = tmp_path / "replay.json"
    status = main(
        [
            "replay",
            "--endpoint",
            engine.base_url + "/v1",
            "--trace",
            str(shared_traces / "azure2023_conv.csv"),
            "--time-scale",
            "0.05",
            "--max-requests",
            "4",
            "--max-output-tokens",
            "4",
            "--json",
            str(out),
            "--no-progress",
            "--slo-ttft-ms",
            "60000",
        ]
    )
    assert status == 0
    data = json.loads(out.read_text())
    assert data["summary"]["num_requests"] == 4 and data["summary"]["num_errors"] == 0
    assert data["summary"]["ttft_ms"]["p50"] > 0
    assert all(r["ttft_ms"] is not None for r in data["requests"])


def test_clean_shutdown_leaves_no_process(engine: EngineProcess) -> None:
    pgid = engine.engine_pid
    assert process_group_members(pgid)
    engine.stop()
    assert not engine.alive()
    assert engine.leftover_pids() == []
    assert process_group_members(pgid) == []
    with socket.socket() as sock:
        sock.settimeout(2)
        assert sock.connect_ex((engine.host, engine.port)) != 0, "the port is free again"
