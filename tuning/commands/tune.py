"""`tailguard tune`: search serving configurations against an SLO on the customer's traffic.

State lives in `--work-dir` (default: next to `--json`): re-running the same command resumes
after the last finished trial instead of starting over. With an OpenAI-style log that holds prompt
text, the work dir also holds the correctness gate's golden set (golden.json, owner-only): token
ids of a few of your prompts, and the reference's answers to them in state.json. Nothing else
(the report, the log lines) carries them: delete the work dir with the job.

With `--pool NAME` the trials run on the engine hosts of that hardware pool, through their
agents (`tailguard agent --pool NAME`), as the portal's jobs do: each trial is a task on the
pool's queue, and with several idle hosts the search measures a batch of candidates at once,
one per host. That needs the portal's database and broker (DATABASE_URL, CELERY_BROKER_URL),
so this library hands the command over to the portal's own process (`portal.pools.tune`), and
the hosts must see the trace, the model and the work dir at the same paths (a shared folder),
as the portal's agents see its files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuning.search.caps import Caps
from tuning.search.job import (
    HARDWARE,
    MIN_BUDGET_TRIALS,
    JobSpec,
    JobSpecError,
    ReferenceFailedError,
    TrialExecutor,
    TrialRecord,
    caps_for,
    parse_capacity_steps,
    plan_job,
    report,
    run_trials,
    validate_budget,
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
        help=f"live search trials, {MIN_BUDGET_TRIALS} or more: the first is the competent baseline "
        "(the reference capture and the confirmation rounds come on top)",
    )
    p.add_argument("--strategy", choices=("tpe", "grid"), default="tpe")
    p.add_argument(
        "--hardware",
        choices=sorted(HARDWARE),
        help=f"hardware target (default: the pool's, else {LOCAL_CPU.name})",
    )
    p.add_argument(
        "--pool",
        help="run the trials on this hardware pool's engine hosts, through their agents (needs the "
        "portal's DATABASE_URL and CELERY_BROKER_URL); several idle hosts measure several candidates at once",
    )
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
        "--capacity-steps",
        default="1.5,2,3,4",
        help="load multiples of the target tried in each trial while the SLO holds (e.g. '1.5,2'; 'none': no capacity probe)",
    )
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
    refused = _refuse_budget(args)
    if refused is not None:
        return refused
    if args.pool:
        return _hand_over_to_pool(args)
    return run(args)


def _refuse_budget(args: argparse.Namespace) -> int | None:
    """A usage error (2) for a budget that cannot tune, said in one line before any work (the
    trace is not read, no pool is looked up); None when the budget is fine."""
    try:
        validate_budget(args.budget_trials)
    except JobSpecError as exc:
        print(f"tailguard tune: --budget-trials {args.budget_trials}: {exc.message}", file=sys.stderr)
        return 2
    return None


def _hand_over_to_pool(args: argparse.Namespace) -> int:
    """The pool's hosts are reached through the portal (its database and broker), which this
    library does not import: the portal's own module runs the same command (see the docstring)."""
    argv = list(getattr(args, "argv", None) or [])
    if "tune" not in argv:
        print("tailguard tune: --pool needs the command line (run it as `tailguard tune`)", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "portal.pools.tune", *argv[argv.index("tune") + 1 :]]
    return subprocess.run(command, check=False).returncode


def spec_from_args(
    args: argparse.Namespace, *, hardware: str | None = None, price_per_hour_usd: float | None = None
) -> JobSpec:
    """The job the command line asks for (the caps from the sample where not given).
    `hardware` and `price_per_hour_usd`: a pool's, where the trials run on one."""
    hardware = hardware or args.hardware or LOCAL_CPU.name
    caps = _caps(args, hardware)
    return JobSpec(
        trace_path=args.trace,
        model_path=args.model,
        slo=args.slo,
        peak_rps=args.peak_rps,
        headroom=args.headroom,
        budget_trials=args.budget_trials,
        strategy=args.strategy,
        duration_s=args.duration_s,
        repeats=args.repeats,
        hardware=hardware,
        confirm_repeats=args.confirm_repeats,
        finalists=args.finalists,
        capacity_steps=parse_capacity_steps(args.capacity_steps),
        contention_cores=args.contention_cores,
        max_prompt_tokens=caps.max_prompt_tokens,
        max_output_tokens=caps.max_output_tokens,
        max_model_len=caps.max_model_len,
        length_scale=args.length_scale,
        seed=args.seed,
        load_format=args.load_format,
        price_per_hour_usd=price_per_hour_usd,
    )


def work_dir_for(args: argparse.Namespace) -> Path:
    work_dir: Path = args.work_dir or args.json.with_name(args.json.name + ".work")
    return work_dir


def run(
    args: argparse.Namespace,
    *,
    executor: TrialExecutor | None = None,
    hardware: str | None = None,
    price_per_hour_usd: float | None = None,
) -> int:
    """The command: trials on this machine, or on `executor`'s hosts (a pool's)."""
    refused = _refuse_budget(args)
    if refused is not None:
        return refused
    if not MIN_LENGTH_SCALE <= args.length_scale <= 1.0:  # also refuses NaN
        print(f"tailguard tune: --length-scale must be {MIN_LENGTH_SCALE:g} to 1", file=sys.stderr)
        return 1
    try:
        spec = spec_from_args(args, hardware=hardware, price_per_hour_usd=price_per_hour_usd)
    except (TraceError, ModelLoadError, OSError, JobSpecError) as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
    work_dir = work_dir_for(args)
    try:
        prepared = plan_job(spec, work_dir)
    except JobSpecError as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
    if args.print_space:
        print(prepared.space.describe())
        return 0
    history = _load_history(work_dir, spec)
    # Saved before the first trial too: a pool's hosts read the job from it.
    _save_history(work_dir, spec, history)
    print(prepared.caps["line"], file=sys.stderr)
    print(golden_line(prepared.golden), file=sys.stderr)
    try:
        run_trials(
            prepared,
            history,
            work_dir,
            log=lambda line: print(line, file=sys.stderr),
            on_trial=lambda records: _save_history(work_dir, spec, records),
            executor=executor,
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


def _caps(args: argparse.Namespace, hardware: str) -> Caps:
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
        hardware=HARDWARE[hardware],
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_model_len=args.max_model_len,
        length_scale=args.length_scale,
    )


def state_file(work_dir: Path) -> Path:
    return work_dir / "state.json"


def _load_history(work_dir: Path, spec: JobSpec) -> list[TrialRecord]:
    path = state_file(work_dir)
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    if state.get("spec") != json.loads(json.dumps(spec.to_dict())):
        raise SystemExit(f"tailguard tune: {work_dir} holds another job's state; choose another --work-dir")
    return [TrialRecord(**t) for t in state["trials"]]


def read_job(work_dir: Path) -> tuple[JobSpec, list[TrialRecord]]:
    """The job and its recorded trials, as this command saved them (a pool's host reads them)."""
    state = json.loads(state_file(work_dir).read_text())
    return JobSpec.from_dict(state["spec"]), [TrialRecord(**t) for t in state["trials"]]


def _save_history(work_dir: Path, spec: JobSpec, history: list[TrialRecord]) -> None:
    path = state_file(work_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"spec": spec.to_dict(), "trials": [t.__dict__ for t in history]}, allow_nan=False)
    )
    tmp.replace(path)
