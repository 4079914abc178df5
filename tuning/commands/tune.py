"""`tailguard tune`: search serving configurations against an SLO on the customer's traffic.

State lives in `--work-dir` (default: next to `--json`): re-running the same command resumes
after the last finished trial instead of starting over.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuning.search.job import JobSpec, JobSpecError, TrialRecord, plan_job, report, run_trials, write_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "tune",
        help="find the cheapest serving configuration that meets an SLO on your traffic",
        description="Live trials on the local engine: every candidate is started, gated for correctness "
        "against the highest-precision reference, and measured on your traffic at peak x headroom.",
    )
    p.add_argument("--trace", required=True, help="traffic sample (any format `tailguard profile` reads)")
    p.add_argument("--model", required=True, help="model directory (e.g. from `tailguard engine tiny-model`)")
    p.add_argument("--slo", required=True, help='e.g. "ttft_p50_ms<=600,ttft_p95_ms<=1500"')
    p.add_argument("--peak-rps", type=float, required=True, help="your peak request rate")
    p.add_argument(
        "--headroom", type=float, default=1.25, help="trials run at peak x headroom (default 1.25)"
    )
    p.add_argument("--budget-trials", type=int, default=8, help="live trials, the reference included")
    p.add_argument("--strategy", choices=("tpe", "grid"), default="tpe")
    p.add_argument("--duration-s", type=float, default=20.0, help="length of each replay at the target rate")
    p.add_argument("--repeats", type=int, default=2, help="replays at the target rate per trial")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="cap on synthesised prompts")
    p.add_argument("--max-output-tokens", type=int, default=64, help="cap on generated tokens")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", required=True, type=Path, help="write the job report here")
    p.add_argument("--work-dir", type=Path, help="state and engine logs (default: OUT's name + .work)")
    p.add_argument("--print-space", action="store_true", help="print the search space and exit")
    p.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    spec = JobSpec(
        trace_path=args.trace,
        model_path=args.model,
        slo=args.slo,
        peak_rps=args.peak_rps,
        headroom=args.headroom,
        budget_trials=args.budget_trials,
        strategy=args.strategy,
        duration_s=args.duration_s,
        repeats=args.repeats,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_model_len=args.max_model_len,
        seed=args.seed,
    )
    work_dir: Path = args.work_dir or args.json.with_name(args.json.name + ".work")
    try:
        prepared = plan_job(spec, work_dir)
    except JobSpecError as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
    if args.print_space:
        print(prepared.space.describe())
        return 0
    history = _load_history(work_dir, spec)
    run_trials(
        prepared,
        history,
        work_dir,
        log=lambda line: print(line, file=sys.stderr),
        on_trial=lambda records: _save_history(work_dir, spec, records),
    )
    write_json(args.json, report(prepared, history))
    selection = report(prepared, history)["selection"]
    print(selection["summary"])
    return 0


def _state_file(work_dir: Path) -> Path:
    return work_dir / "state.json"


def _load_history(work_dir: Path, spec: JobSpec) -> list[TrialRecord]:
    path = _state_file(work_dir)
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    if state.get("spec") != json.loads(json.dumps(spec.to_dict())):
        raise SystemExit(f"tailguard tune: {work_dir} holds another job's state; choose another --work-dir")
    return [TrialRecord(**t) for t in state["trials"]]


def _save_history(work_dir: Path, spec: JobSpec, history: list[TrialRecord]) -> None:
    path = _state_file(work_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"spec": spec.to_dict(), "trials": [t.__dict__ for t in history]}, allow_nan=False)
    )
    tmp.replace(path)
