"""The simulator against live vLLM runs on the H200, and the engine overheads fitted to them.

`benchmarks/gpu_tuning.py` measured vLLM 0.26 on the project's H200 (Llama-3.1-8B and Qwen3-32B
shapes, random weights, bf16): a knee probe per trace (vLLM's defaults at rising rates, p50/p95
TTFT) and the trials of a tuning job (p50/p95 TTFT, p50 TPOT). This script needs no GPU and no
engine: it re-creates each measured run's traffic exactly as that script synthesised it (same sample,
`tuning.workload.synthesize` with the same rate, duration and seed, the same length caps), predicts
it with the simulator for hardware `h200`, and scores the prediction.

The H200 operator calibration (`serving/perf/data/h200.json`) measured GEMM and attention in
isolation; the costs around them were priors: the engine's own per step (scheduling, input
preparation, the sampler, CUDA-graph replay or piecewise launches), per scheduled sequence and
per scheduled token (norms, activations, rotary), and outside the engine loop the client-visible
cost of a request (HTTP), its cost per prompt token before it reaches the engine (tokenizing, the
hand-off to the engine core) and the frontend's delay per other request streaming when one is
sent (one API-server process tokenizes, detokenizes and streams for all). The cost per prompt
token is measured outright from the FIT set's single requests (the client's TTFT less the engine's
own queue and prefill time, its slope over prompt length; `frontend_token_cost`); the others are
fitted here, and only here, around it (`--fields` picks which; naming
`prompt_token_overhead_ms` there fits it instead):

- FIT set: the azure_conv knee probe of each shape (vLLM defaults at rising rates: 14 rates of
  the 8B, 7 of the 32B), on p50 and p95 TTFT; and single requests of the 8B at five prompt lengths
  on the H100 (`benchmarks/sim_gpu_isolated.py`), on p50 TTFT and TPOT and the engine's own mean
  prefill time;
- HELD-OUT set: the mooncake knee probes and every trial of every result file (another trace,
  tuned configurations, repeated rounds), on p50/p95 TTFT and p50 TPOT (no loaded TPOT enters the
  fit); and the 3B's single requests (a model size no FIT run served).

The calibration stored before the run (fitted on the 8B's knee alone) is scored on the same runs
beside the new fit (`previous`), and the held-out error is reported per shape.

The fit minimises the mean squared log error of the FIT set's TTFTs over the logarithms of the
six costs within physical bounds: the priors and a two-level grid are scored, and a compass
search refines the best two (TTFTs alone can be explained by a slow engine step or by a slow
frontend; a search from the priors alone stopped in the first, which the grid's start beat on the
FIT set). Six fitted physical parameters (and one measured) for 57 numbers, no per-point terms.
The step model does not distinguish CUDA-graph modes (a full-graph decode step and a piecewise mixed step share one fixed
cost), so the held-out trials with `cudagraph_mode` set show whether that matters.

    .venv/bin/python benchmarks/sim_gpu_fit.py                      # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/sim_gpu_fit.py --write-calibration  # also stores the fit

writes benchmarks/results/sim_gpu_fit.json; `--write-calibration` writes the fitted overheads with
their provenance to serving/perf/data/h200_live.json, which the step model then applies to every
h200 prediction (and says so in its basis).
"""

from __future__ import annotations

