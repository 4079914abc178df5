"""How fast the simulator replays 10,000 requests, with and without decode jumps past a waiting
queue whose head is refused for KV space (issue 21's `sim_10k_requests_s`, target <= 0.5 s).

The workload is `sim_accuracy.sim_speed`'s: the Azure conversation trace's first 10,000 requests
at their own arrivals, the tiny model on `local-cpu` with a 1 GiB KV cache, prompts up to 2,000
tokens. The two arms are the simulator as it is (`jumps`) and the same code with the waiting-head
test answering "could be admitted" (`steps`: every step of a KV-blocked stretch simulated one by
one, what the simulator did before), interleaved A B A B over `--repeats` rounds in one process.
Both must give the same result (the run refuses to report a speed for a different answer): the
same steps, and every request's TTFT and end-to-end time within 1e-9 relative.

    .venv/bin/python benchmarks/sim_speed.py       # writes benchmarks/results/sim_speed.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._stats import interval, ratio_interval  # noqa: E402
from serving.engine import EngineConfig  # noqa: E402
from serving.engine.host import ForeignLoadMeter  # noqa: E402
from serving.loadgen.traces import read_trace  # noqa: E402
from serving.sim import simulator  # noqa: E402
from serving.sim.api import simulate_trace  # noqa: E402

TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
MODEL = "tiny-llama-s"
REQUESTS = 10_000
MAX_REPEATS = 30
TARGET_S = 0.5


def replay(requests: list[Any]) -> Any:
    config = EngineConfig.cpu_default(max_model_len=4096, cpu_kv_cache_space_gib=1)
    return simulate_trace(
        requests,
        model=MODEL,
        hardware="local-cpu",
        config=config,
        max_prompt_tokens=2000,
        max_output_tokens=128,
    )


def timed(requests: list[Any], arm: str) -> tuple[float, Any]:
    patch: contextlib.AbstractContextManager[Any] = (
        mock.patch.object(simulator._Loop, "_head_blocked", lambda self, n: None)
        if arm == "steps"
        else contextlib.nullcontext()
    )
    with patch:
        start = time.perf_counter()
        result = replay(requests)
        return time.perf_counter() - start, result


def same_answer(a: Any, b: Any) -> str | None:
    """None when both results agree; else what differs."""
    if a.num_steps != b.num_steps:
        return f"steps {a.num_steps} against {b.num_steps}"
    for x, y in zip(a.requests, b.requests, strict=True):
        for name in ("ttft_ms", "e2e_ms"):
            u, v = getattr(x, name), getattr(y, name)
            if (u is None) != (v is None) or (u is not None and abs(u - v) > 1e-9 * max(1.0, abs(v))):
                return f"{name} {u} against {v}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help=f"rounds of both arms, 2-{MAX_REPEATS}")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sim_speed.json")
    args = parser.parse_args(argv)
    if not 2 <= args.repeats <= MAX_REPEATS:
        parser.error(f"--repeats must be in [2, {MAX_REPEATS}]")
    requests = read_trace(TRACE, max_requests=REQUESTS)
    meter = ForeignLoadMeter().start()
    times: dict[str, list[float]] = {"jumps": [], "steps": []}
    results: dict[str, Any] = {}
    for round_ in range(args.repeats):
        for arm in ("jumps", "steps") if round_ % 2 == 0 else ("steps", "jumps"):
            seconds, results[arm] = timed(requests, arm)
            times[arm].append(seconds)
    foreign = meter.stop().to_dict()
    differs = same_answer(results["jumps"], results["steps"])
    if differs is not None:
        print(f"sim_speed: the two arms disagree ({differs}); no speed is reported", file=sys.stderr)
        return 1
    summary = {
        "sim_10k_requests_s": interval(times["jumps"]),
        "sim_10k_requests_s_steps": interval(times["steps"]),
        "speedup": ratio_interval(times["steps"], times["jumps"]),
        "target_s": TARGET_S,
        "simulated_steps": results["jumps"].num_steps,
    }
    high = summary["sim_10k_requests_s"]["ci_high"]
    summary["target_met"] = high is not None and high <= TARGET_S
    out = {
        "benchmark": "sim_speed",
        "written_by": "benchmarks/sim_speed.py",
        "command": " ".join(["python", *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "foreign_load": foreign,
        "method": {
            "workload": f"{TRACE.name}, first {REQUESTS} requests at their own arrivals, {MODEL} on local-cpu, "
            "1 GiB KV cache, context 4096, prompts <= 2000 and outputs <= 128 tokens "
            "(benchmarks/sim_accuracy.py's sim_speed)",
            "arms": "jumps: the simulator as it is; steps: a KV-blocked waiting head never jumped over",
            "repeats": args.repeats,
            "order": "interleaved, the first arm alternating by round",
            "interval": "95% bootstrap: medians over the repeats; the speedup over rounds resampled in pairs",
            "same_answer": "checked: equal steps, every request's TTFT and end-to-end within 1e-9 relative",
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
