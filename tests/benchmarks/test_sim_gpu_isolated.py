"""The isolated-request benchmark's scoring and input checks, on simulated "live" requests."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import sim_gpu_isolated
from serving.catalog.hardware import get_hardware
from serving.catalog.models import model_spec_from_dir
from serving.perf.model import nearest_measured
from tests.benchmarks.test_sim_rank_gpu import LLAMA_3B

LENGTHS = (512, 2048, 8192)
METHOD = {
    "max_model_len": 16384,
    "lengths": list(LENGTHS),
    "repeats": 3,
    "output_tokens": 32,
    "spacing_s": 2.0,
}


def _live_file(tmp_path: Path, *, ttft_scale: float) -> Path:
    """A live file whose requests took the simulator's own times (TTFT times `ttft_scale`)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_3B))
    model = model_spec_from_dir(model_dir)
    eff, _ = nearest_measured(get_hardware("h200"))
    live = {"benchmark": "sim_gpu_isolated_live", "method": METHOD, "model_config": LLAMA_3B}
    lengths = []
    for n in LENGTHS:
        p = sim_gpu_isolated.predict_length(model, "h200", eff, {"prompt_tokens": n}, live)
        lengths.append(
            {
                "prompt_tokens": n,
                "requests": 3,
                "errors": 0,
                "ttft_ms": [p["ttft_p50_ms"] * ttft_scale] * 3,
                "tpot_ms": [p["tpot_p50_ms"]] * 3,
                "engine": {
                    "ttft_mean_ms": p["ttft_p50_ms"],
                    "queue_mean_ms": 0.0,
                    "prefill_mean_ms": p["prefill_mean_ms"],
                    "prefix_cache_hit_rate": 0.0,
                },
            }
        )
    live.update(
        {
            "when": "2030-01-01T00:00:00+00:00",
            "machine": {"gpu": "NVIDIA H200, 143771 MiB"},
            "versions": {},
            "model": "llama-3.2-3b",
            "lengths": lengths,
        }
    )
    out = tmp_path / "live.json"
    out.write_text(json.dumps(live))
    return out