import argparse
import dataclasses
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
from benchmarks.gpu_tuning import (  # noqa: E402
    DEFAULT_LADDER_START,
    LADDER,
    TRACES,
    TRACES_DIR,
    knee_probe_duration_s,
)
from serving.catalog.models import ModelSpec, get_model  # noqa: E402
from serving.engine.config import EngineConfig  # noqa: E402
from serving.loadgen.traces import TraceRequest, read_trace  # noqa: E402
from serving.perf.model import DATA_DIR, LIVE_FIT_FIELDS, Efficiency, load_efficiency  # noqa: E402
from serving.sim.api import simulate_trace  # noqa: E402
from tuning.workload import ingest_path, synthesize, write_mooncake_jsonl  # noqa: E402
from tuning.workload.synth import scale_lengths  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# Every live GPU run recorded by gpu_tuning.py (paths under benchmarks/results/); each names the
# model shape it served.
SOURCES = (
    "gpu_tuning.json",
    "gpu_tuning_azure_conv.json",
    "gpu_tuning_mooncake.json",
    "gpu_tuning_qwen3_32b_azure_conv.json",
    "gpu_tuning_qwen3_32b_mooncake.json",
    "gpu_tuning_logs/session6_partial_five_request_knee_qwen3_mooncake.json",
)
# Where a file's `method.duration_s` is not what its trials replayed: that job's workload was
# planned by a command run with --duration-s 60 (gpu_tuning_logs/session6_command1_qwen3_mooncake.txt)
# and the next command, run with 90, reused the planned files while recording 90 (gpu_tuning.py
# now refuses a --duration-s that differs from the planned one).
TRIAL_DURATION_S = {"gpu_tuning_logs/session6_partial_five_request_knee_qwen3_mooncake.json": 60.0}
# The FIT set: the Azure-conversation knee probe (vLLM's defaults at rising rates) of each model
# shape; everything else (the Mooncake probes, every trial) is held out.
FIT_SET = frozenset(
    {("gpu_tuning.json", "azure_conv"), ("gpu_tuning_qwen3_32b_azure_conv.json", "azure_conv")}
)
HARDWARE = "h200"
FIGURES = ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "engine_prefill_ms")
FIT_FIGURES = ("ttft_p50_ms", "ttft_p95_ms")  # what the knee probe measured
# Single requests of rising prompt length, each alone on a fresh engine with vLLM's defaults
# (benchmarks/sim_gpu_isolated.py, on the H100): what a step costs without queueing or batching.
# The 8B's are in the FIT set (p50 TTFT, TPOT and the engine's prefill: they tell a cost in the engine's steps from one
# before the engine, and a slow step from a slow frontend, which the knees' TTFTs cannot); the
# 3B's are held out (its model size is in no FIT run).
ISOLATED_FIT = ("sim_gpu_isolated_8b_live.json",)
ISOLATED_HELD_OUT = ("sim_gpu_isolated_3b_live.json",)
# The engine's own mean prefill time (its /metrics) is what tells a cost in the engine's steps from
# one before the engine: the client's TTFT holds both alike.
ISOLATED_FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "engine_prefill_ms")
# A probe's duration, where its file does not record it, is inferred from its counts.
KNEE_DURATIONS_S = (10.0, 15.0, 20.0, 30.0, 40.0, 60.0)
TRIAL_SEED = 0  # gpu_tuning.py's --seed default, which the recorded runs used
ERROR_LIMIT = 0.25  # issue 26: an end-to-end error above this must be fixed
# Bounds of the fitted costs (ms): wide, but physical (no step costs seconds, no token a ms).
BOUNDS: dict[str, tuple[float, float]] = {
    "request_overhead_ms": (0.5, 60.0),
    "step_overhead_ms": (0.1, 30.0),
    "seq_overhead_ms": (1e-4, 0.5),
    "token_overhead_ms": (1e-5, 0.05),
    "stream_overhead_ms": (1e-4, 2.0),
    "prompt_token_overhead_ms": (1e-5, 0.05),
    "token_compute_share": (1e-3, 2.0),  # a share, not ms: of a token's linear-layer compute time
}
# The costs fitted by default: every engine overhead. Two were added on 2026-12-06. The
# per-prompt-token cost before the engine (one frontend reading prompts in turn), when single
# requests (ISOLATED_FIT) showed the engine's own prefill growing 17.5 (3B) and 27.9 (8B) ms per 1k
# prompt tokens against the step model's 22.7 and 32.0 with its constant per-scheduled-token step
# cost (benchmarks/results/sim_gpu_isolated_*_token_overhead_in_step.json); the fit set it near
# zero (sim_gpu_fit_constant_token_cost.json). Then the per-token step cost that grows with the
# model (`token_compute_share`), when a 1B run recorded after that fit was queued 10-40x too long
# by the constant cost fitted on the 8B and 32B (sim_rank_gpu_1b_mooncake_past_knee.json): given
# both, the fit put the per-token time in the share (0.30 of a token's linear-layer compute) and
# next to none in the constant. The 1B run thus chose this form; no value was fitted on it.
# A fourth (2026-12-06, evening), after the Qwen3-4B run (sim_rank_gpu_4b_mooncake_past_knee.json)
# had p50 TTFT 14-36% low on every configuration: the single requests already in the FIT set hold
# the frontend's time per prompt token outright (the client's TTFT less the engine's own queue and
# prefill grows 6.0 ms per 1k prompt tokens on the 8B and on the held-out 3B, sim_gpu_fit.json
# `frontend_token_cost`: tokenizing and carrying the prompt, the same for any model), which the
# loss fit had traded against the engine's step costs (it set 0.0002 ms). That cost is now measured from them (`frontend_token_cost`), not
# fitted; the other six are fitted around it.
MEASURED_FIELDS = ("prompt_token_overhead_ms",)
# A fifth (2026-12-07): the step model's form, not a cost, given to the fit (`--attention-split`)
# and stored with it. A step that mixes prompt chunks with decodes had its attention costed at
# one roofline over the whole step, so the chunks' compute hid the decodes' KV reads (or the
# reverse); with `attention_split` 1 each side is costed at its own roofline and the two summed.
# Chosen after the 1.7B H100 run (sim_rank_gpu_1p7b_mooncake.json: p50 TTFT 38-75% low, TPOT
# 91 ms against 71 predicted at vLLM's defaults) and before the run recorded after this fit.
FORM_FIELDS = ("attention_split",)
DEFAULT_FIELDS = tuple(f for f in LIVE_FIT_FIELDS if f not in MEASURED_FIELDS and f not in FORM_FIELDS)
# Said in every result: the model was revised once after its held-out scores were seen.
FIRST_ATTEMPT = (
    "a first fit (four step-model costs without the frontend's per-stream delay, compass search "
    "from the priors alone) reached FIT loss 0.0169 (FIT MAPE p50 TTFT 0.12, p95 0.10) with "
    "0.133 ms per sequence per step, and made the held-out set worse (p50 TTFT 1.03, p95 1.24, "
    "p50 TPOT 1.05: a per-sequence cost of a slow engine that the trials' TPOT refutes); the "
    "frontend's per-stream delay, already a field of the step model (measured on CPUs), and the "
    "multi-start search were then added. The held-out set thus chose the model's form once; no "
    "value was fitted on it. A second revision (2026-12-06), after the H100 past-knee run "
    "(sim_rank_gpu_mooncake_past_knee.json) showed p50 TPOT 2-4x the measured at token budgets of "
    "8,192 and more: single requests on the H100 (sim_gpu_isolated_*_live.json) put the fitted "
    "per-scheduled-token step cost (0.006866 ms) partly outside the engine's prefill: a per-prompt-"
    "token cost before the engine was offered to the fit (which set it near zero), and the 8B's single "
    "requests joined the FIT set (their TPOT and the engine's prefill time with them); the 3B's, and "
    "every run scored before, stay held out. A third (the same day), after a llama-3.2-1b run recorded "
    "after the second fit (sim_rank_gpu_1b_mooncake_past_knee.json) had p50 TTFT MAPE 5.6: a per-token "
    "step cost that grows with the model's compute was offered beside the constant one, and the fit "
    "chose it. A fourth (the same evening), after a qwen3-4b run recorded after the third fit "
    "(sim_rank_gpu_4b_mooncake_past_knee.json) had p50 TTFT 14-36% low on every configuration: the "
    "frontend's time per prompt token, which the FIT set's single requests hold outright, is measured "
    "from them and no longer fitted (the third fit had traded it, at 0.0002 ms, against the engine's "
    "step costs); the rest are fitted around it. The 4B run thus chose this form; no value was fitted on it"
)
LIVE_FILE = DATA_DIR / f"{HARDWARE}_live.json"


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured run, re-created: its traffic, configuration and measured figures."""

    source: str  # result file it was read from
    model: str  # the model shape it served (the file's `model`)
    case: str  # the trace's name in that file
    kind: str  # "knee" (a knee-probe rate) or "trial" (a tuning job's trial)
    label: str  # the rate, or the trial's number, phase and configuration
    rate_rps: float
    requests: tuple[TraceRequest, ...] = dataclasses.field(repr=False)
    config: EngineConfig
    max_prompt_tokens: int
    max_output_tokens: int
    seed: int
    measured: dict[str, float]  # figure -> value, where measured
    workload_key: str  # runs with the same key replay the same requests
    hardware: str = HARDWARE  # the catalog hardware it ran on

    @property
    def fit(self) -> bool:
        if self.kind == "isolated":
            return self.source in ISOLATED_FIT
        return (self.source, self.case) in FIT_SET and self.kind == "knee"

    @property
    def fit_figures(self) -> tuple[str, ...]:
        return ISOLATED_FIGURES if self.kind == "isolated" else FIT_FIGURES


def _parse_value(text: str) -> Any:
    for literal, value in (("None", None), ("True", True), ("False", False)):
        if text == literal:
            return value
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def assignment_from_label(label: str) -> dict[str, Any]:
    """A trial's knobs from its label ("max_num_seqs=256, cudagraph_mode=PIECEWISE")."""
    out: dict[str, Any] = {}
    for part in label.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"cannot read the trial label {label!r}")
        out[key] = _parse_value(value)
    return out


