"""`tailguard engine ...` and `tailguard replay ...`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from serving.engine.config import EngineConfig, InvalidEngineConfig, validate_args, vllm_importable
from serving.engine.launcher import EngineLaunchError, default_engine_command, start_engine
from serving.loadgen.results import SLO, LatencyStats, ReplayResult
from serving.models.tiny import ARCH_ALIASES, ARCHITECTURES, SIZES, describe_size


def register(subparsers: Any) -> None:
    engine = subparsers.add_parser("engine", help="build local models and run a serving engine")
    engine_sub = engine.add_subparsers(dest="engine_command", metavar="ACTION", required=True)

    tiny = engine_sub.add_parser(
        "tiny-model",
        help="build a random-weight model of a real architecture with a local tokenizer",
        description="Sizes: " + "; ".join(describe_size(s) for s in SIZES),
    )
    tiny.add_argument("--arch", default="llama", choices=sorted([*ARCHITECTURES, *ARCH_ALIASES]))
    tiny.add_argument("--size", default="s", choices=list(SIZES))
    tiny.add_argument("--out", required=True, type=Path, help="directory to write the checkpoint into")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny_model)

    start = engine_sub.add_parser("start", help="serve a model with vLLM until interrupted")
    start.add_argument("--model", required=True, help="model directory (or name, for GPU hosts)")
    start.add_argument("--config", type=Path, help="engine config (.json or .toml); default: CPU defaults")
    start.add_argument("--host", default="127.0.0.1")
    start.add_argument("--port", type=int, help="default: a free port")
    start.add_argument("--log", type=Path, help="engine log file (default: a temporary file)")
    start.add_argument("--startup-timeout-s", type=float, default=600.0)
    start.add_argument(
        "--engine-command",
        help="command that runs the vLLM OpenAI server, e.g. '/opt/vllm/bin/python -m "
        "vllm.entrypoints.openai.api_server' (default: $TAILGUARD_ENGINE_COMMAND or this Python)",
    )
    start.set_defaults(func=_engine_start)

    check = engine_sub.add_parser("check-config", help="validate an engine config with vLLM's own parser")
    check.add_argument("--model", required=True)
    check.add_argument("--config", required=True, type=Path)
    check.set_defaults(func=_engine_check)

    replay = subparsers.add_parser(
        "replay",
        help="replay a trace against an OpenAI-compatible endpoint and measure TTFT/TPOT",
        description="Open-loop replay: requests leave on their (scaled) trace times, however slow the reply.",
    )
    replay.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    replay.add_argument(
        "--trace", required=True, type=Path, help="Mooncake JSONL, Azure CSV or OpenAI-style JSONL"
    )
    replay.add_argument("--json", required=True, type=Path, dest="json_out", help="write results here")
    replay.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply trace times (0.5 = twice as fast)"
    )
    replay.add_argument(
        "--rate-scale", type=float, default=1.0, help="multiply the arrival rate (2 = twice as fast)"
    )
    replay.add_argument(
        "--rate-rps",
        type=float,
        help="ignore the trace's times: send its requests by a gamma process at this rate",
    )
    replay.add_argument(
        "--arrival-cv", type=float, default=1.0, help="with --rate-rps: 1 Poisson, 0 constant"
    )
    replay.add_argument("--max-requests", type=int)
    replay.add_argument(
        "--skip", type=int, default=0, help="skip this many requests at the start of the trace"
    )
    replay.add_argument("--api-key", help="default: $TAILGUARD_API_KEY or $OPENAI_API_KEY")
    replay.add_argument("--model", help="model name to request (default: the endpoint's first model)")
    replay.add_argument("--tokenizer", help="local tokenizer directory (default: the served model's path)")
    replay.add_argument("--api", choices=["completions", "chat"], default="completions")
    replay.add_argument("--max-prompt-tokens", type=int, help="cut longer prompts (keeps leading blocks)")
    replay.add_argument("--max-output-tokens", type=int, help="cap output lengths")
    replay.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send vLLM's ignore_eos (for providers that reject unknown fields)",
    )
    replay.add_argument("--slo-ttft-ms", type=float)
    replay.add_argument("--slo-tpot-ms", type=float)
    replay.add_argument("--slo-e2e-ms", type=float)
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--request-timeout-s", type=float, default=600.0)
    replay.add_argument("--no-progress", action="store_true")
    replay.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the requests over this many client processes, each its own event loop "
        "(1-32; use several where thousands of tokens a second stream back)",
    )
    replay.set_defaults(func=_replay)


def _tiny_model(args: argparse.Namespace) -> int:
    from serving.models.tiny import build_tiny_model

    info = build_tiny_model(arch=args.arch, size=args.size, out_dir=args.out, seed=args.seed)
    print(
        f"built {info.arch} size {info.size}: {info.num_parameters / 1e6:.2f}M parameters, "
        f"{info.size_bytes / 2**20:.1f} MiB, vocab {info.vocab_size} -> {info.path}"
    )
    return 0


def _load_config(path: Path | None) -> EngineConfig:
    return EngineConfig.from_file(path) if path else EngineConfig.cpu_default()


def _engine_check(args: argparse.Namespace) -> int:
    try:
        config = _load_config(args.config)
        if not vllm_importable():
            print("vLLM is not importable here: only the config file itself was checked", file=sys.stderr)
            return 0
        validate_args(config.to_args(model=args.model))
    except InvalidEngineConfig as exc:
        flag = f" [{exc.flag}]" if exc.flag else ""
        print(f"invalid engine config{flag}: {exc}", file=sys.stderr)
        return 2
    print("engine config accepted by vLLM's parser")
    return 0


def _engine_start(args: argparse.Namespace) -> int:
    import shlex

    try:
        config = _load_config(args.config)
    except InvalidEngineConfig as exc:
        print(f"invalid engine config: {exc}", file=sys.stderr)
        return 2
    command = shlex.split(args.engine_command) if args.engine_command else default_engine_command()

    def stop_on_signal(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_signal)
    started = time.monotonic()
    print(f"starting engine for {args.model} ...", file=sys.stderr)
    try:
        engine = start_engine(
            model=args.model,
            config=config,
            command=command,
            host=args.host,
            port=args.port,
            log_path=args.log,
            startup_timeout_s=args.startup_timeout_s,
        )
    except InvalidEngineConfig as exc:
        flag = f" [{exc.flag}]" if exc.flag else ""
        print(f"invalid engine config{flag}: {exc}", file=sys.stderr)
        return 2
    except EngineLaunchError as exc:
        print(f"engine failed to start: {exc}", file=sys.stderr)
        return 1
    with engine:
        print(
            f"engine ready in {time.monotonic() - started:.0f} s at {engine.base_url} "
            f"(model {engine.endpoint.model_name!r}, log {engine.log_path}); Ctrl-C stops it",
            flush=True,
        )
        try:
            while engine.alive():
                time.sleep(1.0)
            print("engine exited:\n" + "\n".join(engine.log_tail(20)), file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("stopping engine ...", file=sys.stderr)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from serving.loadgen.api import replay_trace
    from serving.loadgen.runner import MAX_CLIENT_PROCESSES

    if not 1 <= args.client_processes <= MAX_CLIENT_PROCESSES:
        print(f"replay: --client-processes must be 1 to {MAX_CLIENT_PROCESSES}", file=sys.stderr)
        return 2

    api_key = args.api_key or os.environ.get("TAILGUARD_API_KEY") or os.environ.get("OPENAI_API_KEY")
    slo = SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2e_ms=args.slo_e2e_ms)
    result = replay_trace(
        endpoint=args.endpoint,
        trace=args.trace,
        model=args.model,
        tokenizer=args.tokenizer,
        api=args.api,
        api_key=api_key,
        time_scale=args.time_scale,
        rate_scale=args.rate_scale,
        rate_rps=args.rate_rps,
        arrival_cv=args.arrival_cv,
        max_requests=args.max_requests,
        skip=args.skip,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        ignore_eos=not args.no_ignore_eos,
        seed=args.seed,
        slo=slo,
        request_timeout_s=args.request_timeout_s,
        progress=False if args.no_progress else None,
        client_processes=args.client_processes,
    )
    result.write_json(args.json_out)
    print(format_summary(result))
    print(f"results: {args.json_out}")
    return 0 if result.summary.num_ok else 1


def format_summary(result: ReplayResult) -> str:
    """A short human-readable table of a replay's summary."""
    s = result.summary

    def row(name: str, stats: LatencyStats) -> str:
        values = (stats.p50, stats.p90, stats.p95, stats.p99, stats.max)
        return f"  {name:<16}" + "".join(f"{v:>10.1f}" for v in values)

    lines = [
        f"{s.num_requests} requests, {s.num_errors} errors ({s.error_rate:.1%}) in {s.duration_s:.1f} s: "
        f"{s.request_throughput_rps:.2f} req/s, {s.output_throughput_tps:.1f} output tok/s",
        f"  {'ms':<16}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}{'max':>10}",
        row("TTFT", s.ttft_ms),
        row("TPOT", s.tpot_ms),
        row("ITL", s.itl_ms),
        row("end-to-end", s.e2e_ms),
        row("send lateness", s.send_lateness_ms),
    ]
    if any(v is not None for v in (s.slo.ttft_ms, s.slo.tpot_ms, s.slo.e2e_ms)):
        lines.append(f"  SLO attainment {s.slo_attainment:.1%}, goodput {s.goodput_rps:.2f} req/s")
    if s.num_prompt_token_mismatches:
        lines.append(
            f"  warning: {s.num_prompt_token_mismatches} prompts counted differently by the endpoint"
        )
    errors = [r.error for r in result.requests if r.error]
    if errors:
        lines.append(f"  first error: {errors[0][:200]}")
    return "\n".join(lines)
