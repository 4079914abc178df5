"""95% percentile-bootstrap intervals for the figures benchmarks report.

Three shapes of data recur:
- `interval`: independent repeats of one measurement (a run, a block, a page load);
- `ratio_interval`: two arms measured side by side, repeats paired by round (A and B of one
  round share the machine's state), the ratio formed inside each bootstrap draw;
- `pooled_interval`: one long measurement whose requests are grouped into consecutive blocks
  (of time, or of engines); the blocks are resampled whole and their requests pooled, so the
  interval carries the correlation between requests close in time, which a request-level
  bootstrap would hide.

Every function returns {"value", "ci_low", "ci_high"} (None where the data cannot carry one: a
single repeat, or an undefined statistic), rounded for a result file; `summary_figures` lays
them out as a result file's summary wants them (`<figure>`, `<figure>_ci_low`, `<figure>_ci_high`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

ROUNDS = 2000

Figure = dict[str, float | None]
Stat = Callable[[np.ndarray], float]


def _figure(point: float, draws: np.ndarray, digits: int) -> Figure:
    draws = draws[np.isfinite(draws)]
    if not np.isfinite(point):
        return {"value": None, "ci_low": None, "ci_high": None}
    if draws.size < ROUNDS // 2:  # one repeat, or a statistic the draws rarely define
        return {"value": round(float(point), digits), "ci_low": None, "ci_high": None}
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "value": round(float(point), digits),
        "ci_low": round(float(low), digits),
        "ci_high": round(float(high), digits),
    }


def interval(values: Sequence[float], stat: Stat = np.median, *, seed: int = 0, digits: int = 4) -> Figure:
    """`stat` of independent repeats with its interval (the repeats resampled)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return _figure(float(stat(arr)) if arr.size else float("nan"), np.empty(0), digits)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, arr.size, size=(ROUNDS, arr.size))
    draws = np.array([stat(arr[p]) for p in picks], dtype=np.float64)
    return _figure(float(stat(arr)), draws, digits)


def ratio_interval(
    a: Sequence[float], b: Sequence[float], stat: Stat = np.median, *, seed: int = 0, digits: int = 4
) -> Figure:
    """stat(a) / stat(b) for repeats paired by round (a[i] and b[i] measured in round i): the
    rounds are resampled, both arms with the same picks."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size != y.size:
        raise ValueError(f"paired repeats differ in number: {x.size} and {y.size}")
    denominator = float(stat(y)) if y.size else float("nan")
    point = float(stat(x)) / denominator if denominator else float("nan")
    if x.size < 2:
        return _figure(point, np.empty(0), digits)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, x.size, size=(ROUNDS, x.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.array([stat(x[p]) / stat(y[p]) for p in picks], dtype=np.float64)
    return _figure(point, draws, digits)


def pooled_interval(
    blocks: Sequence[Sequence[float]], stat: Stat, *, seed: int = 0, digits: int = 4
) -> Figure:
    """`stat` of all values pooled, with the interval from resampling whole blocks."""
    arrays = [np.asarray(b, dtype=np.float64) for b in blocks]
    everything = np.concatenate(arrays) if arrays else np.empty(0)
    point = float(stat(everything)) if everything.size else float("nan")
    if len(arrays) < 2:
        return _figure(point, np.empty(0), digits)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(arrays), size=(ROUNDS, len(arrays)))
    draws = np.empty(ROUNDS)
    for i, p in enumerate(picks):
        pooled = np.concatenate([arrays[j] for j in p])
        draws[i] = stat(pooled) if pooled.size else np.nan
    return _figure(point, draws, digits)


def pooled_ratio_interval(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    stat: Stat,
    *,
    seed: int = 0,
    digits: int = 4,
) -> Figure:
    """stat(a pooled) / stat(b pooled) for two arms of blocks measured apart (not paired): each
    arm's blocks are resampled on their own, the ratio formed inside each draw."""
    arms = [[np.asarray(x, dtype=np.float64) for x in arm] for arm in (a, b)]
    pooled = [np.concatenate(arm) if arm else np.empty(0) for arm in arms]
    top, bottom = (float(stat(p)) if p.size else float("nan") for p in pooled)
    point = top / bottom if bottom else float("nan")
    if min(len(arm) for arm in arms) < 2:
        return _figure(point, np.empty(0), digits)
    rng = np.random.default_rng(seed)
    draws = np.empty(ROUNDS)
    for i in range(ROUNDS):
        values = []
        for arm in arms:
            drawn = np.concatenate([arm[j] for j in rng.integers(0, len(arm), len(arm))])
            values.append(stat(drawn) if drawn.size else np.nan)
        draws[i] = values[0] / values[1] if values[1] else np.nan
    return _figure(point, draws, digits)


def summary_figures(figures: Mapping[str, Figure]) -> dict[str, float | None]:
    """Figures flattened for a result file's summary: each name, then its interval's ends."""
    out: dict[str, float | None] = {}
    for name, figure in figures.items():
        out[name] = figure["value"]
        out[f"{name}_ci_low"] = figure["ci_low"]
        out[f"{name}_ci_high"] = figure["ci_high"]
    return out