def engine_config(assignment: dict[str, Any], max_model_len: int) -> EngineConfig:
    """What `SearchSpace.to_config` builds on a GPU for the knobs the simulator reads."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = set(assignment) - fields
    if unknown:
        raise ValueError(f"knobs the simulator cannot take: {', '.join(sorted(unknown))}")
    values = {k: v for k, v in assignment.items() if v is not None}
    values.setdefault("dtype", "auto")
    return EngineConfig(**values, max_model_len=max_model_len)


def _knee_duration_s(points: Sequence[dict[str, Any]], method: dict[str, Any]) -> dict[float, float]:
    """Each probed rate's duration: as gpu_tuning.py chose it where the file records how (long
    enough for `knee_min_requests`), else the one fixed duration that explains every count."""
    if method.get("knee_min_requests"):
        floor, least = float(method["knee_duration_s"]), int(method["knee_min_requests"])
        return {p["rate_rps"]: knee_probe_duration_s(p["rate_rps"], floor, least) for p in points}
    return {p["rate_rps"]: _fixed_knee_duration_s(points) for p in points}


def _fixed_knee_duration_s(points: Sequence[dict[str, Any]]) -> float:
    for duration in KNEE_DURATIONS_S:
        if all(max(2, round(p["rate_rps"] * duration)) == p["requests"] for p in points):
            return duration
    raise SystemExit("no knee-probe duration explains the recorded request counts")


class Workloads:
    """The traces' samples, read once, and synthesised workloads written to a scratch directory."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._samples: dict[str, Any] = {}
        self._made: dict[str, tuple[TraceRequest, ...]] = {}

    def make(
        self, case: str, *, rate_rps: float, duration_s: float, seed: int, length_scale: float, expect: int
    ) -> tuple[str, tuple[TraceRequest, ...]]:
        key = f"{case}@{rate_rps:g}rps-{duration_s:g}s-seed{seed}-x{length_scale:g}"
        if key not in self._made:
            if case not in self._samples:
                self._samples[case] = ingest_path(TRACES_DIR / TRACES[case], keep_blocks=True)
            trace = synthesize(
                self._samples[case],
                target_rps=rate_rps,
                duration_s=duration_s,
                rng=np.random.default_rng(seed),
            )
            trace = scale_lengths(trace, length_scale)
            if trace.num_requests != expect:
                raise SystemExit(f"{key}: {trace.num_requests} requests re-created, {expect} recorded")
            path = self.scratch / f"{key}.jsonl"
            with path.open("wb") as out:
                write_mooncake_jsonl(trace, out)
            self._made[key] = tuple(read_trace(path))
        return key, self._made[key]


