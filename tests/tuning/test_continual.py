"""The continual loop's decisions, without an engine: drift, erosion, live-like traffic, canary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.metrics import Histogram
from tests.tuning.workload_factories import BOUNDS
from tuning.continual import (
    LiveWindow,
    bucketed,
    canary,
    detect_drift,
    live_profile,
    regressed,
    slo_erosion,
    synthesize_live,
    tuned_for_profile,
)
from tuning.workload import ingest_path


def _workload(path: Path, prompts: np.ndarray, outputs: np.ndarray, rate: float) -> Path:
    with path.open("w") as f:
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
            f.write(
                json.dumps(
                    {"timestamp": int(i * 1000 / rate), "input_length": int(p), "output_length": int(o)}
                )
                + "\n"
            )
    return path


def _windows(prompts: np.ndarray, outputs: np.ndarray, rate: float, *, hit: float = 0.0) -> list[LiveWindow]:
    """Live windows of 15 s as the engine's metrics would report this traffic."""
    per = max(1, int(rate * 15))
    out = []
    for start in range(0, len(prompts), per):
        p, o = prompts[start : start + per], outputs[start : start + per]
        out.append(
            LiveWindow(
                interval_s=15.0,
                num_requests=float(len(p)),
                prompt_tokens=bucketed(p, BOUNDS),
                output_tokens=bucketed(o, BOUNDS),
                prefix_queries_tokens=float(p.sum()),
                prefix_hits_tokens=float(p.sum() * hit),
                ttft_p95_ms=500.0,
            )
        )
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_same_traffic_does_not_drift_and_long_prompts_do(rng: np.random.Generator, tmp_path: Path) -> None:
    prompts = rng.integers(100, 900, size=300)
    outputs = rng.integers(20, 200, size=300)
    tuned = tuned_for_profile(
        _workload(tmp_path / "w.jsonl", prompts, outputs, rate=3.0),
        prompt_bounds=BOUNDS,
        output_bounds=BOUNDS,
        max_prompt_tokens=None,
        max_output_tokens=None,
        prefix_hit_rate=0.0,
    )
    # The same traffic, seen live (other draws of the same distribution).
    same = live_profile(_windows(rng.integers(100, 900, size=300), rng.integers(20, 200, size=300), 3.0))
    assert same is not None and same.num_requests == 300
    quiet = detect_drift(tuned, same)
    assert not quiet.drifted, quiet.summary
    # Long prompts with heavy prefix reuse at the same rate (the Mooncake shift).
    long = live_profile(
        _windows(rng.integers(1000, 2000, size=300), rng.integers(20, 200, size=300), 3.0, hit=0.6)
    )
    assert long is not None and long.prefix.reuse_ratio == pytest.approx(0.6)
    report = detect_drift(tuned, long)
    assert report.drifted
    drifted = {d.dimension for d in report.dimensions if d.drifted}
    assert "input_tokens" in drifted and "prefix_reuse" in drifted
    assert "output_tokens" not in drifted


def test_tuned_for_profile_caps_lengths_as_the_trials_did(rng: np.random.Generator, tmp_path: Path) -> None:
    prompts = rng.integers(2000, 4000, size=50)
    path = _workload(tmp_path / "w.jsonl", prompts, np.full(50, 100), rate=2.0)
    capped = tuned_for_profile(
        path,
        prompt_bounds=BOUNDS,
        output_bounds=BOUNDS,
        max_prompt_tokens=512,
        max_output_tokens=32,
        prefix_hit_rate=None,
    )
    # Means are exact; percentiles are read from the buckets, as they are for live traffic.
    assert capped.input_tokens.mean == pytest.approx(512) and capped.output_tokens.mean == pytest.approx(32)
    assert capped.input_tokens.max <= 1000
    assert capped.arrival.mean_rps == pytest.approx(2.0, rel=0.05)


def test_no_live_profile_without_requests() -> None:
    empty = LiveWindow(15.0, 0.0, Histogram.empty(), Histogram.empty(), 0.0, 0.0)
    assert live_profile([empty]) is None
    with pytest.raises(ValueError, match="nothing to synthesise"):
        synthesize_live([empty], duration_s=10, rng=np.random.default_rng(0), out=Path("/nonexistent"))


