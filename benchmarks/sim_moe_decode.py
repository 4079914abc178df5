"""The simulator against steady MoE decode measured on the H200 (held out: never fitted on it).

`benchmarks/kernels_e2e.py` (run 7 on) measures, in every served block, steady decode of a
random-weight MoE model (Qwen3-30B-A3B's architecture with 64 experts) at fixed batches: the
batch's requests sent at once with short prompts, so TPOT is the decode step time at that batch.
The same run timed vLLM's fused-MoE op alone, from CUDA-graph replays, with the engine's own
configuration at every token count (`tables.*.buckets[].engine`). This script needs no GPU: it
predicts each batch's TPOT with the simulator for hardware `h200` (the operator calibration and
the engine overheads fitted on the dense 8B and 32B shapes, `serving/perf/data/h200*.json`), and
splits both sides into the MoE op and the rest of the step:

- measured MoE: MoE layers x the op's graph-timed time at the vLLM key nearest the batch;
- simulated MoE: the expert weights the batch touches, streamed at the calibrated rate (the
  step model's roofline term for them);
- the rest: the step time less the MoE part, on each side.

Only the default arm (vLLM's generic configuration) is scored: the simulator does not model
tables. Intervals: the measured TPOT's 95% interval from resampling blocks (fresh engines) and
pooling their requests (`benchmarks._stats.pooled_interval`); the simulator is deterministic, so
its error's interval is its prediction over the measured interval's ends.

    .venv/bin/python benchmarks/sim_moe_decode.py    # seconds; writes benchmarks/results/sim_moe_decode.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._stats import ROUNDS, pooled_interval  # noqa: E402
from benchmarks.kernels_e2e import model_spec  # noqa: E402
from serving.catalog.hardware import get_hardware  # noqa: E402
from serving.engine.config import EngineConfig  # noqa: E402
from serving.loadgen.traces import TraceRequest  # noqa: E402
from serving.perf.model import nearest_measured  # noqa: E402
from serving.sim.api import simulate_trace  # noqa: E402

HARDWARE = "h200"
ARM = "default"
LIMIT = 0.25  # issue 26: an end-to-end error above it asks for a fix of the step model


def nearest_key(keys: Sequence[int], tokens: int) -> int:
    """The table key vLLM uses for `tokens` (the nearest, ties to the smaller)."""
    return min(keys, key=lambda k: (abs(k - tokens), k))


def measured_moe_us(case: Mapping[str, Any], tokens: int) -> float | None:
    """The fused-MoE op's graph-timed time with the engine's own configuration, at the bucket
    vLLM would use for `tokens` (None where the run timed no engine configuration)."""
    for table in (case.get("tables") or {}).values():
        buckets = [b for b in (table or {}).get("buckets", []) if (b.get("engine") or {}).get("time_us")]
        if buckets:
            key = nearest_key([int(b["key"]) for b in buckets], tokens)
            return float(next(b for b in buckets if int(b["key"]) == key)["engine"]["time_us"])
    return None


def mape_interval(
    samples: Mapping[str, tuple[float, Sequence[Sequence[float]]]], seed: int = 0
) -> dict[str, Any]:
    """Mean |predicted/measured - 1| over the batches, with its 95% interval: each draw resamples
    every batch's blocks (whole, their requests pooled) and recomputes the measured medians."""
    if not samples:
        return {"value": None, "ci_low": None, "ci_high": None}
    rng = np.random.default_rng(seed)
    items = [(pred, [np.asarray(b, dtype=np.float64) for b in blocks]) for pred, blocks in samples.values()]
    point = float(np.mean([abs(pred / np.median(np.concatenate(bl)) - 1.0) for pred, bl in items]))
    draws = np.empty(ROUNDS)
    for i in range(ROUNDS):
        errs = []
        for pred, blocks in items:
            picks = rng.integers(0, len(blocks), size=len(blocks))
            errs.append(abs(pred / np.median(np.concatenate([blocks[j] for j in picks])) - 1.0))
        draws[i] = np.mean(errs)
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"value": round(point, 4), "ci_low": round(float(low), 4), "ci_high": round(float(high), 4)}