def collect_runs(workloads: Workloads) -> list[Run]:
    runs: list[Run] = []
    for source in SOURCES:
        data = json.loads((RESULTS / source).read_text())
        method = data.get("method", {})
        model = str(data["model"])
        for case_name, case in data["cases"].items():
            knee = case.get("knee_probe") or {}
            # A knee recorded by an earlier run (`--knee-from`) is scored where it was measured.
            if knee.get("points") and "source" not in knee:
                caps = knee["caps"]
                # A file that does not record where its ladder started used the default start.
                start = float(method.get("ladder_start_rps") or DEFAULT_LADDER_START)
                ladder = [r for r in LADDER if r >= start]
                durations = _knee_duration_s(knee["points"], method)
                competent = knee.get("competent") or {"dtype": "bfloat16"}
                for point in knee["points"]:
                    seed = 1000 + ladder.index(point["rate_rps"])
                    key, requests = workloads.make(
                        case_name,
                        rate_rps=point["rate_rps"],
                        duration_s=durations[point["rate_rps"]],
                        seed=seed,
                        length_scale=1.0,
                        expect=point["requests"],
                    )
                    runs.append(
                        Run(
                            source=source,
                            model=model,
                            case=case_name,
                            kind="knee",
                            label=f"{point['rate_rps']:g} req/s, vLLM defaults",
                            rate_rps=point["rate_rps"],
                            requests=requests,
                            config=engine_config(competent, caps["max_model_len"]),
                            max_prompt_tokens=caps["max_prompt_tokens"],
                            max_output_tokens=caps["max_output_tokens"],
                            seed=seed,
                            measured={f: float(point[f]) for f in FIT_FIGURES if point.get(f)},
                            workload_key=key,
                        )
                    )
            caps = case.get("caps") or {}
            for trial in case.get("trials", []):
                if trial.get("phase") == "reference" or trial.get("status") != "ok":
                    continue
                measured = {f: float(trial[f]) for f in FIGURES if trial.get(f)}
                if not measured:
                    continue
                key, requests = workloads.make(
                    case_name,
                    rate_rps=float(case["target_rps"]),
                    duration_s=TRIAL_DURATION_S.get(source, float(method["duration_s"])),
                    seed=TRIAL_SEED,
                    length_scale=float(caps.get("length_scale", 1.0)),
                    expect=int(caps["num_requests"]),
                )
                runs.append(
                    Run(
                        source=source,
                        model=model,
                        case=case_name,
                        kind="trial",
                        label=f"trial {trial['number']} ({trial['phase']}): {trial['label']}",
                        rate_rps=float(case["target_rps"]),
                        requests=requests,
                        config=engine_config(assignment_from_label(trial["label"]), caps["max_model_len"]),
                        max_prompt_tokens=caps["max_prompt_tokens"],
                        max_output_tokens=caps["max_output_tokens"],
                        seed=TRIAL_SEED,
                        measured=measured,
                        workload_key=key,
                    )
                )
    return runs


def collect_isolated(models: dict[str, ModelSpec], scratch: Path) -> list[Run]:
    """The isolated-request runs, one per prompt length, re-created as sim_gpu_isolated sent them;
    their model shapes (from the live files' config.json) are added to `models`."""
    from benchmarks.sim_gpu_isolated import simulated_config, write_requests
    from benchmarks.sim_rank_gpu import hardware_of
    from serving.catalog.models import model_spec_from_dir

    runs: list[Run] = []
    for source in (*ISOLATED_FIT, *ISOLATED_HELD_OUT):
        live = json.loads((RESULTS / source).read_text())
        model = str(live["model"])
        if model not in models:
            folder = scratch / f"model-{model}"
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(live["model_config"]))
            models[model] = model_spec_from_dir(folder)
        method = live["method"]
        for entry in live["lengths"]:
            n = int(entry["prompt_tokens"])
            path = scratch / f"{model}-isolated-{n}.jsonl"
            write_requests(path, n, int(method["repeats"]), int(method["output_tokens"]), 1_000_000)
            measured = {
                figure: float(np.median(entry[key]))
                for figure, key in (("ttft_p50_ms", "ttft_ms"), ("tpot_p50_ms", "tpot_ms"))
                if entry[key]
            }
            if entry["engine"].get("prefill_mean_ms"):
                measured["engine_prefill_ms"] = float(entry["engine"]["prefill_mean_ms"])
            runs.append(
                Run(
                    source=source,
                    model=model,
                    case="isolated",
                    kind="isolated",
                    label=f"{n} prompt tokens, alone, "
                    + (
                        f"token budget {method['max_num_batched_tokens']}"
                        if method.get("max_num_batched_tokens")
                        else "vLLM defaults"
                    ),
                    rate_rps=1.0 / float(method["spacing_s"]),
                    requests=tuple(read_trace(path)),
                    config=simulated_config(method),
                    max_prompt_tokens=n,
                    max_output_tokens=int(method["output_tokens"]),
                    seed=0,
                    measured=measured,
                    workload_key=f"isolated-{n}",
                    hardware=hardware_of(live["machine"]),
                )
            )
    return runs


