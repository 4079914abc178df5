"""The floor under an engine step run outside vLLM's CUDA graphs, fitted per host on single requests.

vLLM captures CUDA graphs for steps of up to min(2 x max_num_seqs, 512) tokens; a step of more
runs its layers' kernels launched one by one from the host. On the H100 a single 1,024-token
prefill step of the Qwen3-1.7B shape took 12.8-15.5 ms where the step model (its GPU work) said
6.9-7.5, while steps of 512 tokens and of 2,000 or more agreed with it
(`benchmarks/results/sim_gpu_isolated_1p7b_*.json`): the host's launches, not the GPU's work, set
the time of a small step outside the graphs. This script fits that floor's form and size from
single requests of several model depths measured on one host (`sim_gpu_isolated.py measure`,
with its warm-up request per length), and scores every form on held-out files (another model,
or files measured before the warm-up existed).

A point is one prompt length of one file whose prefill steps all hold the same number of tokens
(one step, or chunks of the token budget): the engine's own mean prefill time (its /metrics, from
scheduling to the first token) per step, beside the simulator's for the same request with no
floor. Points of more tokens than the graphs hold are fitted; those inside are reported (they
check the step model where no floor applies). The forms, each a prediction of a step's time
outside the graphs from the simulated one `sim` and the model's layer count `L`:

- `none`: sim (the stored model without a floor);
- `fixed`: max(sim, a);
- `per_layer`: max(sim, b x L) (each layer's kernels launched in turn);
- `fixed_and_per_layer`: max(sim, a + b x L);
- `additive`: sim + c (every step outside the graphs pays the launches on top of its GPU work).

With `--offset inside-graphs` a file's live times are first taken net of a per-request cost
the step model does not hold: the median, over the file's single-step lengths inside the graphs,
of the engine's prefill less the simulated step. The engine's prefill time runs from the request's
scheduling to its first token, so it holds the step's preparation and the sampled token's return
as well as the step; on the H100 files of 2026-12-07 (the 1B at 16 and at 32 layers) that was
3.5-5.8 ms per request inside the graphs, and the 4,096-token steps, where the GPU's work sets the
time, agreed with the step model once it was taken off. A file with no such length is used as
measured (its rows say `offset_ms: null`). The choice rule above was written for points without
this offset; the result file names the offset used, and each reading is written by this script.

Each is fitted by least squares on the logarithms (each point weighted alike) within bounds, by a
grid and a compass refinement. The form stored is the one-parameter form of least FIT loss, unless
the two-parameter one lowers that loss by at least a tenth (`TWO_PARAMETER_GAIN`; the rule was
written before the data it chooses on was measured). Intervals: the points resampled with
replacement, the chosen form refitted on each draw (95%).

    .venv/bin/python benchmarks/sim_gpu_eager_floor.py FIT_LIVE... --held-out LIVE... --out R.json
    .venv/bin/python benchmarks/sim_gpu_eager_floor.py ... --write-calibration   # also stores it

`--write-calibration` writes the chosen fit with its provenance to
serving/perf/data/<hardware>_eager.json, which the step model then applies to every prediction
for that hardware (`serving.perf.model.load_efficiency`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from benchmarks.sim_gpu_isolated import predict_length, simulated_config  # noqa: E402
from benchmarks.sim_rank_gpu import calibration_files, hardware_of  # noqa: E402
from serving.perf.model import DATA_DIR, EAGER_FIT_FIELDS  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "sim_gpu_eager_floor.json"
FORMS = ("none", "fixed", "per_layer", "fixed_and_per_layer", "additive")
FORM_HOW = {
    "none": "sim (no floor)",
    "fixed": "max(sim, a ms)",
    "per_layer": "max(sim, b us x layers)",
    "fixed_and_per_layer": "max(sim, a ms + b us x layers)",
    "additive": "sim + c ms",
}
ONE_PARAMETER = ("fixed", "per_layer", "additive")
TWO_PARAMETER_GAIN = 0.10  # the share of FIT loss a second parameter must remove to be kept
LOSS_RESOLUTION = 1e-6  # a loss difference below this (0.1% root mean square) is no difference
BOUNDS = {"a": (0.0, 60.0), "b": (0.0, 2000.0), "c": (0.0, 60.0)}  # ms, us per layer, ms
BOOTSTRAP_ROUNDS = 400
MAX_FILES = 16


@dataclasses.dataclass(frozen=True)
class Point:
    """One prompt length of one live file: a step's time live and simulated (no floor)."""

    source: str
    model: str
    layers: int
    prompt_tokens: int
    step_tokens: int
    steps: int
    graph_max_tokens: int
    live_ms: float
    sim_ms: float
    requests: int
    warmed_up: bool
    median_of_each: bool  # live_ms from the per-request median (else the length's mean)
    # the file's per-request cost outside the step taken off live_ms (None: none taken off)
    offset_ms: float | None = None

    @property
    def net_ms(self) -> float:
        """The live time per step, net of the per-request offset spread over the request's steps."""
        return self.live_ms - (self.offset_ms or 0.0) / self.steps

    @property
    def outside(self) -> bool:
        return self.step_tokens > self.graph_max_tokens


