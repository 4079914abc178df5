"""Write the workload profiles of the two shared traces that the kernel benchmark tunes for.

The device machine that runs the benchmark sees only the repository, not data/traces, so
the profiles travel as small JSON files in benchmarks/kernels/profiles/. They hold the fields of
the `tailguard profile TRACE --json` contract (DESIGN.md) that the kernel bucket model reads:
length percentiles (numpy's linear method) and arrival rates.

    python benchmarks/kernels/make_profiles.py [TRACES_DIR]
"""

from __future__ import annotations

import csv
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _stats(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean())}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = float(np.percentile(values, q))
    out["max"] = float(values.max())
    return out


def _profile(
    arrivals_s: np.ndarray, inputs: np.ndarray, outputs: np.ndarray, source: str
) -> dict[str, object]:
    arrivals_s = np.sort(arrivals_s - arrivals_s.min())
    duration = float(arrivals_s[-1])
    windows = np.floor(arrivals_s / 60.0).astype(np.int64)
    gaps = np.diff(arrivals_s)
    return {
        "source": source,
        "num_requests": len(inputs),
        "duration_s": duration,
        "input_tokens": _stats(inputs),
        "output_tokens": _stats(outputs),
        "arrival": {
            "mean_rps": len(inputs) / duration if duration > 0 else 0.0,
            "peak_rps_60s": float(np.bincount(windows).max()) / 60.0,
            "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else 0.0,
        },
    }


def azure(path: Path) -> dict[str, object]:
    times, ins, outs = [], [], []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for row in csv.DictReader(fh):
            stamp, frac = row["TIMESTAMP"].split(".")
            base = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            times.append(base.timestamp() + float("0." + frac))
            ins.append(int(row["ContextTokens"]))
            outs.append(int(row["GeneratedTokens"]))
    return _profile(np.array(times), np.array(ins, float), np.array(outs, float), path.name)


def mooncake(path: Path) -> dict[str, object]:
    times, ins, outs = [], [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                times.append(rec["timestamp"] / 1000.0)
                ins.append(rec["input_length"])
                outs.append(rec["output_length"])
    return _profile(np.array(times, float), np.array(ins, float), np.array(outs, float), path.name)


def main() -> None:
    traces = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "data" / "traces"
    out_dir = HERE / "profiles"
    out_dir.mkdir(exist_ok=True)
    for name, fn in (("azure2023_conv.csv", azure), ("mooncake_synthetic.jsonl", mooncake)):
        profile = fn(traces / name)
        (out_dir / (name.split(".")[0] + ".json")).write_text(json.dumps(profile, indent=2) + "\n")
        print(name, json.dumps(profile))


if __name__ == "__main__":
    main()
