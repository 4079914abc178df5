"""The endpoint runner interface: both runners implement it; the local one's files and refusals;
metrics windows; the Kubernetes one refuses, naming why, before anything is sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving.engine.config import EngineConfig
from serving.runner.base import (
    EndpointLaunch,
    EndpointRunner,
    MetricsReading,
    RunnerError,
    RunnerHandle,
    window_between,
)
from serving.runner.k8s_runner import ClusterTarget, KubernetesRunner, object_name
from serving.runner.supervisor import LocalSupervisorRunner
from tests.serving.helpers import metrics_text

CONFIG = EngineConfig.cpu_default(max_model_len=1024).to_mapping()


def _launch(**overrides: object) -> EndpointLaunch:
    values: dict[str, object] = {
        "endpoint_id": "6f1c2d9e-1111-4222-8333-944455556666",
        "model": "/models/llama-xs",
        "config": CONFIG,
        "port": 45000,
        "api_key": "tgk_abcd_secret",
    }
    values.update(overrides)
    return EndpointLaunch(**values)  # type: ignore[arg-type]


def test_both_runners_implement_the_protocol(tmp_path: Path) -> None:
    local = LocalSupervisorRunner(tmp_path)
    cluster = KubernetesRunner(
        ClusterTarget(namespace="llm", hardware="h200", region="us-east-1", allowed_regions=frozenset({"us"}))
    )
    assert isinstance(local, EndpointRunner) and isinstance(cluster, EndpointRunner)
    assert {local.kind, cluster.kind} == {"local", "kubernetes"}
    handle = local.handle_for("e1", 123)
    assert RunnerHandle.from_dict(json.loads(json.dumps(handle.to_dict()))) == handle
    with pytest.raises(RunnerError, match="names no runner"):
        RunnerHandle.from_dict({"dir": "/x"})
    assert "tgk_abcd_secret" not in repr(_launch())  # the key is never printed


def test_local_runner_files_config_handover_and_stale_pids(tmp_path: Path) -> None:
    runner = LocalSupervisorRunner(tmp_path)
    handle = runner.prepare(_launch())
    folder = Path(str(handle.data["dir"]))
    assert json.loads((folder / "config.json").read_text()) == CONFIG
    key = folder / "api_key"
    assert key.read_text() == "tgk_abcd_secret" and key.stat().st_mode & 0o777 == 0o600
    # The same configuration is not written again (the supervisor would swap engines for nothing).
    assert runner.apply_config(handle, CONFIG) is False
    changed = {**CONFIG, "max_num_seqs": 8}
    assert runner.apply_config(handle, changed) is True
    assert json.loads((folder / "config.json").read_text())["max_num_seqs"] == 8
    # Not served from here (no folder): nothing is written, nothing raised.
    assert runner.apply_config(runner.handle_for("elsewhere"), changed) is False
    # Nothing reported yet: starting. A pid that is some other process is never the supervisor.
    assert runner.state(handle).status == "starting"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = runner.handle_for(_launch().endpoint_id, stranger.pid)
        assert not runner.supervisor_alive(stale)
        state = runner.state(stale)
        assert state.status == "degraded" and "supervisor process is not running" in state.detail
        runner.stop(stale, timeout_s=1)
        assert stranger.poll() is None, "a process that was not the supervisor got a signal"
        assert not key.exists()  # the key is revoked on this host
        # Once stopped, it cannot start again without a new key (a new deploy).
        with pytest.raises(RunnerError, match="key file is missing"):
            runner.start(_launch(api_key=""), existing=stale)
    finally:
        stranger.kill()
        stranger.wait(timeout=10)
    # The supervisor's report is mapped to the runner's words, its error first.
    (folder / "state.json").write_text(
        json.dumps(
            {"status": "restarting", "last_error": "the engine was killed by SIGKILL", "generation": 2}
        )
    )
    state = runner.state(handle)
    assert (state.status, state.generation) == ("degraded", 2) and "SIGKILL" in state.detail
    with pytest.raises(RunnerError, match="has not reported an engine address"):
        runner.metrics_window(handle, None)


def test_metrics_windows_measure_intervals_and_never_span_a_restart() -> None:
    first = metrics_text(queries=100, hits=50, prompt=1000, ttft_buckets=[1, 2, 3, 4], ttft_sum=1.5)
    later = metrics_text(queries=200, hits=150, prompt=3000, ttft_buckets=[2, 4, 6, 8], ttft_sum=3.0)
    start = window_between(None, first, taken_at_s=100.0)
    assert start.delta is None and "no earlier scrape" in start.reason
    window = window_between(start.reading, later, taken_at_s=110.0)
    assert window.delta is not None and window.delta.interval_s == pytest.approx(10.0)
    assert window.delta.prompt_tokens_per_s == pytest.approx(200.0)  # 2,000 prompt tokens in 10 s
    restarted = window_between(MetricsReading(later, 110.0), first, taken_at_s=120.0)
    assert restarted.delta is None and "restarted" in restarted.reason
    garbage = window_between(MetricsReading("not metrics {", 110.0), later, taken_at_s=120.0)
    assert garbage.delta is None and "could not be compared" in garbage.reason


def test_kubernetes_runner_refuses_before_sending_anything(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    target = ClusterTarget(
        namespace="llm", hardware="h200", region="us-east-1", allowed_regions=frozenset({"us"})
    )
    # A placement the organization's residency forbids is refused by the renderer, naming the field.
    eu_only = KubernetesRunner(ClusterTarget(**{**target.__dict__, "allowed_regions": frozenset({"eu"})}))
    with pytest.raises(RunnerError, match="region"):
        eu_only.start(_launch())
    # A valid endpoint with no cluster configured: the error says what to configure.
    with pytest.raises(RunnerError, match="no Kubernetes cluster is configured"):
        KubernetesRunner(target).start(_launch())
    assert object_name(_launch().endpoint_id) == "tg-6f1c2d9e11114222"


@pytest.mark.parametrize(
    ("on_sigterm", "timeout_s"),
    [
        # Exits on SIGTERM, after a clean-up that takes a while (the router and engine stopping).
        ("signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))", 30.0),
        # Ignores SIGTERM: killed, with its session, once the stop's time is up.
        ("signal.signal(signal.SIGTERM, signal.SIG_IGN)", 1.0),
    ],
    ids=["exits-on-sigterm", "ignores-sigterm"],
)
def test_local_runner_stop_returns_only_once_the_supervisor_has_exited(
    tmp_path: Path, on_sigterm: str, timeout_s: float
) -> None:
    """'Stopped' means the supervisor process has exited, not merely that its command line no
    longer reads as the endpoint's (it reads empty while an exiting process tears down)."""
    from serving.runner.supervisor import process_alive

    runner = LocalSupervisorRunner(tmp_path)
    handle = runner.prepare(_launch())
    state_file = Path(str(handle.data["dir"])) / "state.json"
    code = f"import signal, sys, time\n{on_sigterm}\nprint('ready', flush=True)\ntime.sleep(120)"
    stand_in = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--state-file", str(state_file)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert stand_in.stdout is not None and stand_in.stdout.readline().strip() == "ready"
        live = runner.handle_for(_launch().endpoint_id, stand_in.pid)
        assert runner.supervisor_alive(live)
        runner.stop(live, timeout_s=timeout_s)
        # Exited (a zombie until this process reaps it): nothing of it runs any more.
        assert not process_alive(stand_in.pid)
        assert stand_in.wait(timeout=10) is not None
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait(timeout=10)


