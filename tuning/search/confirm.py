"""Confirmation: the search explores, this decides, with intervals.

The search measures each candidate once, on one engine, which is enough to rank but not to sign
a number. After it, the finalists, the competent baseline and the naive defaults are measured
again in interleaved rounds (A B C, B C A, C A B, ...; a fresh engine for every block, the same
synthesised traffic), and every figure carries a bootstrap 95% interval:

- the bootstrap is two-level: blocks (engines) are resampled, then the requests inside each drawn
  block, so the interval carries both engine-to-engine and request-to-request noise;
- a ratio to the baseline (candidate / baseline) is computed inside each bootstrap round, so its
  interval is the ratio's own, not a ratio of intervals;
- with a handful of engines a bootstrap over blocks is known to be too narrow (it cannot see
  spread that 3 blocks do not happen to show), so every interval is widened to the Student-t
  interval over the blocks' own figures (log scale, Welch's degrees of freedom) where that is
  wider: a difference between two engines of one configuration is then not called a gain;
- a finalist is declared the winner only when the interval of its p50 TTFT ratio lies below 1, or
  of its sustainable-rate ratio above 1, and the other figure is not significantly worse.
  Otherwise the outcome is "no significant gain: keep the baseline", an honest result.

The leave-one-out ablation of the winner's changed knobs uses the same machinery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

BOOTSTRAP_ROUNDS = 2000
COMPETENT = "competent"  # vLLM's defaults plus the host's fastest dtype: the baseline gains are against
NAIVE = "naive"  # vLLM started with no flags at all, shown beside, labelled


@dataclass(frozen=True)
class Block:
    """One fresh-engine measurement of one subject in a confirmation round."""

    subject: str
    round: int
    trial: int  # the job's trial number
    ttft_ms: tuple[float, ...] = field(repr=False)  # the block's TTFT sample at the target rate
    tpot_p50_ms: float
    sustainable_multiple: float
    slo_met: bool
    gates_passed: bool
    contended: bool


def block_from_result(subject: str, round_: int, trial: int, result: Mapping[str, Any]) -> Block | None:
    """A trial result as a block, or None for a failed trial (it carries no measurement)."""
    if result.get("status") != "ok" or not result.get("ttft_sample_ms"):
        return None
    correctness = result.get("correctness") or {}
    reliability = result.get("reliability") or {}
    tpot = result.get("tpot_p50_ms")
    return Block(
        subject=subject,
        round=round_,
        trial=trial,
        ttft_ms=tuple(float(v) for v in result["ttft_sample_ms"]),
        tpot_p50_ms=math.nan if tpot is None else float(tpot),
        sustainable_multiple=float(result.get("sustainable_multiple") or 0.0),
        slo_met=bool(result.get("slo_met")),
        gates_passed=bool(correctness.get("passed")) and bool(reliability.get("passed")),
        contended=bool(result.get("contended")),
    )


def _stats(blocks: Sequence[Block]) -> dict[str, float]:
    """p50/p95 TTFT pooled over the blocks, mean TPOT and mean sustainable multiple."""
    values = np.concatenate([np.asarray(b.ttft_ms, dtype=np.float64) for b in blocks])
    tpots = [b.tpot_p50_ms for b in blocks if not math.isnan(b.tpot_p50_ms)]
    return {
        "ttft_p50_ms": float(np.percentile(values, 50)),
        "ttft_p95_ms": float(np.percentile(values, 95)),
        "tpot_p50_ms": float(np.mean(tpots)) if tpots else math.nan,
        "sustainable_multiple": float(np.mean([b.sustainable_multiple for b in blocks])),
    }


def _draws(blocks: Sequence[Block], rng: np.random.Generator, rounds: int) -> dict[str, np.ndarray]:
    """`rounds` two-level bootstrap replicates of each figure: the blocks drawn with replacement,
    then the requests inside each drawn block, pooled (vectorised: one matrix per draw)."""
    k = len(blocks)
    sizes = np.array([len(b.ttft_ms) for b in blocks])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    values = np.concatenate([np.asarray(b.ttft_ms, dtype=np.float64) for b in blocks])
    width = int(sizes.max())
    picks = rng.integers(0, k, size=(rounds, k))
    pooled = np.full((rounds, k * width), np.inf)
    for j in range(k):
        n = sizes[picks[:, j]][:, None]
        idx = starts[picks[:, j]][:, None] + np.floor(rng.random((rounds, width)) * n).astype(np.int64)
        valid = np.arange(width)[None, :] < n
        pooled[:, j * width : (j + 1) * width] = np.where(
            valid, values[np.minimum(idx, values.size - 1)], np.inf
        )
    pooled.sort(axis=1)  # the padding (inf) sorts last
    count = sizes[picks].sum(axis=1)

    def quantile(q: float) -> np.ndarray:
        # numpy's linear method over each row's first `count` values
        pos = (count - 1) * q
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, count - 1)
        rows = np.arange(rounds)
        return pooled[rows, lo] + (pooled[rows, hi] - pooled[rows, lo]) * (pos - lo)

    tpot = np.array([b.tpot_p50_ms for b in blocks])
    rate = np.array([b.sustainable_multiple for b in blocks])
    with np.errstate(invalid="ignore"):
        tpot_draws = np.nanmean(tpot[picks], axis=1) if np.isfinite(tpot).any() else np.full(rounds, np.nan)
    return {
        "ttft_p50_ms": quantile(0.5),
        "ttft_p95_ms": quantile(0.95),
        "tpot_p50_ms": tpot_draws,
        "sustainable_multiple": rate[picks].mean(axis=1),
    }


FIGURES = ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "sustainable_multiple")


@dataclass(frozen=True)
class Estimate:
    value: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else round(v, 4)) for k, v in asdict(self).items()}

    @property
    def below_one(self) -> bool:
        return self.ci_high < 1.0

    @property
    def above_one(self) -> bool:
        return self.ci_low > 1.0


def _interval(samples: np.ndarray, point: float) -> Estimate:
    arr = samples[np.isfinite(samples)]
    if arr.size < 10:
        return Estimate(point, math.nan, math.nan)
    low, high = np.percentile(arr, [2.5, 97.5])
    return Estimate(point, float(low), float(high))


# Student's t, 97.5th percentile, by degrees of freedom (1..30); beyond 30 the normal's 1.96
# is within 4%, and 2.04 (df 30) is used to stay on the wide side.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t975(df: float) -> float:
    return _T975[min(max(math.floor(df), 1), len(_T975)) - 1]


def _block_logs(blocks: Sequence[Block], figure: str) -> np.ndarray:
    """Each block's own value of `figure`, on a log scale (ratios become differences)."""
    values = np.array([_stats([b])[figure] for b in blocks], dtype=np.float64)
    values = values[np.isfinite(values) & (values > 0)]
    return np.log(values)


