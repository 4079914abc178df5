"""`tailguard profile`, `tailguard drift` and `tailguard synth`: the workload commands.

On a terminal each shows its progress on stderr (reading, profiling, synthesising, writing).

Exit status: 0 on success, 1 when a trace cannot be read (the message names the line and the
problem), 2 for usage errors (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tuning.commands.progress import console, ingest_with_progress, working
from tuning.workload import (
    FORMATS,
    TraceError,
    WorkloadProfile,
    drift_report,
    synthesize,
    write_mooncake_jsonl,
)

_PROFILE_JSON_MAX_BYTES = 10 << 20


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    formats = ("auto", *FORMATS)

    profile = subparsers.add_parser(
        "profile",
        help="profile a traffic sample (lengths, arrivals, prefix reuse)",
        description="Read a trace (OpenAI-style JSONL, Mooncake JSONL, Azure CSV or BurstGPT CSV) "
        "and print its profile.",
    )
    profile.add_argument("trace", metavar="TRACE", help="the trace file (may be gzip-compressed)")
    profile.add_argument("--format", choices=formats, default="auto", help="trace format (default: detect)")
    profile.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    profile.set_defaults(func=_profile)

    drift = subparsers.add_parser(
        "drift",
        help="compare two traffic samples dimension by dimension",
        description="Compare OLD (what an endpoint was tuned for) with NEW. Each may be a trace or "
        "a profile saved with `tailguard profile --json`.",
    )
    drift.add_argument("old", metavar="OLD")
    drift.add_argument("new", metavar="NEW")
    drift.add_argument("--format", choices=formats, default="auto", help="format of trace files")
    drift.add_argument("--json", action="store_true", help="print the report as one JSON object")
    drift.set_defaults(func=_drift)

    synth = subparsers.add_parser(
        "synth",
        help="write a synthetic trace at a target rate with the sample's shape",
        description="Write a replayable Mooncake-style JSONL trace that keeps the sample's joint "
        "length distribution, burstiness and prefix structure.",
    )
    synth.add_argument("trace", metavar="TRACE")
    synth.add_argument("--target-rps", type=float, required=True, help="mean arrival rate of the output")
    synth.add_argument("--duration-s", type=float, required=True, help="time span of the output")
    synth.add_argument("--seed", type=int, required=True, help="random seed (same seed, same file)")
    synth.add_argument("--out", required=True, help="output file (JSONL)")
    synth.add_argument("--format", choices=formats, default="auto", help="format of TRACE")
    synth.set_defaults(func=_synth)


def _fail(command: str, path: str, problem: str) -> int:
    print(f"tailguard {command}: error: {path}: {problem}", file=sys.stderr)
    return 1


def _profile(args: argparse.Namespace) -> int:
    try:
        result = ingest_with_progress(args.trace, out=console(), trace_format=args.format)
    except TraceError as exc:
        return _fail("profile", args.trace, str(exc))
    except OSError as exc:
        return _fail("profile", args.trace, exc.strerror or "cannot read the file")
    if args.json:
        print(json.dumps(result.profile.to_json_dict()))
    else:
        print(format_profile(result.profile, Path(args.trace).name))
    return 0


def format_profile(profile: WorkloadProfile, name: str) -> str:
    """The readable summary `tailguard profile` prints without --json."""
    minutes, seconds = divmod(profile.duration_s, 60)
    lines = [
        f"{name}: {profile.trace_format} trace, {profile.num_requests:,} requests over "
        f"{int(minutes)}m {seconds:04.1f}s",
    ]
    if profile.num_failed_requests:
        lines.append(f"  ({profile.num_failed_requests:,} failed requests counted separately, not profiled)")
    if profile.tokenizer:
        lines.append(f"  token counts missing from the log were counted with {profile.tokenizer}")
    header = f"{'':15}" + "".join(f"{h:>10}" for h in ("mean", "p50", "p90", "p95", "p99", "max"))
    lines.append(header)
    for label, stats in (("input tokens", profile.input_tokens), ("output tokens", profile.output_tokens)):
        values = (stats.mean, stats.p50, stats.p90, stats.p95, stats.p99, stats.max)
        lines.append(f"{label:15}" + "".join(f"{v:>10,.0f}" for v in values))
    arrival = profile.arrival
    lines.append(
        f"arrivals: mean {arrival.mean_rps:,.2f} req/s, busiest minute {arrival.peak_rps_60s:,.2f} req/s, "
        f"inter-arrival CV {arrival.interarrival_cv:.2f}"
    )
    if profile.prefix.reuse_ratio is None:
        lines.append("prefix reuse: unknown (this format carries no prefix information)")
    else:
        lines.append(
            f"prefix reuse: {profile.prefix.reuse_ratio:.1%} of prompt tokens with an unbounded cache "
            f"({profile.prefix.block_size_tokens}-token blocks, {profile.prefix.unique_blocks:,} distinct)"
        )
    return "\n".join(lines)


def _load_profile(path: str, trace_format: str) -> WorkloadProfile:
    """A saved profile (JSON from `tailguard profile --json`) or a trace to profile now."""
    file = Path(path)
    if file.suffix == ".json" and file.stat().st_size <= _PROFILE_JSON_MAX_BYTES:
        data: Any
        try:
            data = json.loads(file.read_bytes())
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and "sketch" in data and "num_requests" in data:
            try:
                return WorkloadProfile.from_json_dict(data)
            except (KeyError, TypeError, ValueError):
                raise TraceError(None, "not a complete saved profile") from None
    return ingest_with_progress(path, out=console(), trace_format=trace_format).profile


def _drift(args: argparse.Namespace) -> int:
    profiles: list[WorkloadProfile] = []
    for path in (args.old, args.new):
        try:
            profiles.append(_load_profile(path, args.format))
        except TraceError as exc:
            return _fail("drift", path, str(exc))
        except OSError as exc:
            return _fail("drift", path, exc.strerror or "cannot read the file")
    report = drift_report(profiles[0], profiles[1])
    if args.json:
        print(json.dumps(report.to_json_dict()))
        return 0
    print(("DRIFT: " if report.drifted else "") + report.summary)
    for dim in report.dimensions:
        mark = "drift" if dim.drifted else "ok"
        value = "n/a" if dim.divergence is None else f"{dim.divergence:.3f}"
        limit = f"{dim.threshold:.3f}"
        print(f"  {dim.dimension:14} {mark:5} divergence {value:>7} (threshold {limit})  {dim.explanation}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    if not args.target_rps > 0 or not args.duration_s > 0:
        print("tailguard synth: error: --target-rps and --duration-s must be positive", file=sys.stderr)
        return 2
    try:
        sample = ingest_with_progress(args.trace, out=console(), trace_format=args.format, keep_blocks=True)
    except TraceError as exc:
        return _fail("synth", args.trace, str(exc))
    except OSError as exc:
        return _fail("synth", args.trace, exc.strerror or "cannot read the file")
    with working(console(), f"synthesising {args.duration_s:g} s at {args.target_rps:g} req/s"):
        trace = synthesize(
            sample,
            target_rps=args.target_rps,
            duration_s=args.duration_s,
            rng=np.random.default_rng(args.seed),
        )
    out = Path(args.out)
    # Written beside the target and renamed, so a reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", prefix=f".{out.name}.")
    try:
        with (
            os.fdopen(handle, "wb") as stream,
            working(console(), f"writing {trace.num_requests:,} requests"),
        ):
            write_mooncake_jsonl(trace, stream)
        umask = os.umask(0)
        os.umask(umask)
        Path(temporary).chmod(0o666 & ~umask)  # mkstemp makes it owner-only; a trace is not secret
        Path(temporary).replace(out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    print(
        f"wrote {trace.num_requests:,} requests over {args.duration_s:g} s "
        f"({args.target_rps:g} req/s, seed {args.seed}) to {out}"
    )
    return 0
