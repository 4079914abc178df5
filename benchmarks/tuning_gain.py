"""Tuned vs vLLM defaults vs the auto_tune grid, on the local engine, with the shared traces.

One run, one machine, one moment:

1. For each trace, a rate search on vLLM started with no flags (as a user would) finds the
   highest request rate that meets the SLO.
2. `tailguard tune`'s search (TPE, small budget) runs at that rate (peak x 1.25 headroom = the
   default's limit), its capacity steps probing above it; its winner gets the same rate search,
   plus a measurement at the default's highest rate.
3. On the Azure trace, the plain grid of vLLM's `benchmarks/auto_tune` (max_num_seqs x
   max_num_batched_tokens) runs with the same trial procedure; its winner gets the rate search.
4. Ablation: each knob where the tuned winner differs from the defaults is reverted alone, and
   p50 TTFT is measured at the default's highest rate: the share of the gain each knob carries.

Every engine is started fresh for its measurement and stopped after it. Results go to
benchmarks/results/tuning_gain.json; partial progress is cached next to it, so an interrupted
run resumes (`--fresh` starts over).

    .venv/bin/python benchmarks/tuning_gain.py
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serving.engine.config import EngineConfig  # noqa: E402
from serving.engine.launcher import start_engine  # noqa: E402
from serving.loadgen.api import replay_generated, replay_trace  # noqa: E402
from serving.loadgen.results import json_finite  # noqa: E402
from serving.models.tiny import build_tiny_model  # noqa: E402
from tuning import __version__  # noqa: E402
from tuning.search.job import JobSpec, TrialRecord, plan_job, run_trials, summarize_job  # noqa: E402
from tuning.search.slo import SLOTarget, parse_slo  # noqa: E402
from tuning.search.strategies import GridStrategy  # noqa: E402
from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "tuning_gain.json"
CACHE = REPO / "benchmarks" / "results" / ".tuning_gain.cache.json"
TRACES = {"azure_conv": "azure2023_conv.csv", "mooncake": "mooncake_synthetic.jsonl"}
LADDER = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0)  # rates, req/s


def _cache() -> dict[str, Any]:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def _save(cache: dict[str, Any]) -> None:
    CACHE.write_text(json.dumps(cache, indent=1))


_SAMPLES: dict[str, Any] = {}


def _workload_at(trace: Path, rate_rps: float, args: argparse.Namespace) -> Path:
    """The trace's traffic synthesised at `rate_rps` for `--measure-s` seconds (cached)."""
    out = Path(tempfile.gettempdir()) / "tailguard-tuning-gain" / f"{trace.stem}-{rate_rps:g}rps.jsonl"
    if not out.exists():
        sample = _SAMPLES.get(str(trace))
        if sample is None:
            sample = _SAMPLES[str(trace)] = ingest_path(trace, keep_blocks=True)
        synth = synthesize(
            sample, target_rps=rate_rps, duration_s=args.measure_s, rng=np.random.default_rng(0)
        )
        with out.open("wb") as stream:
            write_mooncake_jsonl(synth, stream)
    return out


_SEEDS = iter(range(1000, 1_000_000))


def _measure(
    url: str, workload: Path, rate_rps: float, base_rps: float, args: argparse.Namespace, slo: SLOTarget
) -> dict[str, Any]:
    # Every measurement on an engine sends prompts of its own: replaying prompts the engine has
    # already seen (an earlier rate of the same search) would measure its prefix cache.
    result = replay_trace(
        endpoint=url,
        trace=_workload_at(workload, rate_rps, args),
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        seed=next(_SEEDS),
        slo=slo.per_request(),
        progress=False,
    )
    s = result.summary
    return {
        "rate_rps": rate_rps,
        "ttft_p50_ms": s.ttft_ms.p50,
        "ttft_p95_ms": s.ttft_ms.p95,
        "errors": s.num_errors,
        "slo_met": slo.met_by(s) and s.num_errors == 0,
        "send_lateness_p99_ms": s.send_lateness_ms.p99,
    }


def rate_search(
    model: Path,
    config: EngineConfig,
    workload: Path,
    base_rps: float,
    slo: SLOTarget,
    args: argparse.Namespace,
    also_at: tuple[float, ...] = (),
) -> dict[str, Any]:
    """Highest ladder rate meeting the SLO (then one bisection step), plus points at `also_at`."""
    with start_engine(model=str(model), config=config, startup_timeout_s=600) as engine:
        url = engine.base_url
        replay_generated(
            endpoint=url,
            num_requests=4,
            rate_rps=50.0,
            num_prompt_tokens=64,
            num_output_tokens=8,
            progress=False,
        )
        points = []
        best, first_fail = 0.0, None
        for rate in LADDER:
            point = _measure(url, workload, rate, base_rps, args, slo)
            points.append(point)
            if not point["slo_met"]:
                first_fail = rate
                break
            best = rate
        if first_fail is not None and best > 0:
            mid = (best + first_fail) / 2
            point = _measure(url, workload, mid, base_rps, args, slo)
            points.append(point)
            if point["slo_met"]:
                best = mid
        extra = [_measure(url, workload, r, base_rps, args, slo) for r in also_at]
    return {"max_rate_rps": best, "points": points, "at": extra}


