"""The simulator benchmark's per-tenant calibration replay, on simulated "live" numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import sim_accuracy


def test_a_tenant_on_a_slower_machine_is_learnt_from_its_earlier_jobs() -> None:
    """Live numbers 1.5x the stored calibration's predictions, light load: every job after the
    first is predicted with the correction from the others, and its TPOT error falls."""
    configs = sim_accuracy.configs()
    chosen = {name: configs[name] for name in ("default", "budget_512")}
    cases, rows = {}, []
    for trace, load in (("azure2023_conv.csv", "light"), ("mooncake_synthetic.jsonl", "light")):
        for name, config in chosen.items():
            case = sim_accuracy.Case(trace, load, 3.0, 6, 2000, 7)
            cases[(name, trace, load)] = case
            sim = sim_accuracy.sim_case(config, case)
            live = {"ttft_p50_ms": sim["ttft_p50_ms"] * 1.5, "tpot_mean_ms": sim["tpot_mean_ms"] * 1.5}
            rows.append({"config": name, "trace": trace, "load": load, "live": live, "sim": sim})
    out = sim_accuracy.calibration_convergence(rows, chosen, cases)
    assert [p["earlier_jobs"] for p in out["curve"]] == [0, 1]
    assert out["curve"][0]["tpot_mape"] == pytest.approx(1 / 3, rel=1e-6)  # 1 - 1/1.5
    # One earlier job of two trials: the product trusts it by n / (n + 1) = 2/3 of the way, so
    # step times are scaled by 1.5 ** (2/3) and a third of the way in log terms remains.
    assert out["curve"][1]["tpot_mape"] == pytest.approx(1 - 1.5 ** (2 / 3) / 1.5, abs=0.01)
    assert out["calibration_gain_tpot"] > 2 and out["calibration_gain_tpot_ci_low"] > 1
    # Attributed job by job: each job corrected by the other's trials (1.5x, inside the band).
    for job in out["by_job"].values():
        assert job["corrected"] is True and job["engine_ratio"] == pytest.approx(1.5, rel=0.01)
        assert job["p50_ttft_mape_with"] < job["p50_ttft_mape_without"]


def test_kept_runs_on_another_machine_pool_their_convergence(tmp_path: Path) -> None:
    """Kept live runs the calibration does not describe (here: every figure 1.8x the stored
    calibration's, inside the band a correction trusts) are replayed as a tenant's jobs and pooled; a run of one trace x load group
    has no sequence of jobs and is listed as skipped."""
    configs = sim_accuracy.configs()
    chosen = {name: configs[name] for name in ("default", "budget_512")}
    groups = (("azure2023_conv.csv", "light"), ("mooncake_synthetic.jsonl", "light"))
    files = []
    for n, kept in enumerate((groups, groups[:1])):
        cases = []
        for trace, load in kept:
            for name, config in chosen.items():
                case = sim_accuracy.Case(trace, load, 3.0, 6, 2000, 7 + n)
                sim = sim_accuracy.sim_case(config, case)
                live = {m: sim[m] * 1.8 for m in sim_accuracy.METRICS}
                cases.append(
                    {"config": name, "trace": trace, "load": load, "time_scale": 3.0, "max_requests": 6}
                    | {"max_prompt_tokens": 2000, "seed": 7 + n, "live": live}
                )
        path = tmp_path / f"run{n}.json"
        path.write_text(json.dumps({"cases": cases, "live_run": {"started_at": f"2026-12-0{n + 1}"}}))
        files.append(path)
    out = sim_accuracy.convergence_on_kept_runs(files, chosen)
    assert out["calibration_gain_kept_runs_cases"] == 4
    assert out["calibration_gain_kept_runs"] > 1.5 and out["calibration_gain_kept_runs_ci_low"] > 1
    assert out["calibration_gain_kept_runs_tpot"] > 1.5
    assert "skipped" in out["runs"][1] and "case_errors" not in out["runs"][0]
    assert [p["earlier_jobs"] for p in out["runs"][0]["curve"]] == [0, 1]


def test_the_live_noise_floor_counts_only_identical_cases(tmp_path: Path) -> None:
    """A kept run's case counts towards the noise floor only where its trace, load, pace, request
    count and caps equal this run's; its error is |other / this - 1|."""
    this_case = sim_accuracy.Case("azure2023_conv.csv", "light", 1.0, 26, 2000, 10_001)
    this = {("default", this_case.trace, "light"): {"ttft_p50_ms": 20.0, "ttft_p95_ms": 100.0}}
    cases = {("default", this_case.trace, "light"): this_case}

    def kept(name: str, max_requests: int, p50: float, p95: float) -> Path:
        row = {
            "config": "default",
            "trace": this_case.trace,
            "load": "light",
            "time_scale": 1.0,
            "max_requests": max_requests,
            "max_prompt_tokens": 2000,
            "seed": 99,  # other words: a repeat is never the same prompts
            "live": {"ttft_p50_ms": p50, "ttft_p95_ms": p95},
        }
        path = tmp_path / name
        path.write_text(json.dumps({"cases": [row], "live_run": {}}))
        return path

    same = kept("same.json", 26, 25.0, 90.0)
    other_load = kept("other.json", 400, 500.0, 900.0)
    floor = sim_accuracy.live_repeat(this, cases, [same, other_load])
    assert floor["runs"] == 1 and floor["cases"] == 1
    assert floor["p50_ttft_mape"] == pytest.approx(0.25) and floor["p95_ttft_mape"] == pytest.approx(0.10)
    assert sim_accuracy.live_repeat(this, cases, [other_load])["p50_ttft_mape"] is None


def test_a_kept_run_far_from_the_calibration_is_not_corrected(tmp_path: Path) -> None:
    """Live figures five times the predictions: another machine, not drift. The replay's
    correction is withheld (the product says to recalibrate), so the error stays as it was
    rather than being made worse by a scale that fits the TPOT and nothing else."""
    configs = sim_accuracy.configs()
    chosen = {name: configs[name] for name in ("default", "budget_512")}
    cases = []
    for trace in ("azure2023_conv.csv", "mooncake_synthetic.jsonl"):
        for name, config in chosen.items():
            case = sim_accuracy.Case(trace, "loaded", 3.0, 6, 2000, 7)
            sim = sim_accuracy.sim_case(config, case)
            cases.append(
                {"config": name, "trace": trace, "load": "loaded", "time_scale": 3.0, "max_requests": 6}
                | {
                    "max_prompt_tokens": 2000,
                    "seed": 7,
                    "live": {m: sim[m] * 5.0 for m in sim_accuracy.METRICS},
                }
            )
    path = tmp_path / "far.json"
    path.write_text(json.dumps({"cases": cases, "live_run": {"started_at": "2026-12-05"}}))
    out = sim_accuracy.convergence_on_kept_runs([path], chosen)
    assert out["calibration_gain_kept_runs"] == pytest.approx(1.0)
    curve = out["runs"][0]["curve"]
    assert curve[1]["p50_ttft_mape"] == pytest.approx(curve[0]["p50_ttft_mape"]) == pytest.approx(0.8)


def test_the_default_levels_are_at_and_past_the_knee() -> None:
    """The ranked levels load the engine (the knee the probe found, and half as much again past
    it); the light level, where configurations cannot be told apart, is only on request."""
    spec = sim_accuracy.TRACE_SPECS[0]
    cases = sim_accuracy.build_cases([spec], {spec.trace: 3.0}, window_s=18.0)
    assert [c.load for c in cases] == ["loaded", "past_knee"]
    assert [spec.light_time_scale / c.time_scale for c in cases] == pytest.approx([3.0, 4.5])
    assert cases[1].max_requests > cases[0].max_requests
    light = sim_accuracy.build_cases([spec], {spec.trace: 3.0}, window_s=18.0, loads=("light",))
    assert light[0].time_scale == spec.light_time_scale
    with pytest.raises(ValueError, match="unknown load level"):
        sim_accuracy.load_factor("peak", 3.0)