def predict(form: str, params: dict[str, float], sim: np.ndarray, layers: np.ndarray) -> np.ndarray:
    if form == "none":
        return sim
    if form == "additive":
        return sim + params["c"]
    floor = params.get("a", 0.0) + params.get("b", 0.0) / 1000.0 * layers
    return np.maximum(sim, floor)


def _loss(
    form: str, params: dict[str, float], sim: np.ndarray, layers: np.ndarray, live: np.ndarray
) -> float:
    return float(np.mean((np.log(predict(form, params, sim, layers)) - np.log(live)) ** 2))


def form_parameters(form: str) -> tuple[str, ...]:
    return {
        "none": (),
        "fixed": ("a",),
        "per_layer": ("b",),
        "fixed_and_per_layer": ("a", "b"),
        "additive": ("c",),
    }[form]


def fit_form(form: str, sim: np.ndarray, layers: np.ndarray, live: np.ndarray) -> dict[str, float]:
    """The form's parameters of least loss within BOUNDS: the best of a grid, refined by a compass
    search (halving its steps until they are a millionth of the range)."""
    names = form_parameters(form)
    if not names:
        return {}
    axes = [np.linspace(*BOUNDS[n], 41) for n in names]
    best: dict[str, float] = {}
    best_loss = math.inf
    for values in np.array(np.meshgrid(*axes)).reshape(len(names), -1).T:
        params = dict(zip(names, (float(v) for v in values), strict=True))
        loss = _loss(form, params, sim, layers, live)
        if loss < best_loss:
            best, best_loss = params, loss
    steps = {n: (BOUNDS[n][1] - BOUNDS[n][0]) / 40 for n in names}
    while max(steps[n] / (BOUNDS[n][1] - BOUNDS[n][0]) for n in names) > 1e-6:
        moved = False
        for n in names:
            for sign in (1.0, -1.0):
                trial = dict(best)
                trial[n] = min(max(best[n] + sign * steps[n], BOUNDS[n][0]), BOUNDS[n][1])
                loss = _loss(form, trial, sim, layers, live)
                if loss < best_loss - 1e-15:
                    best, best_loss, moved = trial, loss, True
        if not moved:
            steps = {n: s / 2 for n, s in steps.items()}
    return best


def choose_form(losses: dict[str, float]) -> str:
    """The one-parameter form of least loss, unless the two-parameter form lowers it by at least
    TWO_PARAMETER_GAIN of it (and by more than LOSS_RESOLUTION)."""
    one = min(ONE_PARAMETER, key=lambda f: losses[f])
    two = "fixed_and_per_layer"
    gain = losses[one] - losses[two]
    return two if gain >= TWO_PARAMETER_GAIN * losses[one] and gain > LOSS_RESOLUTION else one