def _t_log_interval(a: np.ndarray, b: np.ndarray | None) -> tuple[float, float] | None:
    """95% Student-t interval of mean(a) - mean(b) (or of mean(a)), Welch's df; None when a side
    has fewer than two blocks."""
    if a.size < 2 or (b is not None and b.size < 2):
        return None
    va = float(np.var(a, ddof=1)) / a.size
    if b is None:
        center, var, df = float(a.mean()), va, float(a.size - 1)
    else:
        vb = float(np.var(b, ddof=1)) / b.size
        center, var = float(a.mean() - b.mean()), va + vb
        denom = (va**2 / (a.size - 1) if va else 0.0) + (vb**2 / (b.size - 1) if vb else 0.0)
        df = var**2 / denom if denom > 0 else float(a.size + b.size - 2)
    half = _t975(df) * math.sqrt(var)
    return center - half, center + half


def _widen(est: Estimate, log_interval: tuple[float, float] | None) -> Estimate:
    if log_interval is None or math.isnan(est.ci_low):
        return est
    low, high = math.exp(log_interval[0]), math.exp(log_interval[1])
    return Estimate(est.value, min(est.ci_low, low), max(est.ci_high, high))


def estimate(
    blocks: Sequence[Block], rng: np.random.Generator, rounds: int = BOOTSTRAP_ROUNDS
) -> dict[str, Estimate]:
    """Each figure of one subject with its 95% interval (two-level bootstrap, widened to the
    t interval over blocks where that is wider)."""
    point = _stats(blocks)
    draws = _draws(blocks, rng, rounds)
    out = {}
    for f in FIGURES:
        est = _interval(draws[f], point[f])
        logs = _block_logs(blocks, f)
        if logs.size >= 2 and point[f] > 0:
            # Centred on the pooled figure: the blocks' spread, not their mean, widens it.
            t = _t_log_interval(logs - logs.mean() + math.log(point[f]), None)
            est = _widen(est, t)
        out[f] = est
    return out


