"""benchmarks/kernels_e2e.py on a CPU: the dry run checks the whole plan and starts nothing; the
figures and the log reading the GPU run relies on, on made-up blocks and logs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import kernels_e2e as e2e
from serving.engine import EngineConfig, moe_tables
from tailguard import moe_step


def test_dry_run_checks_the_plan_and_writes_no_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    plan_path = tmp_path / "plan.json"
    argv = [
        "--dry-run", "--no-validate", "--shapes", "qwen3-30b-a3b-e64", "--traces", "azure_conv",
        "--sim-requests", "60", "--sim-window-s", "5", "--work", str(tmp_path / "work"),
        "--out", str(out), "--plan-out", str(plan_path),
    ]  # fmt: skip
    assert e2e.main(argv) == 0
    assert not out.exists()  # the result file is written by a GPU run only
    plan = json.loads(plan_path.read_text())
    shape = plan["shapes"]["qwen3-30b-a3b-e64"]
    assert shape["table_file_name"] == "E=64,N=768,device_name=NVIDIA_H200.json"
    if shape["checked_against"] is not None:  # vLLM installed here: it ships no H200 table for it
        assert shape["vllm_ships_table"] is False
    trace = shape["traces"]["azure_conv"]
    assert list(trace["loads"]) == ["0.4x", "0.8x"]
    assert 0 < trace["loads"]["0.4x"] < trace["loads"]["0.8x"] <= trace["saturation_rate_scale"]
    assert all(16 <= n <= e2e.MAX_BLOCK_REQUESTS for n in trace["requests_per_replay"].values())
    traffic, uniform = trace["traffic_table"], shape["uniform_table"]
    # Both tables spend the same number of candidate trials; the traffic's goes where its time is.
    assert sum(b["candidates"] for b in traffic["buckets"]) <= 216
    assert sum(b["candidates"] for b in uniform["buckets"]) == 216
    assert [b["key"] for b in uniform["buckets"]] == list(moe_tables.BATCH_SIZE_KEYS)
    assert sum(b["weight"] for b in traffic["buckets"]) == pytest.approx(1.0, abs=1e-4)
    heaviest = max(traffic["buckets"], key=lambda b: b["weight"])
    assert heaviest["candidates"] == max(b["candidates"] for b in traffic["buckets"])
    assert all(len(b["points"]) <= 2 for b in traffic["buckets"])
    # The arms differ only in where vLLM looks for tables.
    arms = plan["arms"]
    assert moe_tables.ENV_VAR not in arms["default"]["env"]
    assert arms["traffic"]["env"][moe_tables.ENV_VAR].startswith("/WORK/tables/traffic")
    assert arms["default"]["args"] == arms["traffic"]["args"]
    assert "--load-format" in arms["default"]["args"] and "dummy" in arms["default"]["args"]
    assert plan["estimate"]["blocks"] == 1 * 1 * 3 * (3 + 1)  # three arms, three rounds and a warm-up
    config = json.loads((tmp_path / "work" / "models" / "qwen3-30b-a3b-e64" / "config.json").read_text())
    assert config["num_experts"] == 64 and config["moe_intermediate_size"] == 768
    assert "plan OK: 12 engine blocks" in capsys.readouterr().out


def test_a_plan_that_would_not_fit_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--dry-run", "--no-validate", "--shapes", "qwen3-30b-a3b", "--traces", "mooncake",
        "--tune-budget-s", "5", "--work", str(tmp_path),
    ]  # fmt: skip
    assert e2e.main(argv) == 2
    assert "the plan is refused" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        e2e.main(["--dry-run", "--repeats", "0"])
    with pytest.raises(SystemExit):
        e2e.main(["--dry-run", "--shapes", "llama-3.1-8b"])


def _block(arm: str, round_: int, tpot: float, ttft: list[float]) -> dict[str, object]:
    return {
        "shape": "s",
        "trace": "t",
        "arm": arm,
        "round": round_,
        "table_used": "default",
        "replays": {"0.8x": {"ttft_ms": ttft, "tpot_p50_ms": tpot, "errors": 0}},
    }


def test_figures_are_ratios_with_intervals_from_the_blocks() -> None:
    rng = np.random.default_rng(0)
    blocks = []
    for r in range(3):
        for arm, tpot, scale in (("default", 10.0, 1.0), ("uniform", 9.5, 0.95), ("traffic", 8.0, 0.9)):
            blocks.append(_block(arm, r, tpot + 0.1 * r, list(scale * rng.uniform(50, 150, 200))))
    f = e2e.figures(blocks, "0.8x", seed=0)
    assert f["blocks"] == {"default": 3, "uniform": 3, "traffic": 3}
    tpot = f["tpot_ratio_vs_default"]
    assert tpot["value"] == pytest.approx(np.mean([8.0, 8.1, 8.2]) / np.mean([10.0, 10.1, 10.2]), rel=1e-3)
    assert tpot["ci_low"] <= tpot["value"] <= tpot["ci_high"] < 1.0
    assert f["tpot_ratio_vs_uniform_tuned"]["value"] < 1.0
    assert 0.7 < f["ttft_p95_ratio_vs_default"]["value"] < 1.1
    # A load no block measured gives counts and no figures.
    none = {"default": 0, "uniform": 0, "traffic": 0}
    assert e2e.figures(blocks, "0.4x", seed=0) == {"blocks": none, "errors": none}
    # A block with failed requests is left out of the ratios and counted.
    blocks[0]["replays"]["0.8x"]["errors"] = 3  # type: ignore[index]
    f = e2e.figures(blocks, "0.8x", seed=0)
    assert f["blocks"]["default"] == 2 and f["errors"]["default"] == 3


def test_warm_up_rounds_are_served_but_never_measured() -> None:
    rng = np.random.default_rng(1)
    measured = [
        _block(arm, r, tpot, list(rng.uniform(50, 150, 100)))
        for r in range(3)
        for arm, tpot in (("default", 10.0), ("traffic", 9.0))
    ]
    # Run 5's first round: compile stalls, far slower in both arms.
    warm = [_block(arm, -1, 60.0, [1300.0] * 100) for arm in ("default", "traffic")]
    with_warm = e2e.figures(warm + measured, "0.8x", seed=0)
    assert with_warm == e2e.figures(measured, "0.8x", seed=0)
    assert with_warm["blocks"] == {"default": 3, "uniform": 0, "traffic": 3}


def test_steady_decode_figures_are_per_batch_ratios_over_fresh_engines() -> None:
    rng = np.random.default_rng(2)
    blocks: list[dict[str, object]] = []
    for r in range(-1, 3):  # round -1: a warm-up round, never measured
        for arm, step in (("default", 10.0), ("traffic", 11.0)):
            steady = {
                str(batch): {"tpot_ms": list(step * batch**0.1 + rng.normal(0, 0.05, 2 * batch)), "bursts": 2}
                for batch in (1, 64)
            }
            for rec in steady.values():
                rec["tpot_p50_ms"] = float(np.median(rec["tpot_ms"]))  # type: ignore[arg-type]
            if r < 0:
                steady = {k: {**v, "tpot_ms": [500.0] * 4, "tpot_p50_ms": 500.0} for k, v in steady.items()}
            blocks.append({**_block(arm, r, step, [100.0]), "steady": steady})
    f = e2e.steady_figures(blocks, seed=0)
    assert set(f) == {"1", "64"}
    for fig in f.values():
        assert fig["blocks"] == {"default": 3, "uniform": 0, "traffic": 3}  # the warm-up left out
        r = fig["tpot_ratio_vs_default"]
        assert r["value"] == pytest.approx(1.1, rel=0.02)
        assert 1.0 < r["ci_low"] <= r["value"] <= r["ci_high"]
        assert "uniform_tpot_ratio_vs_default" not in fig  # no uniform blocks: no figure
    # Blocks from before steady decode was measured carry none: no figures, no error.
    assert e2e.steady_figures([_block("default", 0, 10.0, [1.0])], seed=0) == {}


def test_steady_decode_sizes_are_bounded() -> None:
    for bad in ("0", "1,2,3,4,5,6,7", "4096", "x"):
        with pytest.raises(SystemExit):
            e2e.main(["--dry-run", "--steady-batches", bad])
    with pytest.raises(SystemExit):
        e2e.main(["--dry-run", "--steady-bursts", "9"])


def test_a_resumed_run_rewrites_tables_its_fresh_machine_lacks(tmp_path: Path) -> None:
    planned = moe_step.plan_tables(
        model="qwen3-30b-a3b",
        config=EngineConfig(),
        gpu_name="NVIDIA H200",
        sample=None,
        budget=18,
        time_budget_s=60,
        pool_size=4,
        min_per_bucket=1,
    )
    entry = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    state = {"tune-x": {"table": {"1": entry, "64": entry}, "vllm_file_name": None}}
    clock = e2e.Clock(0.0)  # no time left: nothing may be tuned, only restored
    record = e2e.tune_step(argparse.Namespace(), "tune-x", planned, tmp_path, state, clock)
    assert record is not None
    assert moe_tables.read_table(tmp_path / planned.table.file_name, expect=planned.table) == {
        1: entry,
        64: entry,
    }
    # A step not yet run, with no time left, is not started.
    assert e2e.tune_step(argparse.Namespace(), "tune-y", planned, tmp_path, state, clock) is None


def test_the_engine_log_says_which_table_was_read(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "INFO ... Using configuration from /w/tables/traffic/E=64,N=768,device_name=NVIDIA_H200.json "
        "for MoE layer.\n"
    )
    assert e2e.table_used(log) == "/w/tables/traffic/E=64,N=768,device_name=NVIDIA_H200.json"
    log.write_text(
        "WARNING ... Using default MoE config. Performance might be sub-optimal! Config file not found\n"
    )
    assert e2e.table_used(log).startswith("default")
    assert e2e.table_used(tmp_path / "absent.log").startswith("unknown")


def test_a_resumed_state_carries_the_commit_of_the_command_that_extends_it(tmp_path: Path) -> None:
    from benchmarks._resumable import load_state, save_state

    path = tmp_path / "state.json"
    assert load_state(path, stamp={"commit": "aaa", "dirty": False}) == {"commit": "aaa", "dirty": False}
    earlier = {"commit": "aaa", "dirty": True, "source": "stated by the launcher", "device_seconds": 12.5}
    save_state(path, earlier)
    # A later command's stamp replaces the earlier one (no stale "source" left behind); the work
    # kept is untouched.
    resumed = load_state(path, stamp={"commit": "bbb", "dirty": False})
    assert resumed == {"commit": "bbb", "dirty": False, "device_seconds": 12.5}
    assert list(resumed)[:2] == ["commit", "dirty"]


def test_the_plan_is_simulated_for_the_gpu_that_runs_it(tmp_path: Path) -> None:
    # The device tool may lend an H100 for an H200 call: the GPU torch names picks the simulated
    # hardware, its memory and the table file name; a GPU the simulator does not know is refused.
    assert e2e.hardware_of("NVIDIA H100 80GB HBM3") == "h100"
    assert e2e.hardware_of("NVIDIA H200") == "h200"
    with pytest.raises(ValueError, match="no simulated loads"):
        e2e.hardware_of("NVIDIA A10G")
    plans = {}
    for hardware in ("h100", "h200"):
        plan_path = tmp_path / f"plan-{hardware}.json"
        argv = [
            "--dry-run", "--no-validate", "--hardware", hardware, "--shapes", "qwen3-30b-a3b-e64",
            "--traces", "azure_conv", "--sim-requests", "60", "--sim-window-s", "5",
            "--work", str(tmp_path / "work"), "--plan-out", str(plan_path),
        ]  # fmt: skip
        assert e2e.main(argv) == 0
        plans[hardware] = json.loads(plan_path.read_text())
    h100, h200 = plans["h100"], plans["h200"]
    assert (h100["hardware"], h100["device_memory_gib"]) == ("h100", 79.1)
    assert h100["shapes"]["qwen3-30b-a3b-e64"]["table_file_name"].endswith(
        "device_name=NVIDIA_H100_80GB_HBM3.json"
    )
    # A kept plan for one GPU is not resumed on the other: its loads were simulated for that one.
    args = argparse.Namespace(hardware="h100", shapes=["qwen3-30b-a3b-e64"], traces=["azure_conv"])
    assert e2e._covers(h100, args) and not e2e._covers(h200, args)
    assert e2e._merge(h200, h100) == h100
