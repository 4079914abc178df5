"""`tailguard tune`: search serving configurations against an SLO on the customer's traffic.

State lives in `--work-dir` (default: next to `--json`): re-running the same command resumes
after the last finished trial instead of starting over. With an OpenAI-style log that holds prompt
text, the work dir also holds the correctness gate's golden set (golden.json, owner-only): token
ids of a few of your prompts, and the reference's answers to them in state.json. Nothing else
(the report, the log lines) carries them: delete the work dir with the job.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuning.search.caps import Caps
from tuning.search.job import (
    HARDWARE,
    JobSpec,
    JobSpecError,
    ReferenceFailedError,
    TrialRecord,
    caps_for,
    plan_job,
    report,
    run_trials,
    write_json,
)
from tuning.search.space import LOCAL_CPU, ModelLoadError, model_info
from tuning.workload.errors import TraceError
from tuning.workload.ingest import ingest_path
from tuning.workload.synth import MIN_LENGTH_SCALE


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
    p.add_argument(
        "--budget-trials",
        type=int,
        default=8,
        help="live search trials (the reference capture and the confirmation rounds come on top)",
    )
    p.add_argument("--strategy", choices=("tpe", "grid"), default="tpe")
    p.add_argument("--hardware", choices=sorted(HARDWARE), default=LOCAL_CPU.name)
    p.add_argument("--duration-s", type=float, default=20.0, help="length of each replay at the target rate")
    p.add_argument("--repeats", type=int, default=2, help="replays at the target rate per trial")
    p.add_argument(
        "--confirm-repeats",
        type=int,
        default=3,
        help="interleaved rounds re-measuring the finalists and the baselines (3-10; 0 skips: unconfirmed)",
    )
    p.add_argument("--finalists", type=int, default=2, help="search candidates confirmed (1-4)")
    p.add_argument(
        "--contention-cores",
        type=float,
        default=0.3,
        help="foreign CPU load (cores) above which a trial is contended and excluded",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        help="cap on replayed prompts (default: the sample's p99, within the hardware's replay limit)",
    )
    p.add_argument("--max-output-tokens", type=int, help="cap on generated tokens (default: as prompts)")
    p.add_argument("--max-model-len", type=int, help="engine context (default: the caps, within the model's)")
    p.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help=f"replay every prompt and output at this factor of its length ({MIN_LENGTH_SCALE:g}-1; default 1: "
        "real lengths) where the hardware cannot replay them in reasonable time: keeps the length "
        "distribution's shape, where a cap flattens its tail; the caps then apply to the scaled lengths",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--load-format",
        choices=("dummy",),
        help="dummy: random weights from the model's config.json (timings of the architecture, "
        "meaningless text; the correctness gate then compares random models)",
    )
    p.add_argument("--json", required=True, type=Path, help="write the job report here")
    p.add_argument("--work-dir", type=Path, help="state and engine logs (default: OUT's name + .work)")
    p.add_argument("--print-space", action="store_true", help="print the search space and exit")
    p.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    if not MIN_LENGTH_SCALE <= args.length_scale <= 1.0:  # also refuses NaN
        print(f"tailguard tune: --length-scale must be {MIN_LENGTH_SCALE:g} to 1", file=sys.stderr)
        return 1
    try:
        caps = _caps(args)
    except (TraceError, ModelLoadError, OSError) as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
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
        hardware=args.hardware,
        confirm_repeats=args.confirm_repeats,
        finalists=args.finalists,
        contention_cores=args.contention_cores,
        max_prompt_tokens=caps.max_prompt_tokens,
        max_output_tokens=caps.max_output_tokens,
        max_model_len=caps.max_model_len,
        length_scale=args.length_scale,
        seed=args.seed,
        load_format=args.load_format,
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
    print(prepared.caps["line"], file=sys.stderr)
    print(golden_line(prepared.golden), file=sys.stderr)
    try:
        run_trials(
            prepared,
            history,
            work_dir,
            log=lambda line: print(line, file=sys.stderr),
            on_trial=lambda records: _save_history(work_dir, spec, records),
        )
    except ReferenceFailedError as exc:
        write_json(args.json, {**report(prepared, history), "error": str(exc)})
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
    data = report(prepared, history)
    write_json(args.json, data)
    print(data["selection"]["summary"])
    print(prepared.caps["line"])
    return 0


def golden_line(about: Mapping[str, Any]) -> str:
    """What the correctness gate judges on, in counts and lengths (never the prompts)."""
    lengths = ", ".join(str(n) for n in about.get("prompt_tokens") or [])
    return f"Correctness gate: {about.get('num_prompts')} {about.get('source')} of {lengths} tokens ({about.get('why')})."


def _caps(args: argparse.Namespace) -> Caps:
    """The caps the user gave, the rest from the sample's profile and the hardware."""
    given = (args.max_prompt_tokens, args.max_output_tokens, args.max_model_len)
    profile = None
    if None in given[:2]:
        profile = ingest_path(args.trace).profile
    return caps_for(
        input_p99=profile.input_tokens.p99 if profile else 0,
        output_p99=profile.output_tokens.p99 if profile else 0,
        model_max_len=model_info(
            args.model, require_weights=args.load_format is None
        ).max_position_embeddings,
        hardware=HARDWARE[args.hardware],
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_model_len=args.max_model_len,
        length_scale=args.length_scale,
    )


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
