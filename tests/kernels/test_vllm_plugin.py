"""Our RMSNorm kernels as a vLLM IR-op provider (kernels/vllm_plugin.py).

The provider is checked against vLLM's own "native" implementation through vLLM's dispatch (on
the GPU, or in Triton's interpreter here), its fallbacks, its discovery as a general plugin from a
folder on the path, and, in a real compiled engine, that both ops ran our kernel.
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch

from kernels import vllm_plugin
from tests.kernels.device import DEVICE, ON_GPU

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ir() -> Any:
    vllm = pytest.importorskip("vllm")
    del vllm
    from vllm import ir as vllm_ir

    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may load a plugin twice in one process: no second registration
    return vllm_ir


@pytest.mark.parametrize("tokens, hidden", [(1, 64), (7, 96)] if not ON_GPU else [(1, 4096), (300, 2048)])
def test_provider_matches_vllms_native_rmsnorm(
    ir: Any, tokens: int, hidden: int, gen: torch.Generator
) -> None:
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    res = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    w = torch.rand(hidden, device=DEVICE, dtype=torch.bfloat16, generator=gen) + 0.5
    for op, args in (("rms_norm", (x, w, 1e-6)), ("fused_add_rms_norm", (x, res, w, 1e-6))):
        ir_op = getattr(ir.ops, op)
        with ir_op.set_priority([vllm_plugin.PROVIDER, "native"]):
            assert ir_op.dispatch(*args).provider == vllm_plugin.PROVIDER
            ours = ir_op(*args)
        with ir_op.set_priority(["native"]):
            theirs = ir_op(*args)
        ours_t = ours if isinstance(ours, tuple) else (ours,)
        theirs_t = theirs if isinstance(theirs, tuple) else (theirs,)
        for a, b in zip(ours_t, theirs_t, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            # both normalise the float32 sum; they round the weight product differently (ours in
            # float32, vLLM's native after rounding to bf16): a bf16 ulp or two apart
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=3e-2)
    # the residual stream is the plain sum, rounded once
    with ir.ops.fused_add_rms_norm.set_priority([vllm_plugin.PROVIDER, "native"]):
        _, residual = ir.ops.fused_add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(
        residual.float(), (x.float() + res.float()).to(torch.bfloat16).float(), rtol=0, atol=0.07
    )


def test_calls_our_kernel_cannot_take_fall_back_to_vllms(ir: Any) -> None:
    x = torch.randn(3, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.ones(64, device=DEVICE, dtype=torch.bfloat16)
    with ir.ops.rms_norm.set_priority([vllm_plugin.PROVIDER, "native"]):
        assert ir.ops.rms_norm.dispatch(x, w, 1e-6, 32).provider == "native"  # a norm over part of the row
        assert ir.ops.rms_norm.dispatch(x, None, 1e-6).provider == "native"  # no weight
        assert ir.ops.rms_norm.dispatch(x.view(3, 2, 32), w[:32], 1e-6).provider == "native"  # not 2-D
        assert ir.ops.rms_norm.dispatch(x, w.float(), 1e-6).provider == "native"  # weight of another dtype


def test_entry_point_folder_makes_the_plugin_discoverable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = vllm_plugin.entry_point_dir(tmp_path)
    assert info.name == f"{vllm_plugin.PLUGIN_NAME}-0.dist-info"
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found[vllm_plugin.PLUGIN_NAME] == "kernels.vllm_plugin:register"
    assert json.loads(vllm_plugin.priority_json()) == {op: [vllm_plugin.PROVIDER] for op in vllm_plugin.OPS}


@pytest.mark.engine
def test_a_compiled_engine_runs_our_rmsnorm_through_the_plugin(tmp_path: Path) -> None:
    """A real vLLM engine (compiled, as served) with the plugin loaded the supported way: both
    RMSNorm ops run our kernel (its log says so), and the engine answers."""
    pytest.importorskip("vllm")
    from serving.engine import start_engine
    from serving.engine.launcher import served_models
    from serving.loadgen.api import replay_generated
    from serving.models import build_tiny_model
    from tests.serving.helpers import engine_config

    model = tmp_path / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=model, seed=0)
    plugins = vllm_plugin.entry_point_dir(tmp_path / "plugins").parent
    path = os.pathsep.join([str(plugins), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = [("VLLM_PLUGINS", vllm_plugin.PLUGIN_NAME), ("PYTHONPATH", path)]
    if not ON_GPU:
        env.append(("TRITON_INTERPRET", "1"))  # the engine's Triton kernels run in the interpreter
    config = dataclasses.replace(
        engine_config(),
        enforce_eager=False,  # compiled: vLLM's lowering pass must trace our provider into the graph
        extra_args=("--ir-op-priority", vllm_plugin.priority_json()),
        extra_env=tuple(env),
    )
    log = tmp_path / "engine.log"
    with start_engine(model=str(model), config=config, log_path=log, startup_timeout_s=600) as engine:
        assert served_models(engine.base_url)
        result = replay_generated(
            endpoint=engine.base_url,
            num_requests=2,
            rate_rps=10.0,
            num_prompt_tokens=16,
            num_output_tokens=4,
            seed=0,
            progress=False,
        )
    assert result.summary.num_errors == 0, [r.error for r in result.requests]
    text = log.read_text(errors="replace")
    assert "tailguard kernels: provider 'tailguard' registered" in text
    for op in vllm_plugin.OPS:
        assert f"tailguard kernels: {op} runs our Triton kernel" in text, op