def ratio(
    candidate: Sequence[Block],
    baseline: Sequence[Block],
    rng: np.random.Generator,
    rounds: int = BOOTSTRAP_ROUNDS,
) -> dict[str, Estimate]:
    """candidate / baseline for each figure: the interval from paired bootstrap rounds, widened
    to the Welch t interval of the blocks' log figures where that is wider."""
    pc, pb = _stats(candidate), _stats(baseline)
    dc, db = _draws(candidate, rng, rounds), _draws(baseline, rng, rounds)
    result = {}
    for f in FIGURES:
        point = pc[f] / pb[f] if pb[f] > 0 else math.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            est = _interval(np.where(db[f] > 0, dc[f] / db[f], np.nan), point)
        ca, cb = _block_logs(candidate, f), _block_logs(baseline, f)
        t = _t_log_interval(ca, cb)
        if t is not None and math.isfinite(point) and point > 0:
            # Centred on the pooled ratio; its width from the blocks' spread.
            shift = math.log(point) - (float(ca.mean() - cb.mean()))
            t = (t[0] + shift, t[1] + shift)
        result[f] = _widen(est, t)
    return result


# Figures where a higher ratio to the baseline is worse (the tail and per-token latency): a
# candidate that is significantly worse on one of them is not a gain, whatever its p50.
GUARDED = {"ttft_p95_ms": "p95 TTFT", "tpot_p50_ms": "p50 TPOT"}


def significant_regressions(r: Mapping[str, Estimate]) -> list[str]:
    """The guarded figures on which `r` (candidate / baseline ratios) is significantly worse:
    the interval's low end above 1."""
    out = []
    for key, label in GUARDED.items():
        e = r.get(key)
        if e is not None and e.above_one:
            out.append(f"{label} {e.value:.2f}x the baseline (95% interval {e.ci_low:.2f}-{e.ci_high:.2f})")
    return out


def significant_gain(r: Mapping[str, Estimate]) -> str | None:
    """Why `r` (candidate / baseline ratios) is a gain, or None when it is not one.

    Faster first tokens with capacity not significantly lower, or more capacity with first tokens
    not significantly slower; in both cases with the tail (p95 TTFT) and per-token time (TPOT) not
    significantly worse."""
    ttft, rate = r["ttft_p50_ms"], r["sustainable_multiple"]
    rate_worse = rate.below_one
    ttft_worse = ttft.above_one
    if significant_regressions(r):
        return None
    if ttft.below_one and not rate_worse:
        return f"p50 TTFT {ttft.value:.3f}x the baseline (95% interval {ttft.ci_low:.3f}-{ttft.ci_high:.3f})"
    if rate.above_one and not ttft_worse:
        return f"sustains {rate.value:.2f}x the baseline's rate (95% interval {rate.ci_low:.2f}-{rate.ci_high:.2f})"
    return None


@dataclass(frozen=True)
class SubjectResult:
    subject: str
    assignment: dict[str, Any]
    blocks: int  # uncontended, successful blocks behind the figures
    excluded: tuple[str, ...]  # why blocks were left out (failed, contended)
    figures: dict[str, Estimate]
    vs_competent: dict[str, Estimate] | None
    vs_naive: dict[str, Estimate] | None
    slo_met_blocks: int
    gates_passed_blocks: int
    trials: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        def pack(d: Mapping[str, Estimate] | None) -> dict[str, Any] | None:
            return None if d is None else {k: v.to_dict() for k, v in d.items()}

        return {
            "subject": self.subject,
            "assignment": self.assignment,
            "blocks": self.blocks,
            "excluded": list(self.excluded),
            "figures": pack(self.figures),
            "vs_competent": pack(self.vs_competent),
            "vs_naive": pack(self.vs_naive),
            "slo_met_blocks": self.slo_met_blocks,
            "gates_passed_blocks": self.gates_passed_blocks,
            "trials": list(self.trials),
        }


MIN_BLOCKS = 2  # fewer uncontended blocks of a subject and no interval is claimed for it