# A table tuned on an H100 by benchmarks/kernels_e2e.py (run 9, Qwen3-30B-A3B on Mooncake).
H100_TABLE = Path(__file__).parent / "data" / "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json"


def test_the_local_runner_places_the_revisions_moe_tables_where_the_engine_reads_them(
    tmp_path: Path,
) -> None:
    runner = LocalSupervisorRunner(tmp_path)
    tables = {H100_TABLE.name: H100_TABLE.read_text()}
    handle = runner.prepare(_launch(moe_tables=tables))
    folder = Path(str(handle.data["dir"]))
    config = EngineConfig.from_mapping(json.loads((folder / "config.json").read_text()))
    placed = Path(dict(config.extra_env)["VLLM_TUNED_CONFIG_FOLDER"])
    assert placed.parent == (folder / "moe-tables").resolve()
    assert json.loads((placed / H100_TABLE.name).read_text()) == json.loads(H100_TABLE.read_text())
    # The same tables again change nothing; other tables are another folder (the engine still
    # serving keeps reading its own), and no tables point vLLM back at its own.
    assert runner.apply_config(handle, CONFIG, moe_tables=tables) is False
    other = json.loads(H100_TABLE.read_text())
    other["1"]["num_stages"] = 3 if other["1"]["num_stages"] != 3 else 4
    assert runner.apply_config(handle, CONFIG, moe_tables={H100_TABLE.name: json.dumps(other)}) is True
    assert len(list((folder / "moe-tables").iterdir())) == 2
    assert runner.apply_config(handle, CONFIG) is True
    assert json.loads((folder / "config.json").read_text()) == CONFIG
    # A file that is not a table is refused with its name, and nothing is written.
    with pytest.raises(RunnerError, match=r"MoE tables cannot be placed: .*not JSON"):
        runner.apply_config(handle, CONFIG, moe_tables={H100_TABLE.name: "{"})
    assert json.loads((folder / "config.json").read_text()) == CONFIG


def test_the_kubernetes_runner_ships_tables_for_its_hardware_only() -> None:
    runner = KubernetesRunner(
        ClusterTarget(namespace="llm", hardware="h200", region="us-east-1", allowed_regions=frozenset({"us"}))
    )
    with pytest.raises(
        RunnerError, match="is for NVIDIA_H100_80GB_HBM3, and the endpoint runs on NVIDIA_H200"
    ):
        runner._render(
            "chat",
            "/models/qwen3-30b-a3b",
            EngineConfig().to_mapping(),
            moe_tables={H100_TABLE.name: H100_TABLE.read_text()},
        )