def frontend_token_cost(path: Path) -> dict[str, Any]:
    """The frontend's time per prompt token from single requests (`sim_gpu_isolated.py`): per
    prompt length, the client's mean TTFT less the engine's own mean queue and prefill time (what
    the request spent before the engine scheduled it and after its first token left the engine:
    HTTP, tokenizing, the hand-off to the engine core), and its least-squares slope over the
    lengths (ms per prompt token; the intercept is the per-request cost the fit sets)."""
    live = json.loads(path.read_text())
    lengths, outside = [], []
    for entry in live["lengths"]:
        engine = entry["engine"]
        if not entry["ttft_ms"] or engine.get("prefill_mean_ms") is None:
            continue
        lengths.append(float(entry["prompt_tokens"]))
        outside.append(
            float(np.mean(entry["ttft_ms"]))
            - float(engine["prefill_mean_ms"])
            - float(engine.get("queue_mean_ms") or 0.0)
        )
    if len(lengths) < 3:
        raise SystemExit(f"{path}: fewer than 3 prompt lengths with the engine's prefill time")
    slope, intercept = np.polyfit(np.asarray(lengths), np.asarray(outside), 1)
    residual = np.asarray(outside) - (slope * np.asarray(lengths) + intercept)
    return {
        "source": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "model": str(live["model"]),
        "prompt_tokens": [int(n) for n in lengths],
        "outside_engine_ms": [round(v, 2) for v in outside],
        "ms_per_prompt_token": float(slope),
        "intercept_ms": float(intercept),
        "residual_rms_ms": float(np.sqrt(np.mean(residual**2))),
    }


class Predictor:
    """Simulated figures of a run under given overheads; identical runs are simulated once."""

    def __init__(self, models: dict[str, ModelSpec], bases: dict[str, Efficiency]) -> None:
        self.models = models
        self.bases = bases  # hardware -> its operator calibration
        self._cache: dict[tuple[Any, ...], dict[str, float]] = {}

    def efficiency(self, overheads: dict[str, float], hardware: str = HARDWARE) -> Efficiency:
        return dataclasses.replace(self.bases[hardware], **overheads)

    def predict(self, run: Run, overheads: dict[str, float]) -> dict[str, float]:
        key = (
            run.hardware,
            run.model,
            run.workload_key,
            repr(run.config),
            run.seed,
            tuple(sorted(overheads.items())),
        )
        if key not in self._cache:
            s = simulate_trace(
                run.requests,
                model=self.models[run.model],
                hardware=run.hardware,
                config=run.config,
                max_prompt_tokens=run.max_prompt_tokens,
                max_output_tokens=run.max_output_tokens,
                seed=run.seed,
                efficiency=self.efficiency(overheads, run.hardware),
            )
            mean = s.attribution.mean
            self._cache[key] = {
                "ttft_p50_ms": s.summary.ttft_ms.p50,
                "ttft_p95_ms": s.summary.ttft_ms.p95,
                "tpot_p50_ms": s.summary.tpot_ms.p50,
                # the engine's own prefill time of a request: scheduled to its first token
                "engine_prefill_ms": mean.prefill_compute_ms + mean.chunking_delay_ms,
            }
        return self._cache[key]


def log_loss(predictor: Predictor, runs: Sequence[Run], overheads: dict[str, float]) -> float:
    """Mean squared log ratio of predicted to measured TTFTs (a 2x miss counts alike at any load)."""
    terms = []
    for run in runs:
        predicted = predictor.predict(run, overheads)
        for figure in run.fit_figures:
            if figure in run.measured and math.isfinite(predicted[figure]) and predicted[figure] > 0:
                terms.append(math.log(predicted[figure] / run.measured[figure]) ** 2)
            elif figure in run.measured:
                terms.append(25.0)  # nothing predicted: as bad as a factor of ~150
    return float(np.mean(terms))


def compass_search(
    loss: Callable[[dict[str, float]], float],
    start: dict[str, float],
    *,
    step: float = 0.5,
    min_step: float = 0.03,
    max_evaluations: int = 160,
) -> tuple[dict[str, float], float, list[dict[str, Any]]]:
    """Bounded pattern search on log10 of each parameter: try +-step on one at a time, keep any
    improvement, halve the step when none helps. Deterministic; no gradients (the simulated
    figures move in steps as requests change places)."""
    names = list(start)
    lo = {n: math.log10(BOUNDS[n][0]) for n in names}
    hi = {n: math.log10(BOUNDS[n][1]) for n in names}
    x = {n: min(max(math.log10(max(start[n], BOUNDS[n][0])), lo[n]), hi[n]) for n in names}

    def value(point: dict[str, float]) -> dict[str, float]:
        return {n: round(10 ** point[n], 6) for n in names}

    best = loss(value(x))
    evaluations = 1
    path = [{"evaluation": 1, "loss": best, **value(x)}]
    while step >= min_step and evaluations < max_evaluations:
        improved = False
        for name in names:
            for sign in (1.0, -1.0):
                trial = dict(x)
                trial[name] = min(max(x[name] + sign * step, lo[name]), hi[name])
                if trial[name] == x[name]:
                    continue
                current = loss(value(trial))
                evaluations += 1
                if current < best - 1e-9:
                    x, best, improved = trial, current, True
                    path.append({"evaluation": evaluations, "loss": best, **value(x)})
                    break
        if not improved:
            step /= 2.0
    return value(x), best, path


