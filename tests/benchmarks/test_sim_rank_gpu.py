"""The GPU ranking benchmark's scoring and its input checks, on simulated "live" cases."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from benchmarks import sim_rank_gpu
from serving.catalog.models import model_spec_from_dir
from serving.loadgen.traces import read_trace
from serving.sim.api import simulate_trace

# Llama-3.2-3B's shape (config.json fields that decide it), random weights.
LLAMA_3B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
CAPS = {"max_prompt_tokens": 4000, "max_output_tokens": 200, "max_model_len": 4864}
CHOSEN = ("vllm_defaults", "budget_1024", "max_seqs_64")


def _live_file(tmp_path: Path, *, scale: dict[str, float], gpu: str = "NVIDIA H200, 143771 MiB") -> Path:
    """A live file whose every request's TTFT is the simulator's own for that configuration,
    times `scale[config]`, with vLLM's defaults repeated at the group's end."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_3B))
    model = model_spec_from_dir(model_dir)
    group = {"rate_rps": 40.0, "duration_s": 8.0, "seed": 7}
    path = sim_rank_gpu._workload(
        "azure_conv", group["rate_rps"], group["duration_s"], group["seed"], tmp_path
    )
    requests = read_trace(path)
    cases = []
    for name in (*CHOSEN, "vllm_defaults"):
        config = sim_rank_gpu._engine_config(sim_rank_gpu.CONFIGS[name], CAPS["max_model_len"])
        sim = simulate_trace(
            list(requests),
            model=model,
            hardware="h200",
            config=config,
            max_prompt_tokens=CAPS["max_prompt_tokens"],
            max_output_tokens=CAPS["max_output_tokens"],
            seed=group["seed"],
        )
        ttfts = [r.ttft_ms * scale[name] for r in sim.requests if r.ok and r.ttft_ms is not None]
        s = sim.summary
        cases.append(
            {
                "config": name,
                "started_at": "2030-01-01T00:00:00+00:00",
                "requests": s.num_requests,
                "errors": 0,
                "ttft_p50_ms": s.ttft_ms.p50 * scale[name],
                "ttft_p95_ms": s.ttft_ms.p95 * scale[name],
                "tpot_p50_ms": s.tpot_ms.p50,
                "ttft_ms": ttfts,
                "engine": {},
            }
        )
    live = {
        "benchmark": "sim_rank_gpu_live",
        "when": "2030-01-01T00:10:00+00:00",
        "complete": True,
        "machine": {"gpu": gpu},
        "versions": {},
        "model": "llama-3.2-3b",
        "model_config": LLAMA_3B,
        "trace": "azure_conv",
        "caps": CAPS,
        "method": {"configs": {n: sim_rank_gpu.CONFIGS[n] for n in CHOSEN}, "repeated": "vllm_defaults"},
        "groups": {"loaded": {**group, "cases": cases}},
    }
    out = tmp_path / "live.json"
    out.write_text(json.dumps(live))
    return out


def test_live_cases_that_are_the_simulation_score_a_perfect_ranking(tmp_path: Path) -> None:
    live = _live_file(tmp_path, scale=dict.fromkeys(CHOSEN, 1.0))
    out = tmp_path / "scored.json"
    assert sim_rank_gpu.score(argparse.Namespace(live=live, out=out)) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["configs_per_group"] == 3
    assert summary["rank_tau"] == pytest.approx(1.0)
    # among three configurations the predicted best is always in the measured top 3: no figure
    assert summary["top1_agreement_rate"] == 1.0 and summary["top3_hit_rate"] is None
    assert summary["partial_groups"] == 0
    assert summary["p50_ttft_mape"] < 0.01 and summary["blind_p50_ttft_mape"] > 0.1
    # Paired against the blind baseline case by case: better on average, but the best constant
    # is exactly right on one of the three cases, so a resample of that case alone ties: with
    # three cases the interval reaches 0 and no win is claimed.
    assert summary["p50_ttft_mape_minus_blind"] < 0
    assert summary["p50_ttft_mape_minus_blind_ci_high"] >= 0
    assert summary["p50_vs_blind"].startswith("no significant difference")
    assert summary["noise_floor_p50_ttft"] == pytest.approx(0.0)
    assert result["held_out"]["all_cases_after_freeze"] is True
    group = result["groups"]["loaded"]["p50"]
    assert group["measured_order"] == group["predicted_order"]


