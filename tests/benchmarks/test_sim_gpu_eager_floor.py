"""The eager-floor fit recovers a known floor's form and size from single-request files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import sim_gpu_eager_floor as eager
from serving.perf import model as perf_model

H100 = "NVIDIA H100 80GB HBM3, 81559 MiB"
LENGTHS = (256, 512, 640, 768, 1024, 2048, 4096)


def _config(layers: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }


def _live(
    path: Path, layers: int, prefill: dict[int, float], *, gpu: str = H100, warmed: bool = True
) -> Path:
    method: dict[str, object] = {"max_num_batched_tokens": None, "max_model_len": 32768}
    method.update(repeats=4, output_tokens=16)
    if warmed:
        method["warm_up_requests_per_length"] = 1
    entries = [
        {"prompt_tokens": n, "requests": 4, "errors": 0, "engine": {"prefill_mean_ms": ms}}
        for n, ms in prefill.items()
    ]
    path.write_text(
        json.dumps(
            {
                "benchmark": "sim_gpu_isolated_live",
                "when": "2026-12-07T12:00:00+00:00",
                "machine": {"gpu": gpu},
                "model": f"llama-{layers}l",
                "model_config": _config(layers),
                "method": method,
                "lengths": entries,
            }
        )
    )
    return path


def _measured_as(
    tmp_path: Path, layers: int, floor_ms: float, name: str, *, per_request_ms: float = 0.0, **kw: object
) -> Path:
    """A live file whose every step costs max(the simulator's step, floor_ms), and each request
    `per_request_ms` beside: its prefill is read back from the simulator through the script's own
    points, then floored."""
    path = _live(tmp_path / name, layers, dict.fromkeys(LENGTHS, 1.0), **kw)  # type: ignore[arg-type]
    scratch = tmp_path / f"scratch-{name}"
    scratch.mkdir()
    points, _ = eager.read_points(path, scratch)
    prefill = {
        p.prompt_tokens: max(p.sim_ms, floor_ms if p.outside else 0.0) * p.steps + per_request_ms
        for p in points
    }
    return _live(path, layers, prefill, **kw)  # type: ignore[arg-type]


def test_a_per_request_cost_is_taken_off_before_the_floor_is_fitted(tmp_path: Path) -> None:
    # a 4 ms cost per request (scheduling to first token, beside the step) on a 300 us/layer floor
    fit = [_measured_as(tmp_path, n, 0.3 * n, f"fit{n}.json", per_request_ms=4.0) for n in (16, 32)]
    raw = eager.run(fit, [], rounds=5, progress=lambda _: None)
    net = eager.run(fit, [], rounds=5, offset="inside-graphs", progress=lambda _: None)
    assert all(s["offset_ms"] == pytest.approx(4.0, abs=1e-6) for s in net["sources"]["fit"])
    assert all(s["offset_ms"] is None for s in raw["sources"]["fit"])
    assert net["chosen_form"] == "per_layer"
    assert net["chosen"]["parameters"]["b"] == pytest.approx(300.0, rel=1e-3)
    assert net["forms"]["per_layer"]["fit_mape"] == pytest.approx(0.0, abs=1e-3)
    # read as measured, the cost inflates every point and no form fits it exactly
    assert raw["forms"]["per_layer"]["fit_mape"] > 0.01
    assert net["inside_graphs_sim_over_live"]["fit"] == pytest.approx([1.0] * 4, rel=1e-6)
    # a file without single-step lengths inside the graphs is used as measured
    long_only = _live(tmp_path / "long.json", 16, {2048: 30.0, 4096: 40.0})
    held = eager.run(fit, [long_only], rounds=5, offset="inside-graphs", progress=lambda _: None)
    assert held["sources"]["held_out"][0]["offset_ms"] is None
    assert all(r["offset_ms"] is None for r in held["rows"]["held_out"])


def test_a_floor_per_layer_is_recovered_chosen_and_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_layer_us = 450.0
    fit = [_measured_as(tmp_path, n, per_layer_us * n / 1000, f"fit{n}.json") for n in (16, 32)]
    held = [_measured_as(tmp_path, 48, per_layer_us * 48 / 1000, "held48.json", warmed=False)]
    result = eager.run(fit, held, rounds=20, progress=lambda _: None)
    assert result["hardware"] == "h100"
    assert result["chosen_form"] == "per_layer"
    assert result["chosen"]["parameters"]["b"] == pytest.approx(per_layer_us, rel=1e-3)
    ci = result["chosen"]["ci95"]["b"]
    assert ci["ci_low"] <= per_layer_us + 1 and ci["ci_high"] >= per_layer_us - 1
    forms = result["forms"]
    # the held-out depth is predicted by the per-layer floor, not by one fixed for every depth
    assert forms["per_layer"]["held_out_mape"] == pytest.approx(0.0, abs=1e-3)
    assert forms["fixed"]["held_out_mape"] > 0.05
    assert forms["none"]["fit_loss_msle"] > forms["per_layer"]["fit_loss_msle"]
    assert forms["per_layer"]["held_out_mape_warmed_up"] is None  # the held-out file had no warm-up
    # the points inside the graphs are reported, not fitted
    inside = [r for r in result["rows"]["fit"] if r["inside_graphs"]]
    assert {r["prompt_tokens"] for r in inside} == {256, 512}
    assert all(r["predicted_ms"] is None for r in inside)
    # stored where the step model reads it, and applied to that hardware's predictions
    monkeypatch.setattr(eager, "DATA_DIR", tmp_path)
    monkeypatch.setattr(perf_model, "DATA_DIR", tmp_path)
    for name in ("h100.json",):
        (tmp_path / name).write_text((Path(perf_model.__file__).parent / "data" / name).read_text())
    written = eager.write_calibration(result, tmp_path / "result.json")
    assert written.name == "h100_eager.json"
    stored = perf_model.load_efficiency("h100")
    assert stored is not None
    assert stored.eager_layer_floor_us == pytest.approx(per_layer_us, rel=1e-3)
    assert stored.eager_step_floor_ms == 0.0
    assert "per_layer" in stored.how
    without = perf_model.load_efficiency("h100", eager=False)
    assert without is not None and without.eager_layer_floor_us == 0.0


def test_a_fixed_floor_is_chosen_when_depth_does_not_matter(tmp_path: Path) -> None:
    fit = [_measured_as(tmp_path, n, 12.0, f"fit{n}.json") for n in (16, 32)]
    result = eager.run(fit, [], rounds=10, progress=lambda _: None)
    assert result["chosen_form"] == "fixed"
    assert result["chosen"]["parameters"]["a"] == pytest.approx(12.0, rel=1e-3)
    assert result["chosen"]["stored_fields"] == {"eager_step_floor_ms": 12.0, "eager_layer_floor_us": 0.0}
    assert result["forms"]["per_layer"]["fit_loss_msle"] > result["forms"]["fixed"]["fit_loss_msle"]


def test_bad_inputs_are_refused_with_the_reason(tmp_path: Path) -> None:
    one = _measured_as(tmp_path, 16, 8.0, "one.json")
    with pytest.raises(SystemExit, match="two model depths"):
        eager.run([one], [], rounds=5, progress=lambda _: None)
    other = _live(tmp_path / "h200.json", 32, {1024: 20.0}, gpu="NVIDIA H200, 143771 MiB")
    with pytest.raises(SystemExit, match="different hardware"):
        eager.run([one, other], [], rounds=5, progress=lambda _: None)
    not_live = tmp_path / "x.json"
    not_live.write_text(json.dumps({"benchmark": "sim_rank_gpu_live"}))
    with pytest.raises(SystemExit, match="not a sim_gpu_isolated live file"):
        eager.run([not_live], [], rounds=5, progress=lambda _: None)
    with pytest.raises(SystemExit, match="additive"):
        eager.stored_fields("additive", {"c": 3.0})


def test_the_forms_and_the_choice_rule() -> None:
    import numpy as np

    sim, layers = np.array([5.0, 20.0]), np.array([16.0, 32.0])
    assert list(eager.predict("per_layer", {"b": 500.0}, sim, layers)) == [8.0, 20.0]
    assert list(eager.predict("fixed_and_per_layer", {"a": 1.0, "b": 500.0}, sim, layers)) == [9.0, 20.0]
    assert list(eager.predict("additive", {"c": 2.0}, sim, layers)) == [7.0, 22.0]
    losses = {"none": 1.0, "fixed": 0.5, "per_layer": 0.4, "additive": 0.6, "fixed_and_per_layer": 0.37}
    assert eager.choose_form(losses) == "per_layer"  # the second parameter removed under a tenth
    assert eager.choose_form({**losses, "fixed_and_per_layer": 0.3}) == "fixed_and_per_layer"