def evaluate(
    blocks: Sequence[Block | tuple[str, str]],
    assignments: Mapping[str, dict[str, Any]],
    *,
    seed: int,
    rounds: int = BOOTSTRAP_ROUNDS,
) -> dict[str, SubjectResult]:
    """Figures and ratios for every subject. `blocks` holds measured blocks and, for blocks that
    do not count, (subject, why) pairs."""
    rng = np.random.default_rng(seed)
    usable: dict[str, list[Block]] = {s: [] for s in assignments}
    excluded: dict[str, list[str]] = {s: [] for s in assignments}
    for b in blocks:
        if isinstance(b, tuple):
            excluded.setdefault(b[0], []).append(b[1])
        elif b.contended:
            excluded.setdefault(b.subject, []).append(f"trial {b.trial}: contended (foreign CPU load)")
        else:
            usable.setdefault(b.subject, []).append(b)
    out = {}
    for subject, assignment in assignments.items():
        mine = usable.get(subject, [])
        enough = len(mine) >= MIN_BLOCKS
        competent = usable.get(COMPETENT, [])
        naive = usable.get(NAIVE, [])
        out[subject] = SubjectResult(
            subject=subject,
            assignment=dict(assignment),
            blocks=len(mine),
            excluded=tuple(excluded.get(subject, ())),
            figures=estimate(mine, rng, rounds) if mine else {},
            vs_competent=(
                ratio(mine, competent, rng, rounds)
                if enough and subject != COMPETENT and len(competent) >= MIN_BLOCKS
                else None
            ),
            vs_naive=(
                ratio(mine, naive, rng, rounds)
                if enough and subject != NAIVE and len(naive) >= MIN_BLOCKS
                else None
            ),
            slo_met_blocks=sum(b.slo_met for b in mine),
            gates_passed_blocks=sum(b.gates_passed for b in mine),
            trials=tuple(b.trial for b in mine),
        )
    return out


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "gain" or "no_significant_gain"
    winner: str  # the subject to deploy (COMPETENT when there is no significant gain)
    line: str  # one sentence a person reads


def decide(results: Mapping[str, SubjectResult], finalists: Sequence[str]) -> Verdict:
    """The finalist with a significant gain over the competent baseline (the largest p50 TTFT
    gain among several), or the baseline."""
    gains: list[tuple[float, str, str]] = []
    notes: list[str] = []
    for name in finalists:
        res = results.get(name)
        if res is None or res.vs_competent is None:
            notes.append(f"{name}: too few uncontended blocks to compare")
            continue
        if res.gates_passed_blocks < res.blocks:
            notes.append(f"{name}: failed a gate in {res.blocks - res.gates_passed_blocks} block(s)")
            continue
        why = significant_gain(res.vs_competent)
        if why is None:
            t = res.vs_competent["ttft_p50_ms"]
            worse = significant_regressions(res.vs_competent)
            notes.append(
                f"{name}: p50 TTFT {t.value:.3f}x (95% interval {t.ci_low:.3f}-{t.ci_high:.3f})"
                + (f", significantly worse: {', '.join(worse)}" if worse else "")
            )
            continue
        gains.append((res.vs_competent["ttft_p50_ms"].value, name, why))
    if not gains:
        detail = "; ".join(notes) or "no finalist beyond the baseline"
        return Verdict(
            "no_significant_gain",
            COMPETENT,
            f"No significant gain: keep the baseline (vLLM defaults with the host's fastest dtype). {detail}.",
        )
    gains.sort()
    _, name, why = gains[0]
    return Verdict("gain", name, f"{name} beats the competent baseline: {why}.")


def ablation_shares(
    winner: Mapping[str, Estimate], reverted: Mapping[str, Mapping[str, Estimate]]
) -> dict[str, dict[str, Any]]:
    """For each knob reverted alone: its p50 TTFT ratio to the baseline, and the share of the
    winner's gain (1 - ratio) lost by reverting it."""
    gain = 1.0 - winner["ttft_p50_ms"].value
    out = {}
    for knob, r in reverted.items():
        t = r["ttft_p50_ms"]
        lost = (t.value - winner["ttft_p50_ms"].value) / gain if gain > 0 else math.nan
        out[knob] = {
            "ttft_p50_ratio_vs_competent": t.to_dict(),
            "share_of_gain": None if math.isnan(lost) else round(lost, 3),
        }
    return out