def test_a_group_cut_short_is_ranked_over_what_it_measured_and_says_so(tmp_path: Path) -> None:
    """Planned four configurations, three measured (the device's time ran out): ranked over the
    three, the missing one named; with two measured it is not ranked and the score refuses."""
    live = _live_file(tmp_path, scale=dict.fromkeys(CHOSEN, 1.0))
    data = json.loads(live.read_text())
    data["complete"] = False
    data["method"]["configs"]["no_prefix_caching"] = sim_rank_gpu.CONFIGS["no_prefix_caching"]
    live.write_text(json.dumps(data))
    out = tmp_path / "scored.json"
    assert sim_rank_gpu.score(argparse.Namespace(live=live, out=out)) == 0
    result = json.loads(out.read_text())
    group = result["groups"]["loaded"]
    assert group["partial"] == {"measured": 3, "planned": 4, "missing": ["no_prefix_caching"]}
    assert group["configs"] == list(CHOSEN) and result["summary"]["partial_groups"] == 1
    assert result["summary"]["rank_tau"] == pytest.approx(1.0)
    cases = data["groups"]["loaded"]["cases"]
    data["groups"]["loaded"]["cases"] = [c for c in cases if c["config"] != "max_seqs_64"]
    live.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="no group has 3 or more configurations measured"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=out))


def test_a_live_ranking_the_simulator_inverts_scores_a_negative_tau(tmp_path: Path) -> None:
    """Measured TTFTs scaled so the order reverses: tau -1, and the predicted best is last."""
    live = _live_file(tmp_path, scale={"vllm_defaults": 1000.0, "budget_1024": 1.0, "max_seqs_64": 0.001})
    out = tmp_path / "scored.json"
    sim_rank_gpu.score(argparse.Namespace(live=live, out=out))
    summary = json.loads(out.read_text())["summary"]
    assert summary["rank_tau"] == pytest.approx(-1.0)
    assert summary["top1_agreement_rate"] == 0.0
    # A thousand times the prediction is beyond what steps 1.5x as costly give; a thousandth is
    # below the calibration's own prediction.
    assert summary["slower_band"] == [1.25, 1.5]
    assert summary["p50_ttft_beyond_slower_band"] == ["loaded/vllm_defaults"]


def test_each_case_is_predicted_with_slower_steps_and_placed_against_that_band(tmp_path: Path) -> None:
    """The live cases are the simulation: each lies at the band's bottom (inside it), and the
    slower predictions grow with the step cost; a case measured 10x its prediction lies beyond."""
    live = _live_file(tmp_path, scale={"vllm_defaults": 1.0, "budget_1024": 10.0, "max_seqs_64": 1.0})
    out = tmp_path / "scored.json"
    sim_rank_gpu.score(argparse.Namespace(live=live, out=out))
    result = json.loads(out.read_text())
    for row in result["rows"]:
        band = row["sim_if_slower"]
        assert row["sim"]["ttft_p50_ms"] < band["1.25"]["ttft_p50_ms"] < band["1.5"]["ttft_p50_ms"]
        expected = "beyond" if row["config"] == "budget_1024" else "inside"
        assert band["measured_p50"] == expected, row["config"]
        # the simulated engine's steps, to set beside the live engine's
        sim = row["sim"]
        assert sim["steps"] > 0 and 1 <= sim["step_tokens_mean"] <= 8192 and sim["step_mean_ms"] > 0
        # those vLLM's histogram records: only steps that sample, each prompt's computed tokens
        assert 0 < sim["sampled_steps"] <= sim["steps"]
        assert (
            sim["sampled_step_tokens_mean"] * sim["sampled_steps"]
            >= sim["step_tokens_mean"] * sim["steps"] - 1e-6
        )
        # the first request, on an idle engine, is the simulation's own here
        first = row["first_request_ttft_ms"]
        expected_ratio = 10.0 if row["config"] == "budget_1024" else 1.0
        assert first["live_over_sim"] == pytest.approx(expected_ratio, rel=1e-3), row["config"]
    assert result["summary"]["p50_ttft_beyond_slower_band"] == ["loaded/budget_1024"]


