"""`tailguard simulate ...`: predict a trace's latencies on any catalog model and hardware."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from serving.catalog.fit import ModelDoesNotFit
from serving.catalog.hardware import HARDWARE, UnknownHardware
from serving.catalog.models import MODELS, UnknownModel
from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.loadgen.results import SLO
from serving.loadgen.traces import TraceFormatError


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="predict TTFT/TPOT of a trace on a catalog model and hardware (no engine started)",
        description="Models: "
        + ", ".join(sorted(MODELS))
        + ". Hardware: "
        + ", ".join(sorted(HARDWARE))
        + ".",
    )
    sim.add_argument(
        "--trace", required=True, type=Path, help="Mooncake JSONL, Azure CSV or OpenAI-style JSONL"
    )
    sim.add_argument("--model", required=True, help="catalog model name")
    sim.add_argument("--hardware", required=True, help="catalog hardware name")
    sim.add_argument(
        "--config", type=Path, help="engine config (.json/.toml); default: the engine's defaults"
    )
    sim.add_argument(
        "--json", action="store_true", dest="as_json", help="print the result as one JSON object"
    )
    sim.add_argument("--out", type=Path, help="also write the JSON (with per-request rows) here")
    sim.add_argument("--time-scale", type=float, default=1.0)
    sim.add_argument("--rate-scale", type=float, default=1.0)
    sim.add_argument("--max-requests", type=int)
    sim.add_argument("--skip", type=int, default=0)
    sim.add_argument("--max-prompt-tokens", type=int)
    sim.add_argument("--max-output-tokens", type=int)
    sim.add_argument("--slo-ttft-ms", type=float)
    sim.add_argument("--slo-tpot-ms", type=float)
    sim.add_argument("--seed", type=int, default=0)
    sim.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from serving.sim.api import result_to_dict, simulate_trace

    try:
        config = EngineConfig.from_file(args.config) if args.config else EngineConfig()
        result = simulate_trace(
            args.trace,
            model=args.model,
            hardware=args.hardware,
            config=config,
            time_scale=args.time_scale,
            rate_scale=args.rate_scale,
            max_requests=args.max_requests,
            skip=args.skip,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
            slo=SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms),
            seed=args.seed,
        )
    except (UnknownModel, UnknownHardware) as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    except (ModelDoesNotFit, InvalidEngineConfig, TraceFormatError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = result_to_dict(result)
    check = None
    if result.hardware == "local-cpu":
        # The local CPU's predictions rest on its calibration: say whether this is that machine.
        from serving.perf.machine import check_local_machine

        check = check_local_machine()
        data["machine_check"] = check.to_dict()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result_to_dict(result, include_requests=True), indent=1) + "\n")
    if args.as_json:
        print(json.dumps(data, indent=1))
        return 0
    s = result.summary
    a = result.attribution
    print(
        f"{result.model} on {result.hardware}: {s.num_requests} requests, {s.num_errors} errors, "
        f"{s.duration_s:.1f} s simulated in {result.wall_s:.2f} s"
    )
    print(f"  step times: {result.basis}")
    print(
        f"  TTFT ms p50 {s.ttft_ms.p50:.1f}  p95 {s.ttft_ms.p95:.1f}  p99 {s.ttft_ms.p99:.1f};  "
        f"TPOT ms mean {s.tpot_ms.mean:.2f}"
    )
    print(f"  prefix-cache hit rate {result.prefix_cache_hit_rate:.1%}, preemptions {result.num_preemptions}")
    t = a.tail
    print(
        f"  p95-tail TTFT split ms: queueing {t.queueing_ms:.1f}, prefill {t.prefill_compute_ms:.1f}, "
        f"chunking {t.chunking_delay_ms:.1f}, preemption {t.preemption_ms:.1f}, overhead {t.overhead_ms:.1f}"
    )
    print(f"  dominant cause: {a.dominant_cause} -> {a.knob}")
    if check is not None and not check.matches:
        print(
            f"  warning: this machine differs from the one calibrated on {check.calibrated_at}: "
            + "; ".join(check.differences)
            + " (recalibrate: python -m serving.perf.calibrate)"
        )
    shares = ", ".join(f"{k} {v:.0%}" for k, v in a.step_time_share.items())
    print(f"  step time by operator class: {shares}")
    return 0
