"""The local runner: a stable address over engine restarts and zero-failure re-deployments."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.engine import EngineConfig
from serving.engine.config import CPU_BIND_ENV
from serving.engine.host import parse_cpu_list, pinned_cores
from serving.engine.launcher import free_port
from serving.loadgen.api import replay_generated
from serving.loadgen.results import RequestResult
from serving.runner.local import LocalEndpoint, replacement_binding


def _config(**overrides: object) -> EngineConfig:
    return EngineConfig.cpu_default(max_model_len=1024, cpu_kv_cache_space_gib=1, seed=0, **overrides)


def _complete(base_url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/completions",
        json={"model": model, "prompt": "hello there", "max_tokens": 4},
        timeout=60.0,
    )


def test_a_replacement_engine_is_not_pinned_onto_the_serving_ones_cores() -> None:
    auto = _config()
    # Nothing pinned (a GPU engine, or vLLM told not to bind): the configuration's own binding.
    assert replacement_binding(auto, set(), {0, 1}) is None
    # A 2-core host: vLLM's auto binding put the old worker on core 0; the new one gets core 1.
    assert replacement_binding(auto, {0}, {0, 1}) == "1"
    assert replacement_binding(auto, {0, 1}, {0, 1, 2, 3}) == "2,3"
    # Too few cores left for a fair share (a 16-core host, auto leaves one): none pinned.
    assert replacement_binding(auto, set(range(15)), set(range(16))) == "nobind"
    # An explicit binding the old engine does not hold is kept; one it holds is not.
    assert replacement_binding(_config(extra_env=((CPU_BIND_ENV, "2-3"),)), {0, 1}, set(range(4))) is None
    assert replacement_binding(_config(extra_env=((CPU_BIND_ENV, "0-1"),)), {0}, set(range(4))) == "1,2,3"
    assert replacement_binding(_config(extra_env=((CPU_BIND_ENV, "nobind"),)), {0}, {0, 1}) is None
    # Tensor parallel on CPUs needs one list per rank: the replacement floats instead.
    assert replacement_binding(_config(tensor_parallel_size=2), {0, 1}, set(range(8))) == "nobind"
    assert parse_cpu_list("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}


@pytest.mark.engine
def test_redeploy_under_load_fails_no_request_and_keeps_the_address(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    endpoint = LocalEndpoint(model=str(tiny_model_dir), config=_config(), port=free_port(), work_dir=tmp_path)
    results: list[RequestResult] = []
    stop = threading.Event()

    def load() -> None:
        # Open-loop load through the router for the whole switch.
        while not stop.is_set():
            replay = replay_generated(
                endpoint=endpoint.base_url,
                num_requests=8,
                rate_rps=4.0,
                num_prompt_tokens=32,
                num_output_tokens=8,
                tokenizer=str(tiny_model_dir),
                model=str(tiny_model_dir),
                progress=False,
            )
            results.extend(replay.requests)

    with endpoint:
        address = endpoint.base_url
        old = endpoint.engine
        assert old is not None
        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        time.sleep(3)
        old_cores = pinned_cores(old.leftover_pids())
        endpoint.deploy(_config(max_num_seqs=8))
        # The two engines never shared a core while both ran (see replacement_binding).
        assert endpoint.engine is not None
        assert not pinned_cores(endpoint.engine.leftover_pids()) & old_cores
        time.sleep(3)
        stop.set()
        thread.join(timeout=120)
        assert endpoint.base_url == address
        assert endpoint.engine is not None and endpoint.engine is not old
        assert not old.alive() and old.leftover_pids() == []
        assert endpoint.router.workers() == [endpoint.engine.base_url]
        assert _complete(address, str(tiny_model_dir)).status_code == 200
    errors = [r.error for r in results if not r.ok]
    assert len(results) >= 16
    assert errors == [], errors[:3]
    assert endpoint.engine.leftover_pids() == []


@pytest.mark.engine
def test_a_crashed_engine_restarts_then_repeated_crashes_degrade(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    endpoint = LocalEndpoint(
        model=str(tiny_model_dir),
        config=_config(),
        port=free_port(),
        work_dir=tmp_path,
        max_restarts=1,
        backoff_s=0.5,
    )
    with endpoint:
        address = endpoint.base_url
        first = endpoint.engine
        assert first is not None
        os.killpg(first.engine_pid, signal.SIGKILL)
        time.sleep(1)
        assert endpoint.check() == "healthy"
        assert endpoint.engine is not first and endpoint.base_url == address
        assert _complete(address, str(tiny_model_dir)).status_code == 200
        second = endpoint.engine
        assert second is not None
        os.killpg(second.engine_pid, signal.SIGKILL)
        time.sleep(1)
        assert endpoint.check() == "degraded"
        assert endpoint.state.last_error
        assert endpoint.check() == "degraded"  # no restart loop
    assert endpoint.state.status == "stopped"