def p50_at(
    model: Path,
    config: EngineConfig,
    workload: Path,
    base_rps: float,
    rate: float,
    slo: SLOTarget,
    args: argparse.Namespace,
) -> float:
    with start_engine(model=str(model), config=config, startup_timeout_s=600) as engine:
        replay_generated(
            endpoint=engine.base_url,
            num_requests=4,
            rate_rps=50.0,
            num_prompt_tokens=64,
            num_output_tokens=8,
            progress=False,
        )
        return float(_measure(engine.base_url, workload, rate, base_rps, args, slo)["ttft_p50_ms"])


def winner_assignment(prepared: Any, history: list[TrialRecord]) -> dict[str, Any]:
    selection = summarize_job(prepared, history)
    number = selection.winner if selection.winner is not None else selection.best_achievable
    return dict(history[number or 0].assignment)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="m", help="tiny-model size preset (default m: ~40M parameters)")
    parser.add_argument("--slo", default="ttft_p50_ms<=1000,ttft_p95_ms<=3000")
    parser.add_argument("--search-budget", type=int, default=3)
    parser.add_argument("--grid-seqs", default="8,16,64")
    parser.add_argument("--grid-tokens", default="512,2048,8192")
    parser.add_argument("--measure-s", type=float, default=15.0, help="seconds of traffic per measurement")
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--traces", default="azure_conv,mooncake")
    parser.add_argument("--grid-trace", default="azure_conv")
    parser.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    cache = {} if args.fresh else _cache()
    slo = parse_slo(args.slo)
    work = Path(tempfile.gettempdir()) / "tailguard-tuning-gain"
    model = work / f"llama-{args.size}"
    if not (model / "config.json").exists():
        build_tiny_model(arch="llama", size=args.size, out_dir=model, seed=0)
    defaults = EngineConfig(enforce_eager=True, cpu_kv_cache_space_gib=2, max_model_len=2048)
    cases = []
    for name in args.traces.split(","):
        trace = args.traces_dir / TRACES[name]
        state = cache.setdefault(name, {})
        base_rps = 1.0
        # Every measurement replays the trace synthesised at the measured rate for --measure-s.
        workload = trace
        print(f"[{name}] rate search: vLLM defaults", file=sys.stderr)
        if "default" not in state:
            state["default"] = rate_search(model, defaults, workload, base_rps, slo, args)
            _save(cache)
        r_def = state["default"]["max_rate_rps"] or LADDER[0]
        spec = JobSpec(
            trace_path=str(trace),
            model_path=str(model),
            slo=args.slo,
            peak_rps=r_def / 1.25,
            headroom=1.25,
            budget_trials=args.search_budget,
            duration_s=args.measure_s,
            repeats=1,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
        )
        print(
            f"[{name}] search (TPE, budget {args.search_budget}) at {spec.target_rps:.2f} req/s",
            file=sys.stderr,
        )
        prepared = plan_job(spec, work / f"{name}-search")
        history = [TrialRecord(**t) for t in state.get("search_trials", [])]
        run_trials(
            prepared,
            history,
            work / f"{name}-search",
            log=lambda m: print(m, file=sys.stderr),
            on_trial=lambda h, s=state: (
                s.__setitem__("search_trials", [t.__dict__ for t in h]),
                _save(cache),
            ),
        )
        tuned = winner_assignment(prepared, history)
        tuned_config = prepared.space.to_config(tuned)
        if "tuned" not in state:
            state["tuned"] = rate_search(model, tuned_config, workload, base_rps, slo, args, also_at=(r_def,))
            _save(cache)
        default_p50 = next(
            (p["ttft_p50_ms"] for p in state["default"]["points"] if p["rate_rps"] == r_def), math.nan
        )
        tuned_p50 = state["tuned"]["at"][0]["ttft_p50_ms"]
        # Ablation: revert one changed knob at a time.
        changed = prepared.space.changed_knobs(tuned)
        ablation = state.setdefault("ablation", {})
        for knob in changed:
            if knob not in ablation:
                reverted = {**tuned, knob: prepared.space.knob(knob).baseline}
                ablation[knob] = p50_at(
                    model, prepared.space.to_config(reverted), workload, base_rps, r_def, slo, args
                )
                _save(cache)
        gain = default_p50 - tuned_p50
        shares = {
            k: ((v - tuned_p50) / gain if gain > 0 else math.nan) for k, v in ablation.items() if k in changed
        }
        case: dict[str, Any] = {
            "trace": name,
            "slo": args.slo,
            "default_max_rate_rps": r_def,
            "tuned_max_rate_rps": state["tuned"]["max_rate_rps"],
            "tuned": tuned,
            "ttft_p50_default_at_default_max_ms": default_p50,
            "ttft_p50_tuned_at_default_max_ms": tuned_p50,
            "ttft_p50_ratio_at_default_max_rate": tuned_p50 / default_p50 if default_p50 else math.nan,
            "sustainable_rate_ratio": state["tuned"]["max_rate_rps"] / r_def if r_def else math.nan,
            "search_trials": len(history),
            "ablation_p50_ms": {k: ablation[k] for k in changed},
            "gain_share": shares,
            "default_points": state["default"]["points"],
            "tuned_points": state["tuned"]["points"],
            "search": [
                {
                    "number": t.number,
                    "assignment": t.assignment,
                    "slo_met": t.result.get("slo_met"),
                    "ttft_p50_ms": t.result.get("ttft_p50_ms"),
                    "sustainable_multiple": t.result.get("sustainable_multiple"),
                    "gates_passed": bool((t.result.get("correctness") or {}).get("passed")),
                }
                for t in history
            ],
        }
        if name == args.grid_trace:
            grid = GridStrategy(
                max_num_seqs=tuple(int(x) for x in args.grid_seqs.split(",")),
                max_num_batched_tokens=tuple(int(x) for x in args.grid_tokens.split(",")),
            )
            grid_spec = replace(spec, budget_trials=len(grid.points(prepared.space)) + 1, strategy="grid")
            grid_prepared = plan_job(grid_spec, work / f"{name}-grid")
            # The grid has no reference trial of its own: start its history from the search's
            # reference so both use the same correctness yardstick without spending a trial.
            grid_history = [TrialRecord(**t) for t in state.get("grid_trials", [])] or [history[0]]
            print(f"[{name}] auto_tune grid: {len(grid.points(prepared.space))} points", file=sys.stderr)
            run_trials(
                grid_prepared,
                grid_history,
                work / f"{name}-grid",
                strategy=grid,
                log=lambda m: print(m, file=sys.stderr),
                on_trial=lambda h, s=state: (
                    s.__setitem__("grid_trials", [t.__dict__ for t in h]),
                    _save(cache),
                ),
            )
            grid_only = grid_history[1:]
            best_grid = winner_assignment(
                grid_prepared, [replace(t, number=i) for i, t in enumerate(grid_only)]
            )
            if "grid_best" not in state:
                state["grid_best"] = rate_search(
                    model, prepared.space.to_config(best_grid), workload, base_rps, slo, args
                )
                _save(cache)
            case.update(
                grid_trials=len(grid_only),
                grid_best=best_grid,
                grid_max_rate_rps=state["grid_best"]["max_rate_rps"],
                slo_rate_ratio_vs_grid=state["tuned"]["max_rate_rps"] / state["grid_best"]["max_rate_rps"]
                if state["grid_best"]["max_rate_rps"]
                else math.nan,
            )
        cases.append(case)
    grid_case = next((c for c in cases if "grid_trials" in c), {})
    summary = {
        "ttft_p50_ratio_at_default_max_rate": float(
            np.nanmean([c["ttft_p50_ratio_at_default_max_rate"] for c in cases])
        ),
        "sustainable_rate_ratio": float(np.nanmean([c["sustainable_rate_ratio"] for c in cases])),
        "grid_trials": grid_case.get("grid_trials"),
        "search_trials": grid_case.get("search_trials"),
        "slo_rate_ratio_vs_grid": grid_case.get("slo_rate_ratio_vs_grid"),
    }
    import vllm

    out = {
        "machine": f"{platform.node()} {platform.machine()}, {__import__('os').cpu_count()} cores, no GPU",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "versions": {"tailguard": __version__, "vllm": vllm.__version__, "python": platform.python_version()},
        "command": "python benchmarks/tuning_gain.py " + " ".join(sys.argv[1:]),
        "model": f"random-weight llama preset {args.size}",
        "summary": summary,
        "cases": cases,
    }
    RESULTS.write_text(json.dumps(json_finite(out), indent=1, allow_nan=False) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