def read_points(path: Path, scratch: Path) -> tuple[list[Point], dict[str, Any]]:
    """A live file's points, and its provenance."""
    from serving.catalog.hardware import get_hardware
    from serving.catalog.models import model_spec_from_dir
    from serving.perf.model import nearest_measured
    from serving.sim.simulator import graph_max_tokens, resolve_config

    raw = path.read_bytes()
    live = json.loads(raw)
    if live.get("benchmark") != "sim_gpu_isolated_live":
        raise SystemExit(f"{path} is not a sim_gpu_isolated live file")
    hardware = hardware_of(live["machine"])
    folder = scratch / hashlib.sha256(raw).hexdigest()[:12]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(live["model_config"]))
    model = model_spec_from_dir(folder)
    stored, _ = nearest_measured(get_hardware(hardware))
    no_floor = dataclasses.replace(stored, **{name: 0.0 for name in EAGER_FIT_FIELDS})
    config = simulated_config(live["method"])
    sched, _, _ = resolve_config(config, model, get_hardware(hardware))
    budget = int(sched.max_num_batched_tokens)  # the one set, or vLLM's default as simulated
    graphs = graph_max_tokens(config, sched, get_hardware(hardware))
    if graphs is None:
        raise SystemExit(f"{path}: {hardware} runs no CUDA graphs; there is no floor to fit")
    points: list[Point] = []
    for entry in live["lengths"]:
        n = int(entry["prompt_tokens"])
        # The median of the engine's per-request prefill times where the file has them (one slow
        # request cannot move it), else its mean over the length's requests.
        each = [float(v) for v in entry["engine"].get("prefill_ms_each") or [] if v]
        prefill = float(np.median(each)) if each else entry["engine"].get("prefill_mean_ms")
        steps = math.ceil(n / budget)
        # Only lengths whose steps all hold the same number of tokens: one step, or whole chunks.
        if entry["errors"] or not prefill or (steps > 1 and n % budget):
            continue
        sim = predict_length(model, hardware, no_floor, entry, live)["prefill_mean_ms"]
        points.append(
            Point(
                source=str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
                model=str(live["model"]),
                layers=model.num_layers,
                prompt_tokens=n,
                step_tokens=n // steps,
                steps=steps,
                graph_max_tokens=int(graphs),
                live_ms=float(prefill) / steps,
                sim_ms=float(sim) / steps,
                requests=int(entry["requests"]),
                warmed_up=bool(live["method"].get("warm_up_requests_per_length")),
                median_of_each=bool(each),
            )
        )
    provenance = {
        "path": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "when": live["when"],
        "commit": live.get("commit"),
        "dirty": live.get("dirty"),
        "gpu": live["machine"].get("gpu"),
        "hardware": hardware,
        "model": live["model"],
        "layers": model.num_layers,
        "token_budget": int(budget),
        "graph_max_tokens": int(graphs),
        "warm_up_requests_per_length": live["method"].get("warm_up_requests_per_length", 0),
        "engine_ready_s": live.get("engine_ready_s"),
        "foreign_load": live.get("foreign_load"),
    }
    return points, provenance


def _arrays(points: Sequence[Point]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([p.sim_ms for p in points]),
        np.array([float(p.layers) for p in points]),
        np.array([p.net_ms for p in points]),
    )


OFFSETS = ("none", "inside-graphs")


def with_offset(points: Sequence[Point], offset: str) -> list[Point]:
    """`points` with each file's per-request offset set (see the module's docstring)."""
    if offset == "none":
        return list(points)
    by_source: dict[str, list[float]] = {}
    for p in points:
        if not p.outside and p.steps == 1:
            by_source.setdefault(p.source, []).append(p.live_ms - p.sim_ms)
    out = []
    for p in points:
        found = by_source.get(p.source)
        out.append(dataclasses.replace(p, offset_ms=float(np.median(found)) if found else None))
    return out


