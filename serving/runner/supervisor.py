"""The local runner: an endpoint's supervisor as a detached process on this machine.

`start` launches `endpoint serve` (serving/runner/cli.py: vllm-router at the stable port, the
engine behind it, crash restarts, zero-failure swaps when the config file changes) in its own
session, so it outlives whoever started it; in the portal that is always the agent of the
endpoint's host, never the web process. The runner talks to it through its folder: the
configuration in (`config.json`, written atomically; the supervisor swaps engines when it
changes), the state out (`state.json`), the key in a 0600 file (never on a command line), and
the SLA ingest's token likewise when the launch names an ingest (the measuring proxy then holds
the endpoint's port, in front of the router).

The endpoint's port is picked here, at `start`, unless the launch names one: only the host that
serves the endpoint knows which of its ports are free, so the web side never picks it. The
handle reports it (`data["port"]`) and a restart on the same host keeps it.

The handle is the folder and the supervisor's pid. A stored pid outlives its process and the
kernel hands pids out again, so a pid counts as this endpoint's supervisor only while that live
process's command line names this endpoint's own state file; anything else is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from serving.engine import moe_tables
from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.engine.launcher import free_port
from serving.runner import k8s_tables
from serving.runner.base import (
    EndpointLaunch,
    MetricsReading,
    MetricsWindow,
    RunnerError,
    RunnerHandle,
    RunnerState,
    window_between,
)

KIND = "local"
# The supervisor's own states map onto the runner's; while its engine is down and being
# restarted the endpoint is not serving: degraded, with the cause in the detail.
_STATUS = {
    "starting": "starting",
    "healthy": "healthy",
    "restarting": "degraded",
    "degraded": "degraded",
    "failed": "failed",
    "stopped": "stopped",
}


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (the state is field 0, the start time field 19)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def process_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def process_start_time(pid: int) -> str | None:
    """When the process started (clock ticks after boot): with the pid, it names one process."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None else None