def test_an_h100_run_is_scored_on_its_profile_beside_the_what_if_and_an_uncalibrated_gpu_is_refused(
    tmp_path: Path,
) -> None:
    live = _live_file(tmp_path, scale=dict.fromkeys(CHOSEN, 1.0), gpu="NVIDIA H100 80GB HBM3, 81559 MiB")
    out = tmp_path / "scored.json"
    sim_rank_gpu.score(argparse.Namespace(live=live, out=out))
    result = json.loads(out.read_text())
    # The H100's own operator profile with the H200's engine costs; the datasheet what-if it
    # replaced is scored beside on the same cases.
    assert result["hardware"] == "h100" and "own operator profile" in result["prediction"]
    assert result["held_out"]["calibration"]["files"][0]["path"] == "serving/perf/data/h100.json"
    assert all(b.startswith("measured on h100") for b in result["groups"]["loaded"]["basis"])
    beside = result["what_if_beside"]
    assert "datasheet" in beside["prediction"] and beside["summary"]["groups"] == 1
    assert beside["summary"]["p50_ttft_mape"] is not None
    # The stored calibration sums a mixed step's attention per side; its leave-one-out (one
    # roofline over the step) is scored beside on the same cases.
    whole = result["attention_ablation_beside"]
    assert "attention_split 0 instead of 1" in whole["prediction"] and whole["summary"]["groups"] == 1
    assert [r["config"] for r in whole["rows"]] == [r["config"] for r in result["rows"]]
    data = json.loads(live.read_text())
    data["machine"]["gpu"] = "NVIDIA A10G, 23028 MiB"
    live.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="prediction is withheld"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=out))


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (sim_rank_gpu._parse_configs, "budget_1024,max_seqs_64", "vllm_defaults among them"),
        (sim_rank_gpu._parse_configs, "vllm_defaults,nonsense", "two or more distinct names"),
        (sim_rank_gpu._parse_rates, "16,abc", "comma-separated rates"),
        (sim_rank_gpu._parse_rates, "0,16", "rates in (0, 1000]"),
        (sim_rank_gpu._parse_loads, "loaded,overloaded", "comma-separated of loaded, past_knee"),
    ],
)
def test_bad_input_is_refused_with_what_was_wanted(parse: object, text: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        parse(text)  # type: ignore[operator]


def test_each_group_rotates_the_configurations_and_repeats_the_defaults_last() -> None:
    names = ["vllm_defaults", "budget_1024", "max_seqs_64"]
    assert sim_rank_gpu.group_order(names, 0) == [*names, "vllm_defaults"]
    assert sim_rank_gpu.group_order(names, 1) == [
        "budget_1024",
        "max_seqs_64",
        "vllm_defaults",
        "vllm_defaults",
    ]


def test_plan_predicts_the_knee_on_the_ladder_and_each_loads_spread(tmp_path: Path) -> None:
    """The plan stops its ladder at the first predicted miss, as the live probe does, and
    predicts every configuration at the knee's rate; a file that is no model config is refused."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_3B))
    out = tmp_path / "plan.json"
    args = argparse.Namespace(
        model_config=config,
        trace="azure_conv",
        ladder="8,1000",  # the second rate is far past any knee of one H200
        probe_s=5.0,
        min_requests=10,
        case_s=5.0,
        loads="loaded",
        configs="vllm_defaults,budget_1024,no_prefix_caching",
        slo_p50_ms=600.0,
        slo_p95_ms=2000.0,
        max_model_len=8192,
        hardware="h200",
        slower=1.25,
        rate=None,
        out=out,
    )
    assert sim_rank_gpu.plan(args) == 0
    result = json.loads(out.read_text())
    assert result["knee_rps"] == 8.0
    # Beside it, the same ladder with every engine step 1.25x as costly: a knee no higher, and the
    # defaults at the group's rate no faster.
    slower = result["if_slower"]
    assert slower["step_cost_factor"] == 1.25 and (slower["knee_rps"] or 0.0) <= result["knee_rps"]
    assert len(slower["ladder"]) >= 1 and not slower["ladder"][-1]["slo_met"]
    assert [p["slo_met"] for p in result["ladder"]] == [True, False]
    group = result["groups"]["loaded"]
    assert group["rate_rps"] == 8.0
    slow_defaults = group["vllm_defaults_if_slower"]
    assert slow_defaults["ttft_p50_ms"] >= group["predicted"]["vllm_defaults"]["ttft_p50_ms"]
    assert slow_defaults["tpot_p50_ms"] > group["predicted"]["vllm_defaults"]["tpot_p50_ms"]
    assert group["past_knee_if_slower"] is (slower["knee_rps"] is None or slower["knee_rps"] < 8.0)
    assert sorted(group["p50_order"]) == ["budget_1024", "no_prefix_caching", "vllm_defaults"]
    assert group["p50_spread"] >= 0.0 and "nothing measured" in result["what"]
    assert result["calibration"] == ["serving/perf/data/h200.json", "serving/perf/data/h200_live.json"]
    # Sized for an H100 instead (what the device machine mostly lends): its own operator profile.
    h100 = tmp_path / "plan_h100.json"
    assert sim_rank_gpu.plan(argparse.Namespace(**{**vars(args), "hardware": "h100", "out": h100})) == 0
    on_h100 = json.loads(h100.read_text())
    assert on_h100["hardware"] == "h100" and on_h100["calibration"][0] == "serving/perf/data/h100.json"
    assert on_h100["ladder"][0]["ttft_p50_ms"] != result["ladder"][0]["ttft_p50_ms"]
    # A rate given to measure (--rate) is where the plan's groups go, the predicted knee beside.
    given = tmp_path / "plan_given.json"
    assert sim_rank_gpu.plan(argparse.Namespace(**{**vars(args), "rate": 4.0, "out": given})) == 0
    at_given = json.loads(given.read_text())
    assert at_given["knee_rps"] == 8.0 and at_given["rate_rps"] == 4.0
    assert at_given["groups"]["loaded"]["rate_rps"] == 4.0
    assert at_given["groups"]["loaded"]["past_knee_if_slower"] is (
        at_given["if_slower"]["knee_rps"] is None or at_given["if_slower"]["knee_rps"] < 4.0
    )
    config.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SystemExit, match="no hidden_size"):
        sim_rank_gpu.plan(args)
    with pytest.raises(SystemExit, match="--case-s must be in"):
        sim_rank_gpu.plan(argparse.Namespace(**{**vars(args), "case_s": 1e9}))
    with pytest.raises(SystemExit, match="--slower must be in"):
        sim_rank_gpu.plan(argparse.Namespace(**{**vars(args), "slower": 0.5}))
    with pytest.raises(SystemExit, match="--rate must be in"):
        sim_rank_gpu.plan(argparse.Namespace(**{**vars(args), "rate": -1.0}))


def test_slower_steps_cost_the_engines_steps_more_and_leave_the_front_end() -> None:
    from serving.catalog.hardware import get_hardware
    from serving.perf.model import nearest_measured

    stored, _ = nearest_measured(get_hardware("h200"))
    slow = sim_rank_gpu.slower_steps(stored, 2.0)
    assert slow.gemm_efficiency == pytest.approx(stored.gemm_efficiency / 2)
    assert slow.attention_efficiency == pytest.approx(stored.attention_efficiency / 2)
    assert slow.memory_efficiency == pytest.approx(stored.memory_efficiency / 2)
    assert slow.step_overhead_ms == pytest.approx(stored.step_overhead_ms * 2)
    assert slow.seq_overhead_ms == pytest.approx(stored.seq_overhead_ms * 2)
    assert slow.token_overhead_ms == pytest.approx(stored.token_overhead_ms * 2)
    # before the engine: as calibrated
    assert slow.request_overhead_ms == stored.request_overhead_ms
    assert slow.prompt_token_overhead_ms == stored.prompt_token_overhead_ms
    assert slow.token_compute_share == stored.token_compute_share
    assert "2x" in slow.how


def test_the_engines_sampling_steps_are_counted_from_its_tokens_per_iteration_histogram() -> None:
    from serving.metrics import Histogram

    h = Histogram(
        bounds=(1.0, 512.0, 1024.0, math.inf), cumulative_counts=(40, 50, 58, 60), sum=9000.0, count=60
    )
    assert sim_rank_gpu.step_counts(h) == {"sampled_steps": 60, "sampled_step_tokens_mean": 150.0}
    assert sim_rank_gpu.step_counts(Histogram.empty())["sampled_steps"] is None


def test_the_live_engines_sampling_steps_are_set_beside_the_simulated_ones() -> None:
    predicted = {"steps": 300.0, "sampled_steps": 100.0, "sampled_step_tokens_mean": 50.0}
    engine = {"sampled_steps": 150.0, "sampled_step_tokens_mean": 40.0}
    expected = {"sampled_steps": 1.5, "sampled_step_tokens_mean": 0.8}
    assert sim_rank_gpu.steps_ratio(predicted, engine) == expected
    # a live file of 2026-12-07 names the same count `steps`
    assert sim_rank_gpu.steps_ratio(predicted, {"steps": 150.0, "step_tokens_mean": 40.0}) == expected
    # a live file from before the steps were kept: nothing to set beside
    assert sim_rank_gpu.steps_ratio(predicted, {"queue_mean_ms": 5.0}) is None


def test_the_gpus_busy_seconds_are_set_beside_the_simulated_steps() -> None:
    gpu = {"window_s": 40.0, "util_mean_pct": 50.0}
    assert sim_rank_gpu.gpu_busy({"busy_s": 25.0}, gpu) == {"live": 20.0, "sim": 25.0, "live_over_sim": 0.8}
    # no GPU sampled (a CPU host, an old live file): nothing to set beside
    assert sim_rank_gpu.gpu_busy({"busy_s": 25.0}, None) is None
    assert sim_rank_gpu.gpu_busy({"busy_s": 25.0}, {"window_s": 40.0, "util_mean_pct": None}) is None


def test_the_score_checks_its_predictions_are_the_plans(tmp_path: Path) -> None:
    rows = [
        {"load": "loaded", "config": "vllm_defaults", "sim": {"ttft_p50_ms": 395.739, "ttft_p95_ms": 1492.1}},
        {"load": "loaded", "config": "budget_1024", "sim": {"ttft_p50_ms": 515.356, "ttft_p95_ms": 1864.5}},
    ]
    predicted = {
        "vllm_defaults": {"ttft_p50_ms": 395.7393282, "ttft_p95_ms": 1492.1},
        "budget_1024": {"ttft_p50_ms": 515.3555138, "ttft_p95_ms": 1864.5},
    }
    plan = {
        "benchmark": "sim_rank_gpu_plan",
        "when": "2026-12-07T03:45:52+00:00",
        "commit": "7192658",
        "dirty": False,
        "groups": {"loaded": {"predicted": predicted}},
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    same = sim_rank_gpu.plan_agreement(path, rows, "2026-12-07T08:28:41+00:00")
    assert same["same_predictions"] and same["written_before_first_case"] and same["cases_compared"] == 2
    # a prediction that moved after the plan (1%), a plan written after the run, a case it lacks
    moved = [rows[0], {**rows[1], "sim": {"ttft_p50_ms": 520.5, "ttft_p95_ms": 1864.5}}]
    late = sim_rank_gpu.plan_agreement(path, moved, "2026-12-07T03:00:00+00:00")
    assert not late["same_predictions"] and not late["written_before_first_case"]
    assert late["largest_relative_difference"] == pytest.approx(0.01, abs=1e-4)
    extra = [*rows, {"load": "loaded", "config": "budget_2048", "sim": rows[0]["sim"]}]
    lacking = sim_rank_gpu.plan_agreement(path, extra, "2026-12-07T08:28:41+00:00")
    assert lacking["cases_missing_from_plan"] == ["loaded/budget_2048"] and not lacking["same_predictions"]
    path.write_text(json.dumps({"benchmark": "sim_rank_gpu_live"}))
    with pytest.raises(SystemExit, match="not a sim_rank_gpu plan"):
        sim_rank_gpu.plan_agreement(path, rows, None)


def _isolated_live(tmp_path: Path, lengths: dict[int, float], budget: int | None) -> Path:
    path = tmp_path / "isolated_live.json"
    entries = [
        {"prompt_tokens": n, "requests": 5, "errors": 0, "engine": {"prefill_mean_ms": ms}}
        for n, ms in lengths.items()
    ]
    path.write_text(
        json.dumps(
            {
                "benchmark": "sim_gpu_isolated_live",
                "machine": {"gpu": "NVIDIA H200, 143771 MiB"},
                "model": "llama-3.2-3b",
                "model_config": LLAMA_3B,
                "method": {"max_num_batched_tokens": budget, "max_model_len": 32768},
                "lengths": entries,
            }
        )
    )
    return path


def test_a_measured_floor_under_the_steps_outside_the_graphs_is_scored_beside(tmp_path: Path) -> None:
    # the shortest one-step prompt over 512 tokens within the budget sets the floor
    iso = _isolated_live(tmp_path, {512: 9.0, 1024: 60.0, 4096: 200.0}, budget=1024)
    floor = sim_rank_gpu.eager_floor_from(iso)
    assert (floor["prompt_tokens"], floor["eager_step_floor_ms"], floor["token_budget"]) == (1024, 60.0, 1024)
    live = _live_file(tmp_path, scale=dict.fromkeys(CHOSEN, 1.0))
    out = tmp_path / "scored.json"
    sim_rank_gpu.score(argparse.Namespace(live=live, out=out, eager_floor_from=iso))
    result = json.loads(out.read_text())
    beside = result["eager_floor_beside"]
    assert beside["source"]["same_gpu_and_model"] is True
    floored = {r["config"]: r["sim"] for r in beside["rows"]}
    for row in result["rows"]:
        # a floor only lengthens steps: every prediction is at least the calibration's own
        assert floored[row["config"]]["ttft_p50_ms"] >= row["sim"]["ttft_p50_ms"] - 1e-6
        assert floored[row["config"]]["busy_s"] >= row["sim"]["busy_s"] - 1e-6
    # a budget of 1,024 takes its prompts over 512 tokens in steps under the 60 ms floor
    budget = next(r for r in result["rows"] if r["config"] == "budget_1024")
    assert floored["budget_1024"]["busy_s"] > budget["sim"]["busy_s"]
    # nothing to measure a floor from: refused, saying why
    with pytest.raises(SystemExit, match="no prompt of one step over 512"):
        sim_rank_gpu.eager_floor_from(_isolated_live(tmp_path, {256: 5.0, 2048: 30.0}, budget=1024))


def test_a_floor_fit_reading_is_taken_for_the_what_if_beside(tmp_path: Path) -> None:
    fit = {
        "benchmark": "sim_gpu_eager_floor",
        "hardware": "h100",
        "commit": "abc",
        "method": {"offset": "inside-graphs: each file's live times net of ..."},
        "forms": {
            "none": {"parameters": {}},
            "fixed": {"parameters": {"a": 10.0}},
            "per_layer": {"parameters": {"b": 500.0}},
            "fixed_and_per_layer": {"parameters": {"a": 4.5, "b": 290.0}},
            "additive": {"parameters": {"c": 3.8}},
        },
    }
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    both = sim_rank_gpu.floor_fit_from(path, "fixed_and_per_layer")
    assert (both["eager_step_floor_ms"], both["eager_layer_floor_us"]) == (4.5, 290.0)
    assert both["offset"] == "inside-graphs" and both["hardware"] == "h100"
    assert sim_rank_gpu.floor_fit_from(path, "per_layer")["eager_step_floor_ms"] == 0.0
    with pytest.raises(SystemExit, match="no floor of form 'additive'"):
        sim_rank_gpu.floor_fit_from(path, "additive")
    path.write_text(json.dumps({"benchmark": "sim_gpu_isolated_live"}))
    with pytest.raises(SystemExit, match="not a sim_gpu_eager_floor result"):
        sim_rank_gpu.floor_fit_from(path, "fixed")


def test_a_floor_probe_on_the_runs_machine_is_fitted_and_scored_beside(tmp_path: Path) -> None:
    """A run whose floor probe measured every step outside the CUDA graphs at 14 ms (inside them,
    the simulator's own time), each request 4 ms more besides: read raw, the floor fitted on the
    probe is 18 ms; net of the 4 ms its lengths inside the graphs show, 14 ms. Both scored beside."""
    from benchmarks import sim_gpu_eager_floor as eager

    live = _live_file(tmp_path, scale=dict.fromkeys(CHOSEN, 1.0), gpu="NVIDIA H100 80GB HBM3, 81559 MiB")
    data = json.loads(live.read_text())
    lengths = [256, 512, 768, 1024, 2048]

    def probe(prefill: dict[int, float]) -> dict[str, object]:
        return {
            "repeats": 3,
            "output_tokens": 16,
            "warm_up_requests_per_length": 1,
            "lengths": [
                {
                    "prompt_tokens": n,
                    "requests": 3,
                    "errors": 0,
                    "engine": {"prefill_mean_ms": prefill[n], "prefill_ms_each": [prefill[n]] * 3},
                }
                for n in lengths
            ],
            "seconds": 1.0,
        }

    first = data["groups"]["loaded"]["cases"][0]
    assert first["config"] == "vllm_defaults"
    first["floor_probe"] = probe(dict.fromkeys(lengths, 1.0))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    placeholder = eager.probe_floor(data, scratch)
    assert placeholder is not None
    sim = {r["prompt_tokens"]: r["sim_ms"] for r in placeholder["rows"]}
    first["floor_probe"] = probe({n: max(sim[n], 14.0 if n > 512 else 0.0) + 4.0 for n in lengths})
    live.write_text(json.dumps(data))
    out = tmp_path / "scored.json"
    args = argparse.Namespace(live=live, out=out, floor_from_probe=True)
    assert sim_rank_gpu.score(args) == 0
    result = json.loads(out.read_text())
    raw, net = result["probe_floor_beside"], result["probe_floor_net_beside"]
    assert raw["source"]["eager_step_floor_ms"] == pytest.approx(18.0, rel=1e-3)
    assert raw["source"]["offset"] == "none"
    assert net["source"]["eager_step_floor_ms"] == pytest.approx(14.0, rel=1e-3)
    assert net["source"]["offsets_ms"] == [pytest.approx(4.0)]
    # net of the cost the floor fits exactly; raw, the longest length (its step above the floor)
    # keeps its 4 ms, which no fixed floor can fit
    assert net["source"]["fit_mape"] == pytest.approx(0.0, abs=1e-3)
    assert raw["source"]["fit_mape"] > 0.01
    for beside in (raw, net):
        assert beside["source"]["points_outside_graphs"] == 3
        assert beside["source"]["none_mape"] > 0.05
        assert beside["summary"]["groups"] == 1
    # Declared before the run, the net probe floor is the headline: the stored calibration alone
    # is then scored beside, and it is what the plan predicted.
    planned = {r["config"]: r["sim"] for r in result["rows"]}
    plan = {
        "benchmark": "sim_rank_gpu_plan",
        "when": "2029-12-31T00:00:00+00:00",
        "headline_floor": "probe-net",
        "groups": {"loaded": {"predicted": planned}},
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    headed = tmp_path / "headed.json"
    assert sim_rank_gpu.score(argparse.Namespace(live=live, out=headed, plan=plan_path)) == 0
    head = json.loads(headed.read_text())
    assert head["headline_floor"] == "probe-net" and "14" in head["prediction"]
    assert head["headline_floor_source"]["eager_step_floor_ms"] == pytest.approx(14.0, rel=1e-3)
    figures = ("rank_tau", "top3_hit_rate", "p50_ttft_mape", "p95_ttft_mape", "tpot_p50_mape")
    for key in figures:  # the rows the headline scores round each prediction (below a millionth)
        for got, want in ((head, net), (head["stored_calibration_beside"], result)):
            value = want["summary"][key]
            assert got["summary"][key] == (value if value is None else pytest.approx(value, rel=1e-4))
    # the raw reading stays beside; the net one is the headline
    assert "probe_floor_net_beside" not in head and "probe_floor_beside" in head
    agreement = head["held_out"]["plan"]
    assert agreement["same_predictions"] and agreement["written_before_first_case"]
    # a plan that is not one, or not JSON, is refused before anything is scored
    not_json = tmp_path / "not-a-plan.json"
    not_json.write_text("{")
    with pytest.raises(SystemExit, match="--plan"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=headed, plan=not_json))
    with pytest.raises(SystemExit, match="not a sim_rank_gpu plan"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=headed, plan=live))
    # a score may not choose another headline than its plan declared
    with pytest.raises(SystemExit, match="declared 'probe-net' before the run"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=headed, plan=plan_path, headline_floor="stored"))
    # a probe with no length inside the graphs has no per-request cost to take off
    first["floor_probe"]["lengths"] = [e for e in first["floor_probe"]["lengths"] if e["prompt_tokens"] > 512]
    with pytest.raises(SystemExit, match="no per-request offset"):
        eager.probe_floor(data, tmp_path / "no-inside", offset="inside-graphs")
    # the score then keeps the raw reading beside and says why the net one is withheld; with the
    # net reading declared as its headline, it refuses
    live.write_text(json.dumps(data))
    assert sim_rank_gpu.score(args) == 0
    withheld = json.loads(out.read_text())
    assert "probe_floor_beside" in withheld and "probe_floor_net_beside" not in withheld
    assert "no per-request offset" in withheld["probe_floor_net_withheld"]
    with pytest.raises(SystemExit, match="no per-request offset"):
        sim_rank_gpu.score(argparse.Namespace(live=live, out=headed, plan=plan_path))
    del first["floor_probe"]
    live.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="holds no floor probe"):
        sim_rank_gpu.score(args)


def test_floor_probe_lengths_are_bounded() -> None:
    assert sim_rank_gpu._parse_probe_lengths("", 32768) == []
    assert sim_rank_gpu._parse_probe_lengths("1024, 512,640", 32768) == [512, 640, 1024]
    for bad in ("100", "512,x", "512,9000", ",".join(str(600 + i) for i in range(9))):
        with pytest.raises(SystemExit, match="floor-probe-lengths"):
            sim_rank_gpu._parse_probe_lengths(bad, 32768)


def test_a_floor_probe_counts_in_the_estimate_only_before_a_probed_case() -> None:
    """The H200 run of 2026-12-07 stopped before a 175 s case with 284 s left: its estimate held
    the first case's 75 s probe (60 s here). The probe now counts only before a case that is probed."""
    probed = {"config": "vllm_defaults", "seconds": 281.0, "floor_probe": {"seconds": 60.0}}
    plain = [probed, {"config": "budget_1024", "seconds": 174.0}]
    assert sim_rank_gpu.case_estimate(plain, probe=False, first_case_s=150.0) == pytest.approx(221.0 * 1.1)
    assert sim_rank_gpu.case_estimate(plain, probe=True, first_case_s=150.0) == pytest.approx(
        221.0 * 1.1 + 60.0
    )
    first = sim_rank_gpu.case_estimate([], probe=True, first_case_s=150.0)
    assert first == 150.0 + sim_rank_gpu.FIRST_PROBE_ESTIMATE_S
    assert sim_rank_gpu.case_estimate([], probe=False, first_case_s=150.0) == 150.0
    # only the last three cases count
    older = [{"config": "x", "seconds": 500.0}, *[{"config": "y", "seconds": 100.0}] * 3]
    assert sim_rank_gpu.case_estimate(older, probe=False, first_case_s=150.0) == pytest.approx(110.0)


def test_engine_startup_reads_vllms_own_reports() -> None:
    """Each case keeps where its engine's start-up went, as vLLM's log reports it: the last
    report of each phase (a compile of several graphs reports its total last), None where absent."""
    log = "\n".join(
        [
            "(EngineCore_DP0 pid=88) INFO 12-07 18:53:01 [gpu_model_runner.py:2602] Model loading took "
            "3.2 GiB memory and 2.41 seconds",
            "(EngineCore_DP0 pid=88) INFO 12-07 18:53:40 [backends.py:548] Compiling a graph for dynamic "
            "shape takes 20.10 s",
            "(EngineCore_DP0 pid=88) INFO 12-07 18:53:52 [monitor.py:34] torch.compile takes 31.52 s in total",
            "(EngineCore_DP0 pid=88) INFO 12-07 18:54:20 [gpu_model_runner.py:3480] Graph capturing finished "
            "in 19 secs, took 0.61 GiB",
            "(EngineCore_DP0 pid=88) INFO 12-07 18:54:20 [core.py:210] init engine (profile, create kv cache, "
            "warmup model) took 66.04 seconds",
        ]
    )
    assert sim_rank_gpu.engine_startup(log) == {
        "weights_s": 2.41,
        "compile_s": 31.52,
        "graph_capture_s": 19.0,
        "init_engine_s": 66.04,
    }
    # vLLM 0.26 on the H100 (the run of 2026-12-07 21:52): "took", not "takes"
    h100 = (
        "(EngineCore pid=1644) INFO 12-07 21:57:04 [monitor.py:53] torch.compile took 27.89 s in total\n"
        "(EngineCore pid=1644) INFO 12-07 21:57:13 [model_runner.py:747] Graph capturing finished in 6 secs, "
        "took 0.53 GiB"
    )
    assert sim_rank_gpu.engine_startup(h100)["compile_s"] == 27.89
    eager = "INFO 12-07 [core.py] init engine took 12.5 s (compilation: 0.00 s)"
    assert sim_rank_gpu.engine_startup(eager) == {
        "weights_s": None,
        "compile_s": None,
        "graph_capture_s": None,
        "init_engine_s": 12.5,
    }
    assert set(sim_rank_gpu.engine_startup("").values()) == {None}
