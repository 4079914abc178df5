"""The simulator benchmark's per-tenant calibration replay, on simulated "live" numbers."""

from __future__ import annotations

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