def _running(pid: int, started: str | None) -> bool:
    """The same process (pid and start time) still exists and has not exited."""
    return process_alive(pid) and process_start_time(pid) == started


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class LocalSupervisorRunner:
    kind = KIND
    KILL_WAIT_S = 10.0  # after SIGKILL, how long the exit may take before the stop fails

    def __init__(self, root: Path, *, python: str | None = None, cwd: Path | None = None) -> None:
        self.root = Path(root)  # one folder per endpoint below it
        self.python = python or sys.executable
        self.cwd = cwd

    # -- the folder -----------------------------------------------------------------------------

    def folder_for(self, endpoint_id: str) -> Path:
        return self.root / endpoint_id

    def handle_for(self, endpoint_id: str, pid: int | None = None, port: int | None = None) -> RunnerHandle:
        data: dict[str, Any] = {
            "dir": str(self.folder_for(endpoint_id)),
            "pid": pid,
            "hostname": socket.gethostname(),
        }
        if port is not None:
            data["port"] = port
        return RunnerHandle(kind=KIND, data=data)

    def _port(self, launch: EndpointLaunch, existing: RunnerHandle | None) -> int:
        """The endpoint's port on this host: the one asked for, else the one it had here (a
        restart keeps its address), else a free one picked here, never one to avoid."""
        if launch.port is not None:
            return launch.port
        earlier = existing.data.get("port") if existing is not None else None
        if existing is not None and existing.data.get("hostname") == socket.gethostname() and earlier:
            return int(earlier)
        for _ in range(50):
            port = free_port(launch.bind_address)
            if port not in launch.avoid_ports:
                return port
        raise RunnerError("no free port on this host for the endpoint (50 picks were all in use or reserved)")

    @staticmethod
    def _folder(handle: RunnerHandle) -> Path:
        if handle.kind != KIND or not handle.data.get("dir"):
            raise RunnerError(f"not a local runner's handle ({handle.kind})")
        return Path(str(handle.data["dir"]))

    def supervisor_alive(self, handle: RunnerHandle) -> bool:
        """Whether the handle's pid is still this endpoint's supervisor (see the module docstring)."""
        pid = handle.data.get("pid")
        if not isinstance(pid, int) or pid <= 0 or not process_alive(pid):
            return False
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        state_file = str(self._folder(handle) / "state.json").encode()
        return b"serve" in argv and state_file in argv

    def read_state_file(self, handle: RunnerHandle) -> dict[str, object]:
        try:
            data = json.loads((self._folder(handle) / "state.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- the protocol ---------------------------------------------------------------------------

    @staticmethod
    def _with_tables(folder: Path, config: dict[str, Any], tables: dict[str, str] | None) -> dict[str, Any]:
        """`config` pointing vLLM at the revision's tables, written below the endpoint's folder
        as `moe-tables/<digest>/` (a promotion with other tables gets another folder, so the
        engine still serving reads the tables it started with); `config` itself without tables."""
        if not tables:
            return config
        try:
            shipped = k8s_tables.tables_from_files(tables)
            target = folder / "moe-tables" / shipped.digest
            if not target.is_dir():
                staging = folder / "moe-tables" / f".{shipped.digest}.tmp"
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
                for name, text in shipped.files.items():
                    (staging / name).write_text(text)
                staging.rename(target)
            return moe_tables.with_tables(
                EngineConfig.from_mapping(config), str(target.resolve())
            ).to_mapping()
        except (k8s_tables.TablesRefused, moe_tables.MoETableError, InvalidEngineConfig, OSError) as exc:
            raise RunnerError(f"the endpoint's MoE tables cannot be placed: {exc}") from exc

    def prepare(self, launch: EndpointLaunch) -> RunnerHandle:
        """Write the endpoint's folder (configuration, tables and key) without starting anything."""
        folder = self.folder_for(launch.endpoint_id)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file = folder / "api_key"
        if launch.api_key:
            key_file.write_text(launch.api_key)
            key_file.chmod(0o600)
        config = self._with_tables(folder, launch.config, launch.moe_tables)
        atomic_write(folder / "config.json", json.dumps(config))
        return self.handle_for(launch.endpoint_id)

    def start(self, launch: EndpointLaunch, *, existing: RunnerHandle | None = None) -> RunnerHandle:
        if existing is not None and self.supervisor_alive(existing):
            return existing
        folder = self.folder_for(launch.endpoint_id)
        if not (folder / "config.json").exists() or (launch.api_key and not (folder / "api_key").exists()):
            self.prepare(launch)
        if not (folder / "api_key").exists():
            raise RunnerError("the endpoint's key file is missing (it was stopped); deploy it again")
        port = self._port(launch, existing)
        edge_args: list[str] = []
        if launch.edge_ingest_url and launch.edge_ingest_token:
            # Like the key: a 0600 file, never a command-line argument.
            token_file = folder / "edge_token"
            token_file.touch(mode=0o600)
            token_file.chmod(0o600)
            token_file.write_text(launch.edge_ingest_token)
            edge_args = [
                "--edge-ingest-url",
                launch.edge_ingest_url,
                "--edge-endpoint-id",
                launch.endpoint_id,
                "--edge-token-file",
                str(token_file),
            ]
        command = [
            self.python,
            "-m",
            "serving.runner.cli",
            "endpoint",
            "serve",
            "--model",
            launch.model,
            "--config",
            str(folder / "config.json"),
            "--port",
            str(port),
            "--host",
            launch.bind_address,
            "--work-dir",
            str(folder / "logs"),
            "--state-file",
            str(folder / "state.json"),
            "--api-key-file",
            str(folder / "api_key"),
            *edge_args,
        ]
        with (folder / "supervisor.log").open("ab") as log:
            # A new session: the endpoint outlives the process that started it.
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.cwd) if self.cwd else None,
            )
        return self.handle_for(launch.endpoint_id, process.pid, port)

    def apply_config(
        self, handle: RunnerHandle, config: dict[str, Any], *, moe_tables: dict[str, str] | None = None
    ) -> bool:
        """Write the configuration file when it differs (the supervisor then swaps engines).
        A missing folder means the endpoint is not served from this machine: nothing written."""
        folder = self._folder(handle)
        if not folder.is_dir():
            return False
        path = folder / "config.json"
        wanted = self._with_tables(folder, config, moe_tables)
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = None
        if current == wanted:
            return False
        try:
            atomic_write(path, json.dumps(wanted))
        except OSError as exc:
            raise RunnerError(f"could not write the endpoint's configuration file: {exc}") from exc
        return True

    def stop(self, handle: RunnerHandle, *, timeout_s: float = 60.0) -> None:
        pid = handle.data.get("pid")
        if isinstance(pid, int) and self.supervisor_alive(handle):
            # From here the process is followed by pid and start time, not by its command line:
            # an exiting process has released its memory (its command line reads empty) before
            # it has exited, and "stopped" means exited.
            started = process_start_time(pid)
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _running(pid, started) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _running(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # its own session: the router and engine go with it
                deadline = time.monotonic() + self.KILL_WAIT_S
                while _running(pid, started) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if _running(pid, started):
                    raise RunnerError(f"the endpoint's supervisor (pid {pid}) did not exit after SIGKILL")
        (self._folder(handle) / "api_key").unlink(missing_ok=True)
        (self._folder(handle) / "edge_token").unlink(missing_ok=True)

    def state(self, handle: RunnerHandle) -> RunnerState:
        raw = self.read_state_file(handle)
        reported = str(raw.get("status") or "starting")
        status = _STATUS.get(reported, "degraded")
        detail = str(raw.get("last_error") or "")
        if (
            handle.data.get("pid")
            and not self.supervisor_alive(handle)
            and status not in {"failed", "stopped"}
        ):
            status, detail = "degraded", "the endpoint's supervisor process is not running"
        engine_url = raw.get("engine_url")
        config = raw.get("config")
        return RunnerState(
            status=status,
            detail=detail[-2000:],
            engine_url=str(engine_url) if engine_url else None,
            generation=int(raw.get("generation") or 0),  # type: ignore[call-overload]
            restarts=int(raw.get("restarts") or 0),  # type: ignore[call-overload]
            config=config if isinstance(config, dict) else None,
            raw=raw,
        )

    def metrics_window(
        self, handle: RunnerHandle, previous: MetricsReading | None, *, timeout_s: float = 5.0
    ) -> MetricsWindow:
        state = self.state(handle)
        if not state.engine_url:
            raise RunnerError("the supervisor has not reported an engine address")
        try:
            response = httpx.get(f"{state.engine_url}/metrics", timeout=timeout_s)
            response.raise_for_status()
            return window_between(previous, response.text)
        except (httpx.HTTPError, ValueError) as exc:
            # Garbage or silence is a gap, never zeros.
            raise RunnerError(f"metrics unavailable: {type(exc).__name__}") from exc
