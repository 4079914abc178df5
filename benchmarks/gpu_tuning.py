"""Tuning on a real GPU: whole tuning jobs on the project's H200, against vLLM's defaults.

Runs on the GPU host itself (the library side of Tailguard needs no Django): the engine is the
host's CUDA vLLM, started by `serving.engine.launcher` for every trial, with random weights from
the model's `config.json` (`--load-format dummy`: the real architecture's shapes, memory and
timings; meaningless text). For each trace:

1. the knee: vLLM's defaults (bf16, the checkpoint's precision: the competent baseline on a GPU)
   replay the trace on one engine at rising rates; the knee is the highest rate meeting the SLO;
2. a tuning job as the product runs it (`tuning.search.job`, hardware `h200`: the GPU search
   space) at `--knee-fraction` of that rate: the bf16 reference captured for the gate, the
   search (the competent baseline first, then the simulator's favourites), confirmation of the
   finalists against the baseline in interleaved rounds on fresh engines with 95% intervals,
   and a leave-one-out ablation of a winner's knobs;
3. beside every measured trial, the simulator's forecast from the H200 operator calibration
   (`serving/perf/data/h200.json`), and its error.

Device time is scarce (10 minutes a command, about 30 a session): `--deadline-s` stops before a
step that would not finish in time, every step is kept in `--state` (on the host's /tmp), and
the result file is rewritten after each step with `"complete": false` until the job ends, so a
later command resumes where the last one stopped and partial results come back.

    python3 benchmarks/gpu_tuning.py --model-dir /tmp/tgpu/models/llama-3.1-8b \\
        --model-label llama-3.1-8b --traces mooncake --out $OUT/gpu_tuning.json --deadline-s 540
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._job_case import trace_case  # noqa: E402
from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._resumable import Clock, load_state, log, save_state  # noqa: E402
from serving.engine.launcher import start_engine  # noqa: E402
from serving.loadgen.api import replay_trace  # noqa: E402
from tuning import __version__  # noqa: E402
from tuning.search.job import (  # noqa: E402
    JobSpec,
    Prepared,
    TrialRecord,
    caps_for,
    execute,
    next_trial,
    outcome_line,
    plan_job,
    report,
)
from tuning.search.slo import parse_slo  # noqa: E402
from tuning.search.space import model_info  # noqa: E402
from tuning.search.trial import describe, warm_up  # noqa: E402
from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl  # noqa: E402

TRACES_DIR = REPO / "data" / "traces"
TRACES = {"azure_conv": "azure2023_conv.csv", "mooncake": "mooncake_synthetic.jsonl"}
# Rates tried for the knee (req/s): geometric, so a fast GPU and a slow one both find theirs in
# a few steps; the probe stops at the first rate that misses the SLO. The rates below
# DEFAULT_LADDER_START are for a large model on long prompts (`--ladder-start 0.125`).
LADDER = (0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
DEFAULT_LADDER_START = 0.5
FIRST_TRIAL_ESTIMATE_S = 200.0
# With random weights the gate compares random models, whose near-uniform next-token
# distributions any rounding change reorders: precision knobs (dtype, fp8 KV, fp8 weights) would
# be refused for the weights, not for the change. And n-gram speculation's acceptance depends on
# the text, which random weights make meaningless. These are held at vLLM's defaults here; with a
# real checkpoint the job searches them.
# Shapes written here for `--load-format dummy` (the GPU bundle's make_dummy_model.py writes the
# Llama ones): the published config.json fields of each architecture that decide its shapes.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-32b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}


def write_shape(shape: str, out: Path, tokenizer_from: Path) -> Path:
    """A model directory of `shape` for random weights: its config.json and the tokenizer files
    of `tokenizer_from` (ids must stay below the shape's vocabulary, which the check enforces)."""
    import shutil

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    tokenizer = tokenizer_from / "tokenizer.json"
    if not tokenizer.is_file():
        raise SystemExit(f"{tokenizer_from} has no tokenizer.json")
    config = SHAPES[shape]
    vocab = len(json.loads(tokenizer.read_text()).get("model", {}).get("vocab", {}))
    if vocab > config["vocab_size"]:
        raise SystemExit(
            f"the tokenizer's {vocab:,} ids exceed {shape}'s vocabulary of {config['vocab_size']:,}"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    return out


RANDOM_WEIGHTS_FROZEN = (
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "speculative",
)  # an engine start on a cold host plus one replay, before any is timed


def _spec(args: argparse.Namespace, trace: Path, peak_rps: float, caps: Any) -> JobSpec:
    return JobSpec(
        trace_path=str(trace),
        model_path=str(args.model_dir),
        slo=args.slo,
        peak_rps=peak_rps,
        hardware=args.hardware,
        budget_trials=args.search_budget,
        duration_s=args.duration_s,
        repeats=1,
        capacity_steps=(1.25,),
        max_prompt_tokens=caps.max_prompt_tokens,
        max_output_tokens=caps.max_output_tokens,
        max_model_len=caps.max_model_len,
        confirm_repeats=args.confirm_repeats,
        finalists=args.finalists,
        load_format="dummy",
        frozen_knobs=tuple(k for k in args.frozen_knobs.split(",") if k),
        seed=args.seed,
    )


def _caps(args: argparse.Namespace, trace: Path) -> Any:
    from tuning.search.job import HARDWARE

    sample = ingest_path(trace, keep_blocks=True)
    model = model_info(args.model_dir, require_weights=False)
    # The context is capped (a competent user sizes it to the traffic, not the model's 128k);
    # prompts longer than it are clipped, and the report states the share.
    return caps_for(
        input_p99=sample.profile.input_tokens.p99,
        output_p99=sample.profile.output_tokens.p99,
        model_max_len=min(model.max_position_embeddings, args.max_model_len),
        hardware=HARDWARE[args.hardware],
    )


def _knee(
    args: argparse.Namespace, name: str, trace: Path, state: dict[str, Any], clock: Clock
) -> dict[str, Any] | None:
    """The competent baseline's highest ladder rate meeting the SLO, on one engine (each rate
    replays prompts of its own, so the prefix cache sees no repeats across rates)."""
    key = f"knee-{name}"
    if key in state:
        return dict(state[key])
    if args.knee_from is not None:
        recorded = _recorded_knee(args.knee_from, name)
        if recorded is not None:
            state[key] = recorded
            log(
                f"[{name}] knee {recorded['knee_rps']:g} req/s from {args.knee_from.name} ({recorded['source']})"
            )
            return dict(recorded)
    if not clock.fits(args.knee_estimate_s):
        return None
    caps = _caps(args, trace)
    work = args.state.parent / f"work-{name}"
    prepared = plan_job(_spec(args, trace, 1.0, caps), work / "knee")
    slo = parse_slo(args.slo)
    sample = ingest_path(trace, keep_blocks=True)
    points: list[dict[str, Any]] = []
    best = 0.0
    config = prepared.space.to_config(prepared.competent)
    started = time.monotonic()
    with start_engine(model=str(args.model_dir), config=config, startup_timeout_s=900) as engine:
        ready_s = time.monotonic() - started
        log(f"[{name}] knee engine ready in {ready_s:.0f} s")
        warm_up(engine.base_url)
        ladder = [r for r in LADDER if args.ladder_start <= r <= args.ladder_stop] or [LADDER[-1]]
        for i, rate in enumerate(ladder):
            duration_s = knee_probe_duration_s(rate, args.knee_duration_s, args.knee_min_requests)
            synth = synthesize(
                sample, target_rps=rate, duration_s=duration_s, rng=np.random.default_rng(1000 + i)
            )
            path = work / f"knee-{rate:g}.jsonl"
            with path.open("wb") as out:
                write_mooncake_jsonl(synth, out)
            result = replay_trace(
                endpoint=engine.base_url,
                trace=path,
                max_prompt_tokens=caps.max_prompt_tokens,
                max_output_tokens=caps.max_output_tokens,
                seed=1000 + i,
                slo=slo.per_request(),
                progress=False,
                client_processes=prepared.plan.client_processes,
            )
            summary = result.summary
            met = slo.met_by(summary) and summary.num_errors == 0
            points.append(
                {
                    "rate_rps": rate,
                    "requests": summary.num_requests,
                    "ttft_p50_ms": summary.ttft_ms.p50,
                    "ttft_p95_ms": summary.ttft_ms.p95,
                    "errors": summary.num_errors,
                    "slo_met": met,
                }
            )
            log(
                f"[{name}] knee probe {rate:g} req/s: p50 TTFT {summary.ttft_ms.p50:,.0f} ms, "
                f"p95 {summary.ttft_ms.p95:,.0f} ms, SLO {'met' if met else 'missed'}"
            )
            if not met:
                break
            best = rate
    knee = {
        "knee_rps": best,
        "competent": prepared.competent,
        "points": points,
        "engine_ready_s": round(ready_s, 1),
        "caps": caps.to_dict(),
        "seconds": round(time.monotonic() - started, 1),
    }
    state[key] = knee
    return knee


def knee_probe_duration_s(rate_rps: float, floor_s: float, min_requests: int) -> float:
    """How long a knee probe replays at `rate_rps`: at least `floor_s`, and long enough for
    `min_requests` (a five-request probe passed a Qwen3-32B on Mooncake at 0.125 req/s whose
    trials at 0.8x that rate then missed the SLO on every request)."""
    return max(floor_s, min_requests / rate_rps)


def _recorded_knee(path: Path, name: str) -> dict[str, Any] | None:
    """The knee probe of an earlier result file of this script (same host kind, model and
    engine), with where it came from: re-probing costs about five device-minutes a trace."""
    recorded = json.loads(path.read_text())
    if recorded.get("benchmark") != "gpu_tuning":
        raise SystemExit(f"{path} is not a gpu_tuning result")
    knee = (recorded.get("cases", {}).get(name) or {}).get("knee_probe")
    if not knee or "caps" not in knee:
        return None
    git = recorded.get("git") or {}
    return {
        **knee,
        "source": f"recorded {recorded.get('when')} at commit "
        f"{str(recorded.get('commit') or git.get('commit') or '?')[:10]}, "
        f"vLLM {recorded.get('versions', {}).get('vllm')}, model {recorded.get('model')}",
    }


def _job(
    args: argparse.Namespace,
    name: str,
    trace: Path,
    knee: dict[str, Any],
    state: dict[str, Any],
    clock: Clock,
    persist: Any,
) -> tuple[Prepared, list[TrialRecord], bool]:
    """Runs the job's trials while the deadline allows; (prepared, history, complete)."""
    from tuning.search.caps import Caps

    caps = Caps(**knee["caps"])
    peak = knee["knee_rps"] * args.knee_fraction / 1.25
    spec = _spec(args, trace, peak, caps)
    work = args.state.parent / f"work-{name}" / "job"
    # The job's workload files are written at the first plan and reused by later commands: a
    # later --duration-s would be recorded in the result but not replayed.
    planned_with = state.setdefault(f"plan-{name}", {"duration_s": args.duration_s})
    if planned_with["duration_s"] != args.duration_s:
        raise SystemExit(
            f"[{name}] --duration-s {args.duration_s:g} differs from the {planned_with['duration_s']:g} s "
            f"the job's workload was planned with (state {args.state}); resume with --duration-s "
            f"{planned_with['duration_s']:g}, or start a new state"
        )
    prepared = plan_job(spec, work)
    key = f"job-{name}"
    history = [TrialRecord(**t) for t in state.get(key, {}).get("trials", [])]
    durations: list[float] = list(state.get(key, {}).get("durations", []))
    while (planned := next_trial(prepared, history)) is not None:
        # The longest of the last three measured trials, with a margin: the reference capture
        # (the first engine start, compiling cold) and the early trials overstate later ones,
        # whose engines start from the compile cache.
        measured = durations[1:] if len(durations) > 1 else durations
        estimate = max(measured[-3:]) * 1.1 if measured else args.first_trial_estimate_s
        if not clock.fits(estimate):
            log(
                f"[{name}] stopping before trial {len(history)}: ~{estimate:.0f} s needed, {clock.left():.0f} s left"
            )
            return prepared, history, False
        number = len(history)
        log(f"[{name}] trial {number} [{planned.describe()}]: {describe(planned.assignment)}")
        started = time.monotonic()
        result = execute(
            prepared, planned, history, work / f"trial-{number}", holder=f"gpu_tuning trial {number}"
        )
        durations.append(time.monotonic() - started)
        history.append(TrialRecord(number=number, assignment=planned.assignment, result=result))
        state[key] = {
            "trials": [{"number": r.number, "assignment": r.assignment, "result": r.result} for r in history],
            "durations": durations,
        }
        log(f"[{name}]   {outcome_line(result)} ({durations[-1]:.0f} s)")
        persist(prepared, history)
    return prepared, history, True


def _sim_errors(history: list[TrialRecord]) -> dict[str, Any]:
    """The simulator's forecast beside each measured trial, and its absolute percentage error."""
    rows = []
    for r in history:
        predicted = r.result.get("predicted") or {}
        measured = r.result.get("ttft_p50_ms")
        forecast = predicted.get("ttft_p50_ms")
        if r.result.get("status") != "ok" or not measured or forecast is None:
            continue
        rows.append(
            {
                "trial": r.number,
                "phase": r.phase,
                "measured_ttft_p50_ms": measured,
                "predicted_ttft_p50_ms": forecast,
                "ape": abs(forecast - measured) / measured,
            }
        )
    apes = [row["ape"] for row in rows]
    return {"ttft_p50_mape": float(np.mean(apes)) if apes else None, "trials": rows}


def _figures(case: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    ttft = case.get("ttft_p50_ratio_vs_competent") or {}
    rate = case.get("sustainable_rate_ratio_vs_competent") or {}
    return {
        "ttft_p50_ratio_vs_default": ttft.get("value"),
        "ttft_p50_ratio_vs_default_ci_high": ttft.get("ci_high"),
        "ttft_p50_ratio_vs_default_ci_low": ttft.get("ci_low"),
        "sustainable_rate_ratio_vs_default": rate.get("value"),
        "sustainable_rate_ratio_vs_default_ci_low": rate.get("ci_low"),
        "winner_knobs": case.get("compared_knobs_vs_competent") if case.get("outcome") == "gain" else {},
        "sim_ttft_p50_mape": sim.get("ttft_p50_mape"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="config.json + tokenizer (random weights)"
    )
    parser.add_argument("--model-label", required=True, help="e.g. llama-3.1-8b")
    parser.add_argument("--traces", default="mooncake", help=f"comma-separated, of {', '.join(TRACES)}")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument(
        "--write-shape",
        default=None,
        help=f"write a config.json of this architecture into --model-dir first ({', '.join(SHAPES)})",
    )
    parser.add_argument("--tokenizer-from", type=Path, default=None, help="tokenizer files for --write-shape")
    parser.add_argument("--slo", default="ttft_p50_ms<=600,ttft_p95_ms<=2000")
    parser.add_argument("--knee-fraction", type=float, default=0.8)
    parser.add_argument("--knee-duration-s", type=float, default=15.0)
    parser.add_argument("--knee-estimate-s", type=float, default=330.0)
    parser.add_argument(
        "--knee-min-requests",
        type=int,
        default=20,
        help="each knee probe lasts long enough for this many requests at its rate",
    )
    parser.add_argument(
        "--ladder-start",
        type=float,
        default=DEFAULT_LADDER_START,
        help="first knee-probe rate (req/s): skip rates an earlier run showed far below the knee",
    )
    parser.add_argument(
        "--ladder-stop",
        type=float,
        default=LADDER[-1],
        help="last knee-probe rate (req/s): when a command's time allows only the lowest rates",
    )
    parser.add_argument(
        "--knee-from",
        type=Path,
        default=None,
        help="take each trace's knee probe from an earlier gpu_tuning result (its source is recorded)",
    )
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--search-budget", type=int, default=3)
    parser.add_argument("--confirm-repeats", type=int, default=3)
    parser.add_argument("--finalists", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument(
        "--frozen-knobs",
        default=",".join(RANDOM_WEIGHTS_FROZEN),
        help="knobs held at vLLM's default (default: those random weights cannot judge)",
    )
    parser.add_argument(
        "--first-trial-estimate-s",
        type=float,
        default=FIRST_TRIAL_ESTIMATE_S,
        help="the first trial's expected length, before any was measured (a large model takes longer)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--deadline-s", type=float, default=540.0, help="stop before a step that would not fit"
    )
    parser.add_argument(
        "--state", type=Path, default=Path(tempfile.gettempdir()) / "tailguard-gpu-tuning" / "state.json"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gpu_tuning.json")
    args = parser.parse_args()
    if args.write_shape:
        if args.tokenizer_from is None:
            parser.error("--write-shape needs --tokenizer-from")
        write_shape(args.write_shape, args.model_dir, args.tokenizer_from)
    clock = Clock(args.deadline_s)
    state = load_state(args.state, stamp=git_state(REPO))
    state.setdefault("device_seconds", 0.0)
    command_started = time.monotonic()
    names = [n for n in args.traces.split(",") if n]
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        parser.error(f"unknown trace(s) {', '.join(unknown)}; known: {', '.join(TRACES)}")
    cases: dict[str, dict[str, Any]] = dict(state.get("cases", {}))

    def write(complete: bool) -> None:
        spent = state["device_seconds"] + (time.monotonic() - command_started)
        result = {
            "benchmark": "gpu_tuning",
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "complete": complete,
            **git_state(REPO),  # commit and dirty at the top, as every result file has them
            "machine": machine_facts(),
            "versions": versions("vllm", "torch", "optuna", "numpy", "transformers")
            | {"tailguard": __version__},
            "model": args.model_label,
            "weights": "random (vLLM --load-format dummy from config.json): real shapes and timings, "
            "meaningless text; the gate compares random models",
            "method": {
                "slo": args.slo,
                "knee_fraction": args.knee_fraction,
                "duration_s": args.duration_s,
                "search_budget": args.search_budget,
                "confirm_repeats": args.confirm_repeats,
                "finalists": args.finalists,
                "max_model_len_cap": args.max_model_len,
                "ladder_start_rps": args.ladder_start,
                "ladder_stop_rps": args.ladder_stop,
                "knee_duration_s": args.knee_duration_s,
                "knee_min_requests": args.knee_min_requests,
                "knee_from": str(args.knee_from) if args.knee_from else None,
                "frozen_knobs": args.frozen_knobs,
                "frozen_why": "random weights: the gate cannot judge precision changes on random models, "
                "and n-gram speculation's acceptance depends on meaningful text",
            },
            "device_minutes": round(spent / 60.0, 1),
            "cases": cases,
        }
        save_state(args.out, result)

    complete = True
    for name in names:
        trace = TRACES_DIR / TRACES[name]
        knee = _knee(args, name, trace, state, clock)
        save_state(args.state, state)
        if knee is None:
            log(f"[{name}] no time left for the knee probe")
            complete = False
            break
        if knee["knee_rps"] <= 0:
            cases[name] = {"trace": name, "knee_probe": knee, "outcome": "no_sustainable_rate"}
            continue

        def persist(
            prepared: Prepared, history: list[TrialRecord], name: str = name, knee: dict[str, Any] = knee
        ) -> None:
            case = trace_case(name, prepared, history)
            sim = _sim_errors(history)
            cases[name] = {
                "figures": _figures(case, sim),
                **case,
                "knee_probe": knee,
                "simulator": {
                    **sim,
                    "basis": prepared.sim_note,
                    "report": report(prepared, history).get("simulator"),
                },
            }
            state["cases"] = cases
            save_state(args.state, state)
            write(False)

        _, _, done = _job(args, name, trace, knee, state, clock, persist)
        if not done:
            complete = False
            break
    # The result counts this command's time once: written before the state takes it in.
    write(complete)
    state["device_seconds"] = state["device_seconds"] + (time.monotonic() - command_started)
    save_state(args.state, state)
    log(f"{'complete' if complete else 'partial'}: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