def test_slo_erosion() -> None:
    assert slo_erosion([None, 100.0], 1000.0) is None  # too little evidence
    assert slo_erosion([500.0, 520.0, 510.0, 505.0], 1000.0) is None  # steady, far from the target
    rising = slo_erosion([700.0, 800.0, 850.0, 950.0], 1000.0)
    assert rising is not None and "rising" in rising
    broken = slo_erosion([400.0, 1200.0, 1300.0], 1000.0)
    assert broken is not None and "twice in a row" in broken
    assert slo_erosion([900.0, 850.0, 820.0, 810.0], 1000.0) is None  # high but falling


def test_live_like_traffic_keeps_rate_lengths_and_prefix_reuse(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    prompts, outputs = rng.integers(1100, 1900, size=400), rng.integers(50, 90, size=400)
    windows = _windows(prompts, outputs, 4.0, hit=0.5)
    out = tmp_path / "live.jsonl"
    n = synthesize_live(windows, duration_s=60.0, rng=np.random.default_rng(1), out=out)
    assert n == pytest.approx(240, rel=0.05)
    sample = ingest_path(out, trace_format="mooncake")
    p = sample.profile
    assert p.arrival.mean_rps == pytest.approx(4.0, rel=0.1)
    assert 1000 <= p.input_tokens.p50 <= 2000  # drawn within the live buckets
    assert 50 <= p.output_tokens.p50 <= 100
    # Shared leading blocks reproduce roughly the live hit rate (cold misses pull it down a bit).
    assert p.prefix.reuse_ratio is not None and 0.3 <= p.prefix.reuse_ratio <= 0.6


def _result(p50: float, p95: float, *, slo: bool = True, gates: bool = True) -> dict[str, object]:
    return {
        "status": "ok",
        "ttft_p50_ms": p50,
        "ttft_p95_ms": p95,
        "slo_met": slo,
        "correctness": {"passed": gates},
        "reliability": {"passed": True},
    }


def test_canary_promotes_only_a_clear_gatepassing_win() -> None:
    assert canary(_result(400, 900), _result(600, 1000)).promote
    small = canary(_result(570, 950), _result(600, 1000))
    assert not small.promote and "noise" in small.reason
    assert not canary(_result(400, 1200), _result(600, 1000)).promote  # worse tail
    assert not canary(_result(300, 500, gates=False), _result(600, 1000)).promote
    assert not canary(_result(300, 500, slo=False), _result(600, 1000)).promote
    rescue = canary(_result(900, 2000), _result(3000, 9000, slo=False))
    assert rescue.promote and "does not" in rescue.reason
    assert not canary(None, _result(600, 1000)).promote
    assert not canary(_result(300, 500), None).promote


def test_regression_needs_a_clear_margin() -> None:
    assert regressed([1000.0], [1500.0, 1400.0])
    assert not regressed([1000.0], [1100.0, 1150.0])
    assert not regressed([None], [5000.0])  # nothing to compare with


def test_live_like_traffic_keeps_the_live_mean_length_when_prompts_pile_up_at_a_cap(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    # As the continual-loop benchmark's Mooncake traffic: a third of the prompts cut at 1,900
    # tokens, the rest spread below; a uniform draw inside vLLM's (1000, 2000] bucket would put
    # the cut ones at 1,500 on average and make the re-tuning traffic far lighter than live.
    prompts = np.concatenate([np.full(150, 1900), rng.integers(200, 1900, size=300)])
    rng.shuffle(prompts)
    outputs = np.concatenate([np.full(300, 32), rng.integers(3, 32, size=150)])
    windows = _windows(prompts, outputs, 2.0)
    out = tmp_path / "live.jsonl"
    synthesize_live(windows, duration_s=600.0, rng=np.random.default_rng(2), out=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    drawn = np.array([r["input_length"] for r in rows])
    assert drawn.mean() == pytest.approx(prompts.mean(), rel=0.03)
    assert np.mean([r["output_length"] for r in rows]) == pytest.approx(outputs.mean(), rel=0.03)
    # Still inside the live buckets, in the live shares.
    live_share = np.mean(prompts > 1000)
    assert np.mean(drawn > 1000) == pytest.approx(live_share, abs=0.05)
    assert drawn.max() <= 2000 and drawn.min() >= 100