def _mape(form: str, params: dict[str, float], points: Sequence[Point]) -> float | None:
    if not points:
        return None
    sim, layers, live = _arrays(points)
    return float(np.mean(np.abs(predict(form, params, sim, layers) / live - 1.0)))


def bootstrap(
    form: str, points: Sequence[Point], rng: np.random.Generator, rounds: int
) -> dict[str, dict[str, float]]:
    """Each of the form's parameters' 95% interval: the points resampled, the form refitted."""
    draws: dict[str, list[float]] = {n: [] for n in form_parameters(form)}
    sim, layers, live = _arrays(points)
    for _ in range(rounds):
        pick = rng.integers(0, len(points), size=len(points))
        fitted = fit_form(form, sim[pick], layers[pick], live[pick])
        for n, v in fitted.items():
            draws[n].append(v)
    return {
        n: {"ci_low": float(np.percentile(v, 2.5)), "ci_high": float(np.percentile(v, 97.5))}
        for n, v in draws.items()
    }


def probe_floor(live: dict[str, Any], scratch: Path, offset: str = "none") -> dict[str, Any] | None:
    """The floor on the machine of a `sim_rank_gpu.py` run, from the single requests its
    `--floor-probe-lengths` sent after each case of vLLM's defaults (`floor_probe`): the fixed
    floor fitted on the probes' steps outside the CUDA graphs (one model, so one size). With
    `offset` "inside-graphs", each probe's per-request cost (`with_offset`, from its lengths inside
    the graphs) is first taken off. None where the run has no probe."""
    probes = [c for g in live.get("groups", {}).values() for c in g["cases"] if c.get("floor_probe")]
    if not probes:
        return None
    scratch.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    for i, case in enumerate(probes):
        probe = case["floor_probe"]
        single = {
            "benchmark": "sim_gpu_isolated_live",
            "when": case["started_at"],
            "machine": live["machine"],
            "model": live["model"],
            "model_config": live["model_config"],
            "method": {
                "max_model_len": int(live["caps"]["max_model_len"]),
                "max_num_batched_tokens": None,
                "repeats": int(probe["repeats"]),
                "output_tokens": int(probe["output_tokens"]),
                "warm_up_requests_per_length": int(probe["warm_up_requests_per_length"]),
            },
            "lengths": probe["lengths"],
        }
        path = scratch / f"floor-probe-{i}.json"
        path.write_text(json.dumps(single))
        folder = scratch / f"floor-probe-{i}"
        folder.mkdir()
        found, _ = read_points(path, folder)
        points += with_offset(found, offset)
    if offset != "none" and any(p.offset_ms is None for p in points):
        raise SystemExit(
            "a floor probe holds no one-step length inside the CUDA graphs: no per-request offset to take off"
        )
    outside = [p for p in points if p.outside]
    if not outside:
        raise SystemExit("the run's floor probes hold no step outside the CUDA graphs: no floor to fit")
    sim, layers, measured = _arrays(outside)
    fits: dict[str, dict[str, float]] = {"none": {}, "fixed": fit_form("fixed", sim, layers, measured)}
    return {
        "how": "the fixed floor of least squared log error over the probes' one-step lengths outside the "
        "CUDA graphs (the engine's median prefill per request against the simulator's step with no floor)"
        + ("" if offset == "none" else ", each probe's per-request cost inside the graphs taken off first"),
        "offset": offset,
        "offsets_ms": sorted({p.offset_ms for p in points if p.offset_ms is not None}),
        "eager_step_floor_ms": fits["fixed"]["a"],
        "probes": [c["started_at"] for c in probes],
        "points_outside_graphs": len(outside),
        "fit_mape": _mape("fixed", fits["fixed"], outside),
        "none_mape": _mape("none", {}, outside),
        "rows": [_row(p, fits) for p in points],
    }


