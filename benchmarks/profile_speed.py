"""How fast, and in how much memory, `tailguard profile` reads a million-request trace.

Generates (in a temporary directory) a 1,000,000-request Mooncake trace and an Azure CSV of the
same size, both synthesized from the public samples in data/traces (so lengths, gaps and
prefix structure look like real traffic), then profiles each file in a fresh subprocess,
`--runs` times, the two files interleaved (A B A B ...). The subprocess reports its own peak RSS
(VmHWM: that run alone, the interpreter and numpy included), the wall and CPU time of the ingest
call and the load average. The summary gives each file's median wall time and median peak RSS
with 95% bootstrap intervals over the runs (`benchmarks/_stats.py`).

Targets on the 2-core development machine: <= 10 s and <= 400 MB per file (met when the
interval's upper end is within them).

    .venv/bin/python benchmarks/profile_speed.py            # writes benchmarks/results/profile_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts  # noqa: E402
from benchmarks._stats import interval  # noqa: E402
from tuning import __version__  # noqa: E402
from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl  # noqa: E402

TARGET_S = 10.0
TARGET_MB = 400.0
RUNS = 7

# Runs in a fresh interpreter: profile one file, report time and this process's peak RSS.
# Peak RSS is VmHWM from /proc, which belongs to the process's own address space. getrusage's
# ru_maxrss is not used: Linux carries the parent's high-water mark across fork+exec, so a
# child of this (large) generating process would report at least the parent's size.
_WORKER = """
import json, os, resource, sys, time

def peak_mb():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

from tuning.workload import ingest_path
def cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

baseline = peak_mb()
start, start_cpu = time.perf_counter(), cpu_s()
result = ingest_path(sys.argv[1], trace_format=sys.argv[2])
elapsed, used = time.perf_counter() - start, cpu_s() - start_cpu
print(json.dumps({"ingest_s": elapsed, "cpu_s": used, "peak_mb": peak_mb(), "baseline_mb": baseline,
                  "num_requests": result.profile.num_requests, "load_avg_1m": os.getloadavg()[0]}))
"""


def _make_mooncake(traces: Path, path: Path, requests: int, rng: np.random.Generator) -> None:
    sample = ingest_path(traces / "mooncake_synthetic.jsonl", keep_blocks=True)
    rate = 100.0
    trace = synthesize(sample, target_rps=rate, duration_s=requests / rate, rng=rng)
    with path.open("wb") as stream:
        write_mooncake_jsonl(trace, stream)


def _make_azure(traces: Path, path: Path, requests: int, rng: np.random.Generator) -> None:
    sample = ingest_path(traces / "azure2023_conv.csv")
    rate = 50.0
    trace = synthesize(sample, target_rps=rate, duration_s=requests / rate, rng=rng)
    # Azure clocks tick in 100 ns: spread each millisecond's arrivals over it, keep the order.
    ticks = np.sort(trace.arrival_ms * 10_000 + rng.integers(0, 10_000, trace.num_requests))
    start = np.datetime64("2023-11-16T18:15:46.6805900", "ns")
    stamps = np.datetime_as_string(start + ticks * 100, unit="ns")
    with path.open("w", encoding="utf-8", newline="") as stream:
        stream.write("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        inputs, outputs = trace.input_tokens.tolist(), trace.output_tokens.tolist()
        batch: list[str] = []
        for i, stamp in enumerate(stamps.tolist()):
            batch.append(f"{stamp[:10]} {stamp[11:27]},{inputs[i]},{outputs[i]}\r\n")
            if len(batch) == 65_536:
                stream.write("".join(batch))
                batch.clear()
        stream.write("".join(batch))


def _measure(path: Path, trace_format: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(path), trace_format],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=600,
    )
    run: dict[str, Any] = json.loads(done.stdout)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=20231116)
    parser.add_argument(
        "--runs", type=int, default=RUNS, help="profiling runs per file (fastest is reported)"
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=Path(os.environ.get("TAILGUARD_TRACES_DIR", REPO / "data" / "traces")),
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "profile_speed.json")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    if not 1 <= args.runs <= 50:
        parser.error("--runs must be between 1 and 50")
    cases: list[dict[str, Any]] = []
    summary: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-") as tmp:
        files = {
            "mooncake": (Path(tmp) / "mooncake_1m.jsonl", _make_mooncake),
            "azure": (Path(tmp) / "azure_1m.csv", _make_azure),
        }
        for path, make in files.values():
            make(args.traces, path, args.requests, rng)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in files}
        for i in range(args.runs):
            # Interleaved, the order alternating by round: drift in the machine's load falls on both.
            order = list(files) if i % 2 == 0 else list(reversed(files))
            for name in order:
                runs[name].append(_measure(files[name][0], name))
        for name, (path, _) in files.items():
            wall = interval([r["ingest_s"] for r in runs[name]], digits=3)
            peak = interval([r["peak_mb"] for r in runs[name]], digits=1)
            peak_max = max(r["peak_mb"] for r in runs[name])
            wall_high = wall["ci_high"] if wall["ci_high"] is not None else wall["value"]
            cases.append(
                {
                    "name": f"{name}_1m",
                    "format": name,
                    "requests": runs[name][0]["num_requests"],
                    "file_mb": round(path.stat().st_size / 2**20, 1),
                    "ingest_s_median": wall,
                    "ingest_s_min_of_runs": round(min(r["ingest_s"] for r in runs[name]), 3),
                    "cpu_s_median": interval([r["cpu_s"] for r in runs[name]], digits=3),
                    "peak_rss_mb_median": peak,
                    "peak_rss_mb_max_of_runs": round(peak_max, 1),
                    "interpreter_and_imports_mb": round(runs[name][0]["baseline_mb"], 1),
                    "runs": [{k: round(v, 3) for k, v in run.items()} for run in runs[name]],
                    "target_s": TARGET_S,
                    "target_mb": TARGET_MB,
                    "meets_targets": wall_high is not None
                    and wall_high <= TARGET_S
                    and peak_max <= TARGET_MB,
                }
            )
            for key, fig in (("s", wall), ("peak_mb", peak)):
                summary[f"{name}_1m_{key}"] = fig["value"]
                summary[f"{name}_1m_{key}_ci_low"] = fig["ci_low"]
                summary[f"{name}_1m_{key}_ci_high"] = fig["ci_high"]
            print(
                f"{name}: median {wall['value']} s (95% {wall['ci_low']}-{wall['ci_high']}), "
                f"{peak['value']} MB peak RSS, {path.stat().st_size / 2**20:.0f} MiB file"
            )
        summary["runs_per_file"] = args.runs
    result = {
        "machine": machine_facts(),
        **git_state(REPO),
        "date": datetime.now(UTC).date().isoformat(),
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "tailguard": __version__},
        "command": "python benchmarks/profile_speed.py"
        + (f" --runs {args.runs}" if args.runs != RUNS else ""),
        "summary": summary,
        "cases": cases,
        "notes": "Traces synthesized (tuning.workload.synthesize) from data/traces: Mooncake FAST'25 "
        "synthetic trace (kvcache-ai/Mooncake, Apache-2.0) and Azure LLM inference trace 2023 conversation "
        "(Azure/AzurePublicDataset, CC-BY 4.0). Wall time is the ingest call in a fresh process, peak RSS "
        f"that process's VmHWM; medians of {args.runs} interleaved runs per file with 95% bootstrap intervals "
        "over the runs (fastest run, CPU time and the largest peak in cases). Load average per run in cases.",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
