"""How fast the simulator replays 10,000 requests (issue 21's `sim_10k_requests_s`, target <= 0.5 s),
side by side with an earlier tree.

The workload is `sim_accuracy.sim_speed`'s: the Azure conversation trace's first 10,000 requests
at their own arrivals, the tiny model on `local-cpu` with a 1 GiB KV cache, context 4,096,
prompts up to 2,000 and outputs up to 128 tokens. Arms, each timing in a fresh process (so one
arm's warm caches never serve another), interleaved in rotated order over `--repeats` rounds:
- `current`: this tree's simulator;
- `baseline`: the simulator of `--baseline-tree` (a worktree of an earlier commit), if given.
Every arm must give the same answer (a digest of every request's TTFT and end-to-end time and
the step count): a run whose arms disagree reports no speed.

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/sim_speed.py --baseline-tree /tmp/base
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
MODEL = "tiny-llama-s"
REQUESTS = 10_000
MAX_REPEATS = 30
TARGET_S = 0.5
WORKER_TIMEOUT_S = 300


def one_timing(tree: Path, arm: str) -> dict[str, Any]:
    """Runs in the worker process: the simulator of `tree`, timed once (after the trace is read)."""
    sys.path.insert(0, str(tree))
    from serving.engine import EngineConfig
    from serving.loadgen.traces import read_trace
    from serving.sim.api import simulate_trace

    requests = read_trace(TRACE, max_requests=REQUESTS)
    config = EngineConfig.cpu_default(max_model_len=4096, cpu_kv_cache_space_gib=1)
    start = time.perf_counter()
    result = simulate_trace(
        requests,
        model=MODEL,
        hardware="local-cpu",
        config=config,
        max_prompt_tokens=2000,
        max_output_tokens=128,
    )
    seconds = time.perf_counter() - start
    answer = repr([(r.ttft_ms, r.e2e_ms) for r in result.requests]) + f"|{result.num_steps}"
    return {
        "seconds": seconds,
        "digest": hashlib.sha256(answer.encode()).hexdigest()[:16],
        "steps": result.num_steps,
    }


def timed(tree: Path, arm: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--one", arm, "--tree", str(tree)],
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"sim_speed: the {arm} timing failed: {done.stderr.strip()[-1000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help=f"rounds of every arm, 2-{MAX_REPEATS}")
    parser.add_argument("--baseline-tree", type=Path, help="a worktree of an earlier commit to compare with")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sim_speed.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a worker: one timing of this arm
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_timing(args.tree, args.one)))
        return 0
    if not 2 <= args.repeats <= MAX_REPEATS:
        parser.error(f"--repeats must be in [2, {MAX_REPEATS}]")
    if args.baseline_tree is not None and not (args.baseline_tree / "serving" / "sim").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree} holds no serving/sim")

    sys.path.insert(0, str(REPO))
    from benchmarks._machine import git_state, machine_facts, versions
    from benchmarks._stats import interval, ratio_interval, summary_figures
    from serving.engine.host import ForeignLoadMeter

    trees = {"current": REPO}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    arms = list(trees)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    meter = ForeignLoadMeter().start()
    for round_ in range(args.repeats):
        order = arms[round_ % len(arms) :] + arms[: round_ % len(arms)]  # rotated: no arm always first
        for arm in order:
            runs[arm].append(timed(trees[arm], arm))
    foreign = meter.stop().to_dict()
    digests = {arm: {r["digest"] for r in rows} for arm, rows in runs.items()}
    if len(set().union(*digests.values())) != 1:
        print(f"sim_speed: the arms disagree ({digests}); no speed is reported", file=sys.stderr)
        return 1
    times = {arm: [r["seconds"] for r in rows] for arm, rows in runs.items()}
    figures = {"sim_10k_requests_s": interval(times["current"])}
    if "baseline" in times:
        figures["sim_10k_requests_s_baseline"] = interval(times["baseline"])
        figures["speedup_vs_baseline"] = ratio_interval(times["baseline"], times["current"])
    summary: dict[str, Any] = summary_figures(figures)
    high = summary["sim_10k_requests_s_ci_high"]
    summary.update(
        target_s=TARGET_S,
        target_met=high is not None and high <= TARGET_S,  # the interval's upper end within it
        simulated_steps=runs["current"][0]["steps"],
    )
    baseline_state = git_state(args.baseline_tree) if args.baseline_tree is not None else None
    out = {
        "benchmark": "sim_speed",
        "written_by": "benchmarks/sim_speed.py",
        "command": " ".join(["python", *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "baseline": baseline_state,
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "foreign_load": foreign,
        "method": {
            "workload": f"{TRACE.name}, first {REQUESTS} requests at their own arrivals, {MODEL} on local-cpu, "
            "1 GiB KV cache, context 4096, prompts <= 2000 and outputs <= 128 tokens "
            "(benchmarks/sim_accuracy.py's sim_speed)",
            "arms": arms,
            "repeats": args.repeats,
            "order": "interleaved, rotated by round; each timing in a fresh process, the trace read before the clock",
            "interval": "95% bootstrap: medians over the repeats; speedups over rounds resampled in pairs",
            "same_answer": "checked: every arm's digest of each request's TTFT and end-to-end time and the steps",
        },
        "summary": summary,
        "times_s": times,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