def stored_fields(form: str, params: dict[str, float]) -> dict[str, float]:
    """The chosen fit as the step model's fields (`Efficiency.eager_step_floor_ms`, `eager_layer_floor_us`)."""
    if form == "additive":
        raise SystemExit("the additive form has no floor the step model can store; refusing to write it")
    return {
        "eager_step_floor_ms": round(params.get("a", 0.0), 4),
        "eager_layer_floor_us": round(params.get("b", 0.0), 3),
    }


def _row(p: Point, fits: dict[str, dict[str, float]]) -> dict[str, Any]:
    sim, layers = np.array([p.sim_ms]), np.array([float(p.layers)])
    return {
        **dataclasses.asdict(p),
        "inside_graphs": not p.outside,
        "sim_over_live": p.sim_ms / p.live_ms,
        "sim_over_net": p.sim_ms / p.net_ms,
        "predicted_ms": {f: float(predict(f, fits[f], sim, layers)[0]) for f in fits} if p.outside else None,
    }


def run(
    fit_paths: Sequence[Path],
    held_out_paths: Sequence[Path],
    *,
    rounds: int = BOOTSTRAP_ROUNDS,
    offset: str = "none",
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    if not fit_paths or len(fit_paths) + len(held_out_paths) > MAX_FILES:
        raise SystemExit(f"give 1 to {MAX_FILES} live files in all, at least one to fit")
    with tempfile.TemporaryDirectory() as scratch:
        fit_points: list[Point] = []
        held_points: list[Point] = []
        sources: dict[str, list[dict[str, Any]]] = {"fit": [], "held_out": []}
        for role, paths, into in (("fit", fit_paths, fit_points), ("held_out", held_out_paths, held_points)):
            for path in paths:
                found, provenance = read_points(path, Path(scratch))
                found = with_offset(found, offset)
                provenance["offset_ms"] = found[0].offset_ms if found else None
                into.extend(found)
                sources[role].append(provenance)
                progress(f"{role}: {provenance['path']}: {len(found)} points ({provenance['model']})")
    hardware = {s["hardware"] for role in sources.values() for s in role}
    if len(hardware) != 1:
        raise SystemExit(
            f"the files come from different hardware ({', '.join(sorted(hardware))}): a floor is per host"
        )
    outside = [p for p in fit_points if p.outside]
    if len({p.layers for p in outside}) < 2:
        raise SystemExit("the fit needs steps outside the CUDA graphs from at least two model depths")
    sim, layers, live = _arrays(outside)
    fits = {form: fit_form(form, sim, layers, live) for form in FORMS}
    losses = {form: _loss(form, fits[form], sim, layers, live) for form in FORMS}
    chosen = choose_form(losses)
    held_outside = [p for p in held_points if p.outside]
    forms = {
        form: {
            "parameters": fits[form],
            "fit_loss_msle": losses[form],
            "fit_mape": _mape(form, fits[form], outside),
            "held_out_mape": _mape(form, fits[form], held_outside),
            "held_out_mape_warmed_up": _mape(form, fits[form], [p for p in held_outside if p.warmed_up]),
        }
        for form in FORMS
    }
    intervals = bootstrap(chosen, outside, np.random.default_rng(0), rounds)
    return {
        "benchmark": "sim_gpu_eager_floor",
        "written_by": "benchmarks/sim_gpu_eager_floor.py",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(REPO),
        "machine": machine_facts(),
        "versions": versions("numpy"),
        "hardware": hardware.pop(),
        "calibration_files": list(calibration_files(sources["fit"][0]["hardware"])),
        "sources": sources,
        "method": {
            "points": "per prompt length whose steps hold equal tokens: the engine's prefill per step, live "
            "(the median of its per-request times where the file has them, else its mean), and the "
            "simulator's with no floor",
            "offset": offset
            if offset == "none"
            else "inside-graphs: each file's live times net of the median, over its single-step lengths inside "
            "the graphs, of live less simulated (a per-request cost the step model does not hold); the choice "
            "rule was written before this offset was",
            "forms": FORM_HOW,
            "loss": "mean squared log error over the FIT points outside the graphs, each alike",
            "choice": f"the one-parameter form of least FIT loss, unless the two-parameter form lowers it by "
            f"at least {TWO_PARAMETER_GAIN:.0%} (rule written before the FIT data was measured)",
            "bounds": BOUNDS,
            "bootstrap_rounds": rounds,
        },
        "chosen_form": chosen,
        "chosen": {
            "parameters": fits[chosen],
            "ci95": intervals,
            "stored_fields": stored_fields(chosen, fits[chosen]) if chosen != "additive" else None,
        },
        "forms": forms,
        "inside_graphs_sim_over_live": {
            "fit": [p.sim_ms / p.net_ms for p in fit_points if not p.outside],
            "held_out": [p.sim_ms / p.net_ms for p in held_points if not p.outside],
        },
        "rows": {
            "fit": [_row(p, fits) for p in fit_points],
            "held_out": [_row(p, fits) for p in held_points],
        },
    }


def write_calibration(result: dict[str, Any], out: Path) -> Path:
    fields = result["chosen"]["stored_fields"]
    if fields is None:
        raise SystemExit("the chosen form is additive: nothing the step model stores as a floor")
    hardware = result["hardware"]
    path = DATA_DIR / f"{hardware.replace('-', '_')}_eager.json"
    how = (
        f"floor under steps outside the CUDA graphs ({result['chosen_form']}: "
        f"{fields['eager_step_floor_ms']:g} ms + {fields['eager_layer_floor_us']:g} us per layer) fitted on "
        f"single requests of {', '.join(s['model'] for s in result['sources']['fit'])} on {hardware} "
        f"(benchmarks/sim_gpu_eager_floor.py, {result['when'][:10]}, commit {str(result['commit'])[:10]})"
    )
    path.write_text(
        json.dumps(
            {
                "hardware": hardware,
                "written_by": "benchmarks/sim_gpu_eager_floor.py --write-calibration",
                "fitted_at": result["when"],
                "commit": result["commit"],
                "dirty": result["dirty"],
                "form": result["chosen_form"],
                "offset": result["method"]["offset"],
                "ci95": result["chosen"]["ci95"],
                "sources": [s["path"] for s in result["sources"]["fit"]],
                "result": str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out),
                "how": how,
                "fitted": fields,
            },
            indent=1,
        )
        + "\n"
    )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("fit", type=Path, nargs="+", help="sim_gpu_isolated live files to fit on (one host)")
    parser.add_argument(
        "--held-out", type=Path, nargs="*", default=[], help="live files scored, never fitted"
    )
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument(
        "--offset",
        choices=OFFSETS,
        default="none",
        help="take each file's per-request cost outside the step off its live times (see above)",
    )
    parser.add_argument("--write-calibration", action="store_true")
    args = parser.parse_args()
    for path in (*args.fit, *args.held_out):
        if not path.is_file():
            raise SystemExit(f"no such live file: {path}")
    result = run([p.resolve() for p in args.fit], [p.resolve() for p in args.held_out], offset=args.offset)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"chosen: {result['chosen_form']} {result['chosen']['parameters']} (95%: {result['chosen']['ci95']})"
    )
    for form, f in result["forms"].items():
        print(
            f"  {form:>20}: {f['parameters']}, FIT msle {f['fit_loss_msle']:.4f}, MAPE {f['fit_mape']:.3f}, "
            f"held out {f['held_out_mape']}"
        )
    if args.write_calibration:
        print(f"wrote {write_calibration(result, args.out.resolve())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
