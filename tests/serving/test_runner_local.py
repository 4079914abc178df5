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
from serving.engine.launcher import free_port
from serving.loadgen.api import replay_generated
from serving.loadgen.results import RequestResult
from serving.runner.local import LocalEndpoint

pytestmark = pytest.mark.engine


def _config(**overrides: object) -> EngineConfig:
    return EngineConfig.cpu_default(max_model_len=1024, cpu_kv_cache_space_gib=1, seed=0, **overrides)


def _complete(base_url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/completions",
        json={"model": model, "prompt": "hello there", "max_tokens": 4},
        timeout=60.0,
    )


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
        endpoint.deploy(_config(max_num_seqs=8))
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
