"""An endpoint's port is chosen on the engine host that serves it, by the runner its agent calls,
and reported back in the handle; the web side picks none. No engine starts: the supervisor's
command is echoed into its log instead of run."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest

from serving.engine.config import EngineConfig
from serving.runner import supervisor
from serving.runner.base import EndpointLaunch, RunnerError, RunnerHandle
from serving.runner.supervisor import LocalSupervisorRunner

CONFIG = EngineConfig.cpu_default(max_model_len=1024).to_mapping()
ENDPOINT = "6f1c2d9e-1111-4222-8333-944455556666"


def _runner(root: Path) -> LocalSupervisorRunner:
    echo = shutil.which("echo")
    assert echo is not None
    return LocalSupervisorRunner(root, python=echo)


def _launch(**overrides: object) -> EndpointLaunch:
    values: dict[str, object] = {
        "endpoint_id": ENDPOINT,
        "model": "/models/llama-xs",
        "config": CONFIG,
        "api_key": "tgk_abcd_secret",
    }
    values.update(overrides)
    return EndpointLaunch(**values)  # type: ignore[arg-type]


def _served_port(root: Path) -> int:
    words = (root / ENDPOINT / "supervisor.log").read_text().split()
    return int(words[words.index("--port") + 1])


def _wait_exit(runner: LocalSupervisorRunner, handle: RunnerHandle) -> None:
    # `echo` writes its one line and ends; then the handle's pid is no live supervisor (a restart
    # starts anew). Between fork and exec the child still carries pytest's command line, so
    # "not a supervisor" alone does not mean the line is written: wait for the line too.
    log = Path(handle.data["dir"]) / "supervisor.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        written = log.exists() and log.read_text().endswith("\n")
        if written and not runner.supervisor_alive(handle):
            return
        time.sleep(0.05)
    raise AssertionError(f"the echoed supervisor did not write its command line into {log}")


def test_the_runner_picks_a_free_port_on_its_host_reports_it_and_keeps_it_on_a_restart(
    tmp_path: Path,
) -> None:
    runner = _runner(tmp_path)
    # A port another endpoint of this host had (its clients may still call it) is not reused.
    reserved = 40002
    handle = runner.start(_launch(avoid_ports=(reserved,)))
    port = handle.data["port"]
    assert isinstance(port, int) and port != reserved
    assert handle.data["hostname"] == socket.gethostname()
    # The supervisor serves at the port the handle reports.
    _wait_exit(runner, handle)
    assert _served_port(tmp_path) == port
    # Restarted on the same host (its supervisor gone), it keeps its address.
    (tmp_path / ENDPOINT / "supervisor.log").unlink()
    again = runner.start(_launch(), existing=handle)
    _wait_exit(runner, again)
    assert again.data["port"] == port and _served_port(tmp_path) == port
    # A port given by the caller is used as given.
    (tmp_path / ENDPOINT / "supervisor.log").unlink()
    given = runner.start(_launch(port=45123))
    _wait_exit(runner, given)
    assert given.data["port"] == 45123 == _served_port(tmp_path)


def test_a_handle_from_another_host_does_not_lend_its_port(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    elsewhere = runner.handle_for(ENDPOINT, None, 40001)
    elsewhere.data["hostname"] = "another-host"
    handle = runner.start(_launch(avoid_ports=(40001,)), existing=elsewhere)
    assert handle.data["port"] != 40001 and handle.data["hostname"] == socket.gethostname()


def test_no_free_port_outside_the_ones_to_avoid_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "free_port", lambda host="127.0.0.1": 41000)
    with pytest.raises(RunnerError, match="no free port on this host"):
        _runner(tmp_path).start(_launch(avoid_ports=(41000,)))
    assert not (tmp_path / ENDPOINT / "supervisor.log").exists()