def test_requests_that_took_the_simulated_times_score_ratios_of_one(tmp_path: Path) -> None:
    live = _live_file(tmp_path, ttft_scale=1.0)
    out = tmp_path / "scored.json"
    assert sim_gpu_isolated.score(argparse.Namespace(live=live, out=out)) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["ttft_p50_mape_as_stored"] == pytest.approx(0.0, abs=1e-9)
    assert summary["tpot_p50_mape_as_stored"] == pytest.approx(0.0, abs=1e-9)
    assert summary["engine_prefill_ms_per_1k_tokens"] == pytest.approx(
        summary["sim_prefill_ms_per_1k_tokens_as_stored"]
    )
    # Prefill time grows with the prompt. The stored calibration's per-prompt-token cost lies
    # before the engine: without it the TTFT grows more slowly, the engine's prefill not at all.
    assert result["stored_per_token_costs_ms"]["prompt_token_overhead_ms"] > 0
    assert (
        summary["sim_ttft_ms_per_1k_tokens_as_stored"]
        > summary["sim_ttft_ms_per_1k_tokens_without_prompt_token_overhead"]
        > 0
    )
    assert summary["sim_prefill_ms_per_1k_tokens_without_prompt_token_overhead"] == pytest.approx(
        summary["sim_prefill_ms_per_1k_tokens_as_stored"]
    )
    # The live requests' time outside the engine: here the simulator's own, TTFT less prefill.
    assert summary["outside_engine_ms_per_1k_tokens"] == pytest.approx(
        summary["sim_ttft_ms_per_1k_tokens_as_stored"] - summary["sim_prefill_ms_per_1k_tokens_as_stored"]
    )
    assert summary["engine_prefill_mape_as_stored"] == pytest.approx(0.0, abs=1e-9)
    row = result["rows"][-1]
    assert row["sim_over_live_as_stored"]["ttft_p50_ms"]["value"] == pytest.approx(1.0)
    assert result["hardware"] == "h200" and result["prediction"].startswith("measured on h200")
    # each length's prefill over the steps its chunks took at the budget (vLLM's default here)
    budget = sim_gpu_isolated.simulated_budget(json.loads(live.read_text()), "h200")
    for r in result["rows"]:
        assert r["prefill_steps"] == -(-r["prompt_tokens"] // budget)
        per_step = r["engine_prefill_ms_per_step"]
        assert per_step["live"] == pytest.approx(r["live"]["engine_prefill_mean_ms"] / r["prefill_steps"])
        assert per_step["as_stored"] == pytest.approx(per_step["live"])


def test_a_slower_engine_shows_as_a_ratio_below_one(tmp_path: Path) -> None:
    live = _live_file(tmp_path, ttft_scale=2.0)
    out = tmp_path / "scored.json"
    sim_gpu_isolated.score(argparse.Namespace(live=live, out=out))
    result = json.loads(out.read_text())
    assert all(
        r["sim_over_live_as_stored"]["ttft_p50_ms"]["value"] == pytest.approx(0.5) for r in result["rows"]
    )
    assert result["summary"]["ttft_p50_mape_as_stored"] == pytest.approx(0.5)


def test_bad_lengths_are_refused_with_the_bounds() -> None:
    with pytest.raises(SystemExit, match="comma-separated"):
        sim_gpu_isolated._parse_lengths("1k,2k", 32768, 128)
    with pytest.raises(SystemExit, match=r"each in \[16, 32640\]"):
        sim_gpu_isolated._parse_lengths("512,40000", 32768, 128)
    with pytest.raises(SystemExit, match="1 to 12 lengths"):
        sim_gpu_isolated._parse_lengths(",".join(str(100 + i) for i in range(13)), 32768, 128)
    assert sim_gpu_isolated._parse_lengths("4096,256,256", 32768, 128) == [256, 4096]


def test_every_summary_figure_has_an_interval_around_it(tmp_path: Path) -> None:
    live = _live_file(tmp_path, ttft_scale=1.5)
    out = tmp_path / "scored.json"
    sim_gpu_isolated.score(argparse.Namespace(live=live, out=out))
    summary = json.loads(out.read_text())["summary"]
    figures = [k for k in summary if not k.endswith(("_ci_low", "_ci_high"))]
    assert figures
    for k in figures:
        assert summary[f"{k}_ci_low"] - 1e-9 <= summary[k] <= summary[f"{k}_ci_high"] + 1e-9, k


def test_an_earlier_live_fit_given_scores_in_place_of_the_stored_one(tmp_path: Path) -> None:
    from serving.perf.model import DATA_DIR

    live = _live_file(tmp_path, ttft_scale=1.0)
    stored_out, given_out = tmp_path / "stored.json", tmp_path / "given.json"
    sim_gpu_isolated.score(argparse.Namespace(live=live, out=stored_out))
    # The stored fit given explicitly scores the same; a fit without its costs scores otherwise.
    fit = DATA_DIR / "h200_live.json"
    sim_gpu_isolated.score(argparse.Namespace(live=live, out=given_out, live_fit=fit))
    stored, given = json.loads(stored_out.read_text()), json.loads(given_out.read_text())
    assert given["summary"] == stored["summary"]
    assert given["live_fit_given"]["path"] == str(fit) and given["calibration_files"] is None
    bare = tmp_path / "bare_fit.json"
    bare.write_text(json.dumps({"fitted": {"request_overhead_ms": 1.0}}))
    bare_out = tmp_path / "bare.json"
    sim_gpu_isolated.score(argparse.Namespace(live=live, out=bare_out, live_fit=bare))
    assert json.loads(bare_out.read_text())["summary"]["ttft_p50_mape_as_stored"] > 0.05


def test_a_token_budget_is_bounded_and_recorded_for_the_engine() -> None:
    assert sim_gpu_isolated.budget_knobs(None, 32768) == {}
    assert sim_gpu_isolated.budget_knobs(1024, 32768) == {"max_num_batched_tokens": 1024}
    with pytest.raises(SystemExit, match=r"must be in \[256, 32768\]"):
        sim_gpu_isolated.budget_knobs(100, 32768)
    with pytest.raises(SystemExit, match=r"must be in \[256, 16384\]"):
        sim_gpu_isolated.budget_knobs(20000, 16384)


def test_a_smaller_budget_is_predicted_in_more_prefill_steps(tmp_path: Path) -> None:
    """A run at a token budget is predicted at that budget: a prompt four times the budget takes
    four chunked steps, each with the step's fixed costs, so its prefill is predicted longer."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_3B))
    model = model_spec_from_dir(model_dir)
    eff, _ = nearest_measured(get_hardware("h200"))
    entry = {"prompt_tokens": 8192}
    default = sim_gpu_isolated.predict_length(model, "h200", eff, entry, {"method": METHOD})
    budget = sim_gpu_isolated.predict_length(
        model, "h200", eff, entry, {"method": {**METHOD, "max_num_batched_tokens": 2048}}
    )
    assert budget["prefill_mean_ms"] > default["prefill_mean_ms"] > 0
