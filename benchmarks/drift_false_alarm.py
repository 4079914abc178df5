"""How often the continual loop would call drift on traffic that did not drift.

The loop compares a window of live traffic (the engine's scraped histograms) with the workload
the running configuration was tuned on (`tuning.continual`). Here both sides come from the same
public trace, through the same code the loop runs:

- **random halves**: a stretch of the trace at a random offset (long enough for the evidence
  floor twice over) has its requests split at random (seeded) into A and B; A is the tuned-for
  workload, B (as 15 s scrape windows bucketed into vLLM's histogram bounds) the live window.
  Both halves are draws of one workload at one time, so every alarm is a false alarm.
- **first half vs later windows**: the first half of the trace is the tuned-for workload, windows
  taken at successive offsets of the second half the live traffic (what the loop compares: a
  whole sample against a live window). A real trace is not stationary, so these alarms include
  real within-trace changes: an upper bound on false alarms.

Each is run at the old evidence floor (30 requests, 60 s) and at the loop's defaults
(`LOOP_MIN_LIVE_REQUESTS`, `LOOP_MIN_LIVE_SPAN_S`). Rates carry Wilson 95% intervals.
CPU only (no engine); seconds to run.

    .venv/bin/python benchmarks/drift_false_alarm.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from serving.engine.host import ForeignLoadMeter  # noqa: E402
from tuning.continual import LiveWindow, bucketed, detect_drift, live_profile, tuned_for_profile  # noqa: E402
from tuning.workload import ingest_path  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "drift_false_alarm.json"
TRACES = {"azure_conv": "azure2023_conv.csv", "mooncake": "mooncake_synthetic.jsonl"}
# vLLM's request_prompt_tokens / request_generation_tokens histogram bounds (what live windows carry)
BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, math.inf)
SCRAPE_S = 15.0
FLOORS = {"old (30 requests, 60 s)": (30, 60), "default (200 requests, 600 s)": (200, 600)}


def wilson(k: int, n: int) -> tuple[float | None, float | None]:
    if n == 0:
        return (None, None)
    z = 1.96
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _tuned_for(cols: Any, idx: np.ndarray, work: Path) -> Any:
    t0 = int(cols.arrival_ns[idx[0]])
    path = work / "tuned.jsonl"
    with path.open("w") as fh:
        for i in idx:
            fh.write(
                json.dumps(
                    {
                        "timestamp": (int(cols.arrival_ns[i]) - t0) / 1e6,
                        "input_length": int(cols.input_tokens[i]),
                        "output_length": int(cols.output_tokens[i]),
                    }
                )
                + "\n"
            )
    hit = None
    if cols.prefix_hit_tokens is not None:
        hit = float(cols.prefix_hit_tokens[idx].sum() / max(1, cols.input_tokens[idx].sum()))
    return tuned_for_profile(
        path,
        prompt_bounds=BOUNDS,
        output_bounds=BOUNDS,
        max_prompt_tokens=None,
        max_output_tokens=None,
        prefix_hit_rate=hit,
    )


def _live(cols: Any, idx: np.ndarray, min_requests: int, min_span_s: float) -> list[LiveWindow] | None:
    """Scrape windows over `idx` (in arrival order) from its first request until the evidence
    floor is met; None when the requests run out first."""
    start = int(cols.arrival_ns[idx[0]])
    windows: list[LiveWindow] = []
    seen, k = 0, 0
    while True:
        end = start + int((len(windows) + 1) * SCRAPE_S * 1e9)
        j = k
        while j < idx.size and cols.arrival_ns[idx[j]] < end:
            j += 1
        chunk = idx[k:j]
        k = j
        prompts = cols.input_tokens[chunk].astype(np.float64)
        queries = float(prompts.sum())
        hits = float(cols.prefix_hit_tokens[chunk].sum()) if cols.prefix_hit_tokens is not None else 0.0
        windows.append(
            LiveWindow(
                interval_s=SCRAPE_S,
                num_requests=float(chunk.size),
                prompt_tokens=bucketed(prompts, BOUNDS),
                output_tokens=bucketed(cols.output_tokens[chunk].astype(np.float64), BOUNDS),
                prefix_queries_tokens=queries if cols.prefix_hit_tokens is not None else 0.0,
                prefix_hits_tokens=hits,
            )
        )
        seen += chunk.size
        if seen >= min_requests and len(windows) * SCRAPE_S >= min_span_s:
            return windows
        if k >= idx.size:
            return None


def _check(cols: Any, tuned_idx: np.ndarray, live_idx: np.ndarray, floor: tuple[int, int], work: Path) -> Any:
    windows = _live(cols, live_idx, *floor)
    if windows is None:
        return None
    live = live_profile(windows)
    if live is None:
        return None
    report = detect_drift(_tuned_for(cols, tuned_idx, work), live)
    return [d.dimension for d in report.dimensions if d.drifted]


def _case(
    trace: str, split: str, floor_name: str, outcomes: list[list[str] | None], alarms_key: str
) -> dict[str, Any]:
    """One row of the result: checks that had enough evidence, how many alarmed, on what."""
    done = [o for o in outcomes if o is not None]
    alarms = sum(1 for o in done if o)
    dims: dict[str, int] = {}
    for out in done:
        for d in out:
            dims[d] = dims.get(d, 0) + 1
    low, high = wilson(alarms, len(done))
    return {
        "trace": trace,
        "split": split,
        "evidence": floor_name,
        "checks": len(done),
        alarms_key: alarms,
        "rate": alarms / len(done) if done else None,
        "rate_ci_low": low,
        "rate_ci_high": high,
        "dimensions": dims,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=40, help="random splits per trace")
    parser.add_argument("--offsets", type=int, default=20, help="later windows per trace")
    parser.add_argument("--traces-dir", type=Path, default=REPO / "data" / "traces")
    args = parser.parse_args()
    started = time.monotonic()
    meter = ForeignLoadMeter().start()
    work = Path(tempfile.mkdtemp(prefix="tailguard-drift-fa-"))
    cases = []
    for name, file in TRACES.items():
        cols = ingest_path(args.traces_dir / file).columns
        n = cols.num_requests
        order = np.argsort(cols.arrival_ns, kind="stable")
        for floor_name, floor in FLOORS.items():
            outcomes = []
            arrivals = cols.arrival_ns[order]
            for seed in range(args.seeds):
                # One stretch of the trace long enough for the floor twice over, its requests
                # split at random: A is the tuned-for workload, B the live traffic.
                rng = np.random.default_rng(seed)
                start = int(rng.integers(0, n))
                need_ns = arrivals[start] + int(1.2 * floor[1] * 1e9)
                end = int(np.searchsorted(arrivals, need_ns))
                end = max(end, start + int(2.4 * floor[0]))
                if end >= n:
                    continue
                stretch = order[start:end]
                mask = rng.random(stretch.size) < 0.5
                outcomes.append(_check(cols, stretch[mask], stretch[~mask], floor, work))
            cases.append(_case(name, "random halves", floor_name, outcomes, "false_alarms"))
            half = n // 2
            first, second = order[:half], order[half:]
            span = max(1, second.size - 1)
            outcomes = []
            for o in range(args.offsets):
                live = second[(o * span) // args.offsets :]
                outcomes.append(_check(cols, first, live, floor, work) if live.size > 1 else None)
            case = _case(name, "first half vs later windows", floor_name, outcomes, "alarms")
            case["note"] = "upper bound on false alarms: a real trace is not perfectly stationary"
            cases.append(case)
    load = meter.stop()
    random = [c for c in cases if c["split"] == "random halves" and c["evidence"].startswith("default")]
    k = sum(c["false_alarms"] for c in random)
    m = sum(c["checks"] for c in random)
    old = [c for c in cases if c["split"] == "random halves" and c["evidence"].startswith("old")]
    k_old, m_old = sum(c["false_alarms"] for c in old), sum(c["checks"] for c in old)
    low, high = wilson(k, m)
    low_old, high_old = wilson(k_old, m_old)
    out = {
        "machine": machine_facts(),
        "date": f"{datetime.now(UTC):%Y-%m-%d}",
        **git_state(REPO),
        "versions": versions("numpy"),
        "command": "python benchmarks/drift_false_alarm.py " + " ".join(sys.argv[1:]),
        "foreign_load": load.to_dict(),
        "wall_s": round(time.monotonic() - started, 1),
        "repeats": {"seeds": args.seeds, "offsets": args.offsets},
        "summary": {
            "false_alarm_rate": k / m if m else None,
            "false_alarm_rate_ci_low": low,
            "false_alarm_rate_ci_high": high,
            "false_alarm_rate_old_floor": k_old / m_old if m_old else None,
            "false_alarm_rate_old_floor_ci_low": low_old,
            "false_alarm_rate_old_floor_ci_high": high_old,
            "checks": m,
        },
        "cases": cases,
    }
    RESULTS.write_text(json.dumps(out, indent=1, allow_nan=False, default=str) + "\n")
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