def grid_starts(names: Sequence[str]) -> list[dict[str, float]]:
    """Two levels per parameter (a quarter and three quarters into its log-bounds): where the
    multi-start search begins besides the priors, so that one explanation of the FIT set (a slow
    engine step, or a slow frontend) is not chosen merely because it lies next to the priors."""
    levels = {
        n: tuple(10 ** (math.log10(lo) + f * (math.log10(hi) - math.log10(lo))) for f in (0.25, 0.75))
        for n, (lo, hi) in BOUNDS.items()
        if n in names
    }
    out: list[dict[str, float]] = [{}]
    for name in names:
        out = [{**point, name: level} for point in out for level in levels[name]]
    return out


def multistart_search(
    loss: Callable[[dict[str, float]], float],
    priors: dict[str, float],
    *,
    refine: int = 2,
    max_evaluations: int = 60,
) -> tuple[dict[str, float], float, list[dict[str, Any]]]:
    """The priors and a two-level grid scored on the FIT set, then a compass search from the best
    `refine` of them; the lowest FIT loss wins (the held-out set plays no part)."""
    starts = [dict(priors), *grid_starts(list(priors))]
    scored = sorted(((loss(s), i) for i, s in enumerate(starts)), key=lambda t: t)
    log: list[dict[str, Any]] = [
        {"grid_points": len(starts), "best_start_losses": [round(v, 5) for v, _ in scored[:5]]}
    ]
    best: tuple[dict[str, float], float] | None = None
    for _, index in scored[:refine]:
        found, value, path = compass_search(loss, starts[index], step=0.25, max_evaluations=max_evaluations)
        log.append(
            {
                "start": {k: round(v, 6) for k, v in starts[index].items()},
                "loss": value,
                "found": found,
                "steps": len(path),
            }
        )
        if best is None or value < best[1]:
            best = (found, value)
    assert best is not None
    return best[0], best[1], log


def score(
    predictor: Predictor, runs: Sequence[Run], overheads: dict[str, float]
) -> tuple[list[dict[str, Any]], list[float]]:
    rows, apes = [], []
    for run in runs:
        predicted = predictor.predict(run, overheads)
        row: dict[str, Any] = {}
        for figure, measured in run.measured.items():
            p = predicted[figure]
            ape = abs(p - measured) / measured if math.isfinite(p) else None
            row[figure] = {"measured": round(measured, 2), "predicted": _round(p), "ape": _round(ape, 4)}
            if ape is not None:
                apes.append(ape)
        rows.append(row)
    return rows, apes