def score(result: Mapping[str, Any]) -> dict[str, Any]:
    steady_method = result["method"].get("steady_decode")
    if not steady_method:
        raise SystemExit("the result holds no steady-decode measurement (kernels_e2e run 7 on)")
    config = EngineConfig(**result["plan"]["engine_config"])
    hardware = get_hardware(HARDWARE)
    efficiency, basis = nearest_measured(hardware)
    cases: dict[str, Any] = {}
    for name, case in result["cases"].items():
        shape = name.split("/")[0]
        spec = model_spec(shape)
        s_per_byte = 1.0 / (hardware.memory_bandwidth_bytes_per_s * efficiency.memory_efficiency)
        expert_bytes = 3 * spec.hidden_size * spec.moe_intermediate_size * 2.0  # bf16
        rows: dict[str, dict[str, Any]] = {}
        ratios: dict[str, float] = {}
        samples: dict[str, tuple[float, list[list[float]]]] = {}  # batch: (predicted, blocks)
        for batch_text in sorted({k for b in case["blocks"] for k in b.get("steady") or {}}, key=int):
            batch = int(batch_text)
            per_block = [
                b["steady"][batch_text]["tpot_ms"]
                for b in case["blocks"]
                if b["arm"] == ARM
                and b["round"] >= 0
                and b.get("steady", {}).get(batch_text, {}).get("tpot_ms")
            ]
            if not per_block:
                continue
            measured = pooled_interval(per_block, np.median, seed=batch)
            requests = [
                TraceRequest(
                    arrival_s=i * 1e-3 / batch,
                    num_prompt_tokens=int(steady_method["prompt_tokens"]),
                    num_output_tokens=int(steady_method["output_tokens"]),
                )
                for i in range(batch)
            ]
            predicted = float(
                simulate_trace(
                    requests, model=spec, hardware=hardware, config=config, seed=0
                ).summary.tpot_ms.p50
            )
            hit = spec.num_experts * (1.0 - (1.0 - spec.num_experts_per_token / spec.num_experts) ** batch)
            sim_moe_ms = hit * expert_bytes * spec.num_moe_layers * s_per_byte * 1e3
            op_us = measured_moe_us(case, batch)
            meas_moe_ms = None if op_us is None else spec.num_moe_layers * op_us / 1e3
            value, low, high = measured["value"], measured["ci_low"], measured["ci_high"]
            if value:
                ratios[batch_text] = predicted / value
                samples[batch_text] = (predicted, per_block)
            rows[batch_text] = {
                "blocks": len(per_block),
                "measured_tpot_p50_ms": measured,
                "predicted_tpot_p50_ms": round(predicted, 4),
                "predicted_over_measured": {
                    "value": round(predicted / value, 4) if value else None,
                    "ci_low": round(predicted / high, 4) if high else None,
                    "ci_high": round(predicted / low, 4) if low else None,
                },
                "moe_op_us_measured": None if op_us is None else round(op_us, 2),
                "moe_ms_per_step": {
                    "measured": None if meas_moe_ms is None else round(meas_moe_ms, 4),
                    "simulated": round(sim_moe_ms, 4),
                },
                "rest_ms_per_step": {
                    "measured": None
                    if meas_moe_ms is None or value is None
                    else round(value - meas_moe_ms, 4),
                    "simulated": round(predicted - sim_moe_ms, 4),
                },
            }
        cases[name] = {
            "model": shape,
            "moe_layers": spec.num_moe_layers,
            "batches": rows,
            "tpot_mape": mape_interval(samples),
            "over_limit": sorted((b for b, r in ratios.items() if abs(r - 1.0) > LIMIT), key=int),
        }
    return {"basis": basis, "cases": cases}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--result", type=Path, default=REPO / "benchmarks" / "results" / "kernels_e2e.json")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sim_moe_decode.json")
    args = parser.parse_args(argv)
    try:
        result = json.loads(args.result.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"sim_moe_decode: cannot read {args.result}: {exc}", file=sys.stderr)
        return 2
    scored = score(result)
    out = {
        "benchmark": "sim_moe_decode",
        "written_by": "benchmarks/sim_moe_decode.py",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "measured_in": {
            "file": str(args.result.relative_to(REPO))
            if args.result.is_relative_to(REPO)
            else str(args.result),
            "when": result.get("when"),
            "commit": result.get("commit"),
            "dirty": result.get("dirty"),
            "gpu": (result.get("machine") or {}).get("gpu"),
            "steady_decode": result["method"]["steady_decode"],
        },
        "method": {
            "arm": f"{ARM} (vLLM's generic fused-MoE configuration; the simulator does not model tables)",
            "held_out": "the simulator's H200 calibration was fitted on dense models only",
            "interval": "measured: blocks resampled, their requests pooled (95%); predicted/measured over its ends",
            "limit": LIMIT,
        },
        **scored,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, case in scored["cases"].items():
        for batch, r in case["batches"].items():
            print(
                f"{name} batch {batch}: measured {r['measured_tpot_p50_ms']['value']} ms, "
                f"predicted {r['predicted_tpot_p50_ms']} ms ({r['predicted_over_measured']['value']}x); "
                f"MoE {r['moe_ms_per_step']}, rest {r['rest_ms_per_step']}"
            )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