def mape_table(rows: Sequence[dict[str, Any]], when: str) -> dict[str, Any]:
    """MAPE per figure (and over all figures) of the rows, from their `when` ("before"/"after")."""
    out: dict[str, Any] = {"num_runs": len(rows)}
    every: list[float] = []
    for figure in FIGURES:
        apes = [
            r[when][figure]["ape"] for r in rows if figure in r[when] and r[when][figure]["ape"] is not None
        ]
        out[f"{figure}_mape"] = _round(float(np.mean(apes)), 4) if apes else None
        out[f"{figure}_n"] = len(apes)
        every += apes
    out["all_figures_mape"] = _round(float(np.mean(every)), 4) if every else None
    return out


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), digits)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_gpu_fit.json")
    parser.add_argument(
        "--write-calibration",
        action="store_true",
        help=f"store the fitted overheads with their provenance in {LIVE_FILE.relative_to(REPO)}",
    )
    parser.add_argument("--max-evaluations", type=int, default=60, help="per refined start")
    parser.add_argument("--fields", default=",".join(DEFAULT_FIELDS), help=f"of {', '.join(LIVE_FIT_FIELDS)}")
    parser.add_argument(
        "--attention-split",
        type=float,
        default=1.0,
        help="the step model's form for a step mixing prompt chunks and decodes, in [0, 1] (0: one roofline "
        "over the step's attention; 1: chunks and decodes each at their own, summed); given, not fitted",
    )
    args = parser.parse_args()
    if not 0.0 <= args.attention_split <= 1.0:
        parser.error(f"--attention-split must be in [0, 1], got {args.attention_split:g}")
    form = {"attention_split": float(args.attention_split)}
    started = time.monotonic()
    prior = load_efficiency(HARDWARE, live=False)
    if prior is None:
        raise SystemExit(f"no operator calibration for {HARDWARE}")
    names = args.fields.split(",")
    if not names or set(names) - (set(LIVE_FIT_FIELDS) & set(BOUNDS)):
        parser.error(f"--fields takes names among {', '.join(sorted(set(LIVE_FIT_FIELDS) & set(BOUNDS)))}")
    # The costs measured outright (not fitted), from the FIT set's single requests; the held-out
    # model's single requests measured the same way, beside, as their check.
    frontend = {
        "fit": [frontend_token_cost(RESULTS / s) for s in ISOLATED_FIT],
        "held_out": [frontend_token_cost(RESULTS / s) for s in ISOLATED_HELD_OUT],
    }
    measured = (
        {"prompt_token_overhead_ms": float(np.mean([f["ms_per_prompt_token"] for f in frontend["fit"]]))}
        if "prompt_token_overhead_ms" not in names
        else {}
    )
    if measured and not measured["prompt_token_overhead_ms"] >= 0:
        raise SystemExit(f"the frontend's time per prompt token came out negative: {frontend['fit']}")
    print(f"measured: {measured}", file=sys.stderr)
    priors = {name: float(getattr(prior, name)) for name in names}
    prior_costs = {**priors, **measured, **form}
    # The calibration stored by the last --write-calibration, scored beside the new fit.
    stored = json.loads(LIVE_FILE.read_text()) if LIVE_FILE.exists() else None
    # Every cost it set, whichever they were (the rest are the operator calibration's).
    previous = (
        {n: float(v) for n, v in stored["fitted"].items()}
        if stored and isinstance(stored.get("fitted"), dict) and set(stored["fitted"]) <= set(LIVE_FIT_FIELDS)
        else None
    )
    with tempfile.TemporaryDirectory(prefix="sim-gpu-fit-") as scratch:
        runs = collect_runs(Workloads(Path(scratch)))
        # The shapes gpu_tuning.py served (their config.json's dimensions), by the files' names.
        models = {name: get_model(name) for name in sorted({r.model for r in runs})}
        runs += collect_isolated(models, Path(scratch))
    bases = {HARDWARE: prior}
    for hardware in sorted({r.hardware for r in runs} - {HARDWARE}):
        base = load_efficiency(hardware, live=False)
        if base is None:
            raise SystemExit(f"no operator calibration for {hardware}, where isolated runs were measured")
        bases[hardware] = base
    predictor = Predictor(models, bases)
    fit_runs = [r for r in runs if r.fit]
    held_out = [r for r in runs if not r.fit]
    print(f"{len(fit_runs)} FIT runs, {len(held_out)} HELD-OUT runs", file=sys.stderr)
    found, loss_after, path = multistart_search(
        lambda o: log_loss(predictor, fit_runs, {**o, **measured, **form}),
        priors,
        max_evaluations=args.max_evaluations,
    )
    fitted = {**found, **measured, **form}  # every field the calibration sets: fitted, measured or given
    loss_before = log_loss(predictor, fit_runs, prior_costs)
    print(f"fit: loss {loss_before:.4f} -> {loss_after:.4f}, {fitted}", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    whens = ("before", "previous", "after") if previous else ("before", "after")
    for run in runs:
        scored = {
            when: score(predictor, [run], values)[0][0]
            for when, values in (("before", prior_costs), ("previous", previous), ("after", fitted))
            if values is not None
        }
        rows.append(
            {
                "set": "fit" if run.fit else "held_out",
                "source": run.source,
                "model": run.model,
                "trace": run.case,
                "kind": run.kind,
                "run": run.label,
                "rate_rps": round(run.rate_rps, 3),
                "num_requests": len(run.requests),
                **scored,
            }
        )
    sets = {
        name: {when: mape_table(sel, when) for when in whens}
        for name, sel in (
            ("fit", [r for r in rows if r["set"] == "fit"]),
            ("held_out", [r for r in rows if r["set"] == "held_out"]),
        )
    }
    groups: dict[str, Any] = {}
    for row in rows:
        groups.setdefault(
            f"{row['set']}: {row['model']} / {row['trace']} / {row['kind']} ({row['source']})", []
        ).append(row)
    per_group = {name: {when: mape_table(sel, when) for when in whens} for name, sel in groups.items()}
    # Per model shape, the held-out error of the new fit: the figure issue 26 holds to 25%.
    per_model = {
        name: {
            when: mape_table([r for r in rows if r["set"] == "held_out" and r["model"] == name], when)
            for when in whens
        }
        for name in models
    }
    over = {
        f"{name} {figure}_mape": table[f"{figure}_mape"]
        for name, table in [
            ("all", sets["held_out"]["after"]),
            *((n, t["after"]) for n, t in per_model.items()),
        ]
        for figure in FIGURES
        if (table[f"{figure}_mape"] or 0.0) > ERROR_LIMIT
    }
    over_limit = (
        {
            "figures": over,
            "line": "held-out error stays above 25% on "
            + ", ".join(f"{k.removesuffix('_mape')} ({v:.0%})" for k, v in over.items())
            + "; no value was fitted on the held-out runs",
        }
        if over
        else None
    )
    when = datetime.now(UTC)
    git = git_state(REPO)
    commit = str(git.get("commit", ""))
    fit_how = (
        (
            f"{', '.join(n.removesuffix('_ms').replace('_', ' ') for n in measured)} measured from the single "
            f"requests of benchmarks/results/{{{', '.join(ISOLATED_FIT)}}} (the client's TTFT less the engine's "
            "queue and prefill, its slope over prompt length); "
            if measured
            else ""
        )
        + f"{', '.join(n.removesuffix('_ms').replace('_', ' ') for n in found)} fitted to "
        f"live vLLM runs on the H200 and H100 "
        f"(azure_conv knee probes of {', '.join(sorted({r.model for r in fit_runs if r.kind == 'knee'}))}, "
        f"{sum(r.kind == 'knee' for r in fit_runs)} rates, vLLM defaults, "
        f"benchmarks/results/{{{', '.join(sorted(s for s, _ in FIT_SET))}}}; "
        f"single requests of {sum(r.kind == 'isolated' for r in fit_runs)} prompt lengths on the H100, "
        f"benchmarks/results/{{{', '.join(ISOLATED_FIT)}}}; "
        f"benchmarks/sim_gpu_fit.py, {when.date().isoformat()}, commit {commit[:10]}); "
        "communication costs are priors, not measured"
        + (
            "; attention of a step mixing prompt chunks and decodes costed per side and summed "
            f"(attention_split {form['attention_split']:g}, given)"
            if form["attention_split"]
            else ""
        )
    )
    result = {
        "benchmark": "sim_gpu_fit",
        "when": when.isoformat(timespec="seconds"),
        **git,
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "hardware": HARDWARE,
        "models": list(models),
        "method": {
            "sources": [f"benchmarks/results/{s}" for s in (*SOURCES, *ISOLATED_FIT, *ISOLATED_HELD_OUT)],
            "fit_set": "; ".join(
                f"{source}: cases.{case}.knee_probe.points" for source, case in sorted(FIT_SET)
            )
            + " (p50 and p95 TTFT); "
            + "; ".join(f"{source}: every prompt length" for source in ISOLATED_FIT)
            + " (p50 TTFT and TPOT, the engine's mean prefill time)",
            "held_out_set": "every other knee-probe point and every trial of every source (p50/p95 TTFT, "
            "p50 TPOT); the isolated requests of "
            + ", ".join(ISOLATED_HELD_OUT)
            + " (p50 TTFT and TPOT, the engine's mean prefill time)",
            "isolated_hardware": "the isolated requests ran on the H100 and are predicted with its operator "
            "calibration (serving/perf/data/h100.json) and the same fitted overheads: the engine software's "
            "and its host CPU's costs, not the GPU's (the H100's host CPU is not the H200's)",
            "previous": "the calibration stored before this run (serving/perf/data/h200_live.json), scored "
            "on the same runs in each row's `previous`"
            if previous
            else None,
            "workloads": "re-created as benchmarks/gpu_tuning.py made them: tuning.workload.synthesize of the "
            "trace's sample (knee: seed 1000 + ladder index, duration as the file's method records it or else "
            "from the recorded counts; trials: "
            f"seed {TRIAL_SEED}, the job's target rate and duration (TRIAL_DURATION_S where a file recorded "
            "another than its trials replayed), the case's length scale), the "
            "recorded caps; every re-created count matches the recorded one",
            "objective": "mean squared log(predicted / measured) over the FIT set's TTFTs",
            "search": "the priors and a two-level grid scored on the FIT set; a bounded compass search on "
            "log10 of each cost from the best two; the lowest FIT loss wins",
            "history": FIRST_ATTEMPT,
            "bounds_ms": BOUNDS,
            "not_modelled": "CUDA-graph modes (full-graph decode vs piecewise mixed steps share one step "
            "cost), async scheduling, block size (the simulator pages at 16 tokens on GPUs)",
            "error_limit": ERROR_LIMIT,
        },
        "priors": prior_costs,
        "measured": measured,
        "form": form,
        "frontend_token_cost": frontend,
        "fitted": fitted,
        "fit_loss": {"before": round(loss_before, 5), "after": round(loss_after, 5)},
        "fit_path": path,
        "fit_how": fit_how,
        "previous_fit": previous,
        "sets": sets,
        "held_out_per_model": per_model,
        "per_model_trace": per_group,
        "held_out_over_limit": over_limit,
        "rows": rows,
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    if args.write_calibration:
        live = {
            "hardware": HARDWARE,
            "fitted": fitted,
            "measured_not_fitted": sorted(measured),
            "given_not_fitted": sorted(form),
            "how": fit_how,
            "fitted_at": when.isoformat(timespec="seconds"),
            "commit": commit,
            "dirty": git.get("dirty"),
            "sources": [f"benchmarks/results/{s}" for s in (*SOURCES, *ISOLATED_FIT, *ISOLATED_HELD_OUT)],
            "fit_set": result["method"]["fit_set"],
            "result": "benchmarks/results/sim_gpu_fit.json",
            "mape": sets,
            "engine": f"vLLM 0.26.0, shapes {', '.join(models)}, random weights, bf16 (see the sources)",
        }
        LIVE_FILE.write_text(json.dumps(live, indent=1) + "\n")
        print(f"wrote {LIVE_FILE}", file=sys.stderr)
    for name, table in sets.items():
        print(
            f"{name}: "
            + ", ".join(
                f"{f} " + " -> ".join(str(table[w][f + "_mape"]) for w in whens)
                for f in FIGURES
                if table["after"][f + "_n"]
            ),
            file=sys.stderr,
        )
    for name, table in per_model.items():
        print(
            f"held out, {name}: "
            + ", ".join(f"{f} " + " -> ".join(str(table[w][f + "_mape"]) for w in whens) for f in FIGURES),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
