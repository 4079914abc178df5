"""Start, health-check and stop a vLLM OpenAI-compatible server process.

The engine runs under a small watchdog (`watchdog.py`) so that its whole process tree (API
server, engine core, workers) goes away when `stop()` is called, when the engine fails, and
also when the program that launched it is killed outright. The engine's output goes to a log
file; a launch that fails raises `EngineLaunchError` carrying the engine's own last log lines.

The command is configurable (argument or `TAILGUARD_ENGINE_COMMAND`), so a GPU host can point
it at its own vLLM installation or container; by default it is this interpreter's
`python -m vllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from serving._http import http_get
from serving.engine.config import EngineConfig, validate_args, vllm_importable
from serving.engine.watchdog import start_ticks as watchdog_start_ticks

DEFAULT_ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
ENGINE_COMMAND_ENV = "TAILGUARD_ENGINE_COMMAND"
_WATCHDOG = Path(__file__).with_name("watchdog.py")
_LOG_TAIL_LINES = 40


class EngineLaunchError(RuntimeError):
    """The engine did not come up.

    `engine_errors` holds the exception lines the engine logged (root cause first, e.g. the
    worker's `SafetensorError: ...` before the API server's "initialization failed"), and
    `log_tail` its last log lines.
    """

    def __init__(
        self, message: str, *, log_path: Path | None = None, log_tail: Sequence[str] | None = None
    ) -> None:
        self.log_path = log_path
        self.log_tail = tuple(
            log_tail if log_tail is not None else (read_log_tail(log_path) if log_path else ())
        )
        self.engine_errors = tuple(read_log_errors(log_path)) if log_path else ()
        where = f" (full log: {log_path})" if log_path else ""
        parts = [f"{message}{where}"]
        if self.engine_errors:
            parts.append("  engine errors:\n" + "\n".join(f"    {line}" for line in self.engine_errors))
        if self.log_tail:
            parts.append("  engine log, last lines:\n" + "\n".join(f"    {line}" for line in self.log_tail))
        super().__init__("\n".join(parts))


def default_engine_command() -> list[str]:
    """`TAILGUARD_ENGINE_COMMAND` (shell-split) if set, else this Python running vLLM's server module."""
    configured = os.environ.get(ENGINE_COMMAND_ENV, "").strip()
    if configured:
        return shlex.split(configured)
    return [sys.executable, "-m", DEFAULT_ENGINE_MODULE]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the engine binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def read_log_tail(path: Path, num_lines: int = _LOG_TAIL_LINES, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `num_lines` non-empty lines of a log file (reads at most its last `max_bytes`)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    lines = [line.rstrip() for line in data.decode("utf-8", errors="replace").splitlines()]
    return [line for line in lines if line.strip()][-num_lines:]


# vLLM prefixes log lines with "(Worker pid=N) ERROR 11-30 07:23:05 [file.py:953] ".
_LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s+(?:[A-Z]+\s+\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s)?")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def read_log_errors(path: Path, max_errors: int = 5) -> list[str]:
    """Exception lines (`SomeError: message`) in the engine log, in order, without repeats.

    An exception's indented continuation lines (pydantic and others put the detail there) are
    appended to it, each cut to 300 characters.
    """
    lines = [_LOG_PREFIX.sub("", line) for line in read_log_tail(path, num_lines=5000, max_bytes=4 * 2**20)]
    found: list[str] = []
    for i, line in enumerate(lines):
        text = line.strip()
        if not _EXCEPTION_LINE.match(text):
            continue
        detail = [text]
        for follow in lines[i + 1 : i + 3]:
            if not follow.startswith((" ", "\t")) or follow.lstrip().startswith(("File ", "^")):
                break
            detail.append(follow.strip()[:300])
        entry = " | ".join(detail)
        if entry not in found:
            found.append(entry)
    return found[:max_errors]


def process_group_members(pgid: int, leader_ticks: int | None = None) -> list[int]:
    """Pids of live (non-zombie) processes in process group `pgid` (Linux /proc scan).

    With `leader_ticks` (the engine's start time, as the watchdog read it), a group whose leader
    holds the number now but started at another time is someone else's (the kernel reuses pids
    once they are free; a PostgreSQL backend leads a group of its own): no members of ours.
    """
    if leader_ticks is not None:
        now = watchdog_start_ticks(pgid)
        if now is not None and now != leader_ticks:
            return []
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


@dataclass(frozen=True)
class EngineEndpoint:
    """Where a started engine answers."""

    base_url: str  # e.g. http://127.0.0.1:43210 (no trailing /v1)
    model_name: str  # the name clients pass as `model`
    api_key: str | None = None


class EngineProcess:
    """A running engine. Use as a context manager, or call `stop()`; both are idempotent."""

    def __init__(
        self,
        *,
        watchdog: subprocess.Popen[bytes],
        engine_pid: int,
        engine_start_ticks: int | None = None,
        host: str,
        port: int,
        model_name: str,
        api_key: str | None,
        log_path: Path,
        command: Sequence[str],
        grace_s: float,
    ) -> None:
        self._watchdog = watchdog
        self.engine_pid = engine_pid  # also the engine's process group id
        self.engine_start_ticks = engine_start_ticks  # tells the engine from a later holder of its pid
        self.host = host
        self.port = port
        self.log_path = log_path
        self.command = tuple(command)
        self._grace_s = grace_s
        self.endpoint = EngineEndpoint(
            base_url=f"http://{host}:{port}", model_name=model_name, api_key=api_key
        )

    def __repr__(self) -> str:
        return f"EngineProcess(url={self.endpoint.base_url!r}, pid={self.engine_pid}, alive={self.alive()})"

    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    @property
    def watchdog_pid(self) -> int:
        return self._watchdog.pid

    def alive(self) -> bool:
        return self._watchdog.poll() is None

    def log_tail(self, num_lines: int = _LOG_TAIL_LINES) -> list[str]:
        return read_log_tail(self.log_path, num_lines)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether `/health` answers 200 right now."""
        return _get_status(f"{self.base_url}/health", timeout_s=timeout_s, api_key=None) == 200

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until `/health` answers 200; raise `EngineLaunchError` (and stop) on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self._watchdog.poll()
            if status is not None:
                raise EngineLaunchError(
                    f"engine exited with status {status} during start-up", log_path=self.log_path
                )
            if self.healthy(timeout_s=2.0):
                return
            if time.monotonic() >= deadline:
                tail = self.log_tail()
                self.stop()
                raise EngineLaunchError(
                    f"engine not healthy after {timeout_s:.0f} s", log_tail=tail, log_path=self.log_path
                )
            time.sleep(0.5)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Stop the engine and everything it spawned; returns the watchdog's exit status."""
        wait_s = timeout_s if timeout_s is not None else self._grace_s + 15.0
        if self._watchdog.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.send_signal(signal.SIGTERM)
            try:
                self._watchdog.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait(timeout=10)
        # Belt and braces: whatever the watchdog could not reap.
        for _ in range(50):
            if not process_group_members(self.engine_pid, self.engine_start_ticks):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.engine_pid, signal.SIGKILL)
            time.sleep(0.1)
        if self._watchdog.stdin:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.close()
        return self._watchdog.returncode

    def leftover_pids(self) -> list[int]:
        """Processes of the engine's group still alive (empty after a clean stop)."""
        return process_group_members(self.engine_pid, self.engine_start_ticks)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _get_status(url: str, *, timeout_s: float, api_key: str | None) -> int | None:
    try:
        status, _ = http_get(url, timeout_s=timeout_s, api_key=api_key)
    except (OSError, TimeoutError):
        return None
    return status


def spawn_engine(
    *,
    model: str,
    config: EngineConfig,
    command: Sequence[str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    validate: bool = True,
    grace_s: float = 20.0,
) -> EngineProcess:
    """Start the engine under its watchdog and return at once (see `start_engine` to wait for health).

    With `validate` (the default) and vLLM importable here, the rendered flags go through vLLM's
    own parser first, and an invalid configuration raises `InvalidEngineConfig` before any
    process starts.
    """
    port = port if port is not None else free_port(host)
    args = config.to_args(model=model, host=host, port=port)
    if validate and vllm_importable():
        validate_args(args)
    base = list(command) if command is not None else default_engine_command()
    full_command = [*base, *args]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="tailguard-engine-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ)
    child_env.update(config.to_env())
    child_env.update(env or {})
    # The engine's own output is the useful part of an error; keep it line-buffered.
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    pid_file = Path(tempfile.mkdtemp(prefix="tailguard-engine-")) / "engine.pid"
    shown = [a if a != config.api_key else "***" for a in full_command]
    with log_path.open("ab") as log:
        log.write(f"[tailguard] command: {shlex.join(shown)}\n".encode())
        log.flush()
        watchdog = subprocess.Popen(
            [
                sys.executable,
                str(_WATCHDOG),
                "--pid-file",
                str(pid_file),
                "--grace-s",
                str(grace_s),
                "--",
                *full_command,
            ],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
        )
    engine_pid, engine_start_ticks = _wait_for_pid_file(pid_file, watchdog, log_path)
    model_name = config.served_model_name or model
    return EngineProcess(
        watchdog=watchdog,
        engine_pid=engine_pid,
        engine_start_ticks=engine_start_ticks,
        host=host,
        port=port,
        model_name=model_name,
        api_key=config.api_key,
        log_path=log_path,
        command=shown,
        grace_s=grace_s,
    )


def _wait_for_pid_file(
    pid_file: Path, watchdog: subprocess.Popen[bytes], log_path: Path
) -> tuple[int, int | None]:
    """The engine's pid and start time, as the watchdog wrote them ("PID TICKS")."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        if pid_file.exists():
            words = pid_file.read_text().split()
            with contextlib.suppress(OSError):
                pid_file.unlink()
                pid_file.parent.rmdir()
            return int(words[0]), (int(words[1]) if len(words) > 1 else None)
        if watchdog.poll() is not None:
            raise EngineLaunchError(
                f"engine watchdog exited with status {watchdog.returncode} before starting the engine",
                log_path=log_path,
            )
        time.sleep(0.05)
    watchdog.kill()
    raise EngineLaunchError("engine watchdog did not start the engine within 30 s", log_path=log_path)


def start_engine(
    *,
    model: str,
    config: EngineConfig,
    startup_timeout_s: float = 600.0,
    command: Sequence[str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    validate: bool = True,
) -> EngineProcess:
    """Start the engine and wait until it is healthy (see `spawn_engine` for the arguments)."""
    engine = spawn_engine(
        model=model,
        config=config,
        command=command,
        host=host,
        port=port,
        log_path=log_path,
        env=env,
        validate=validate,
    )
    try:
        engine.wait_healthy(startup_timeout_s)
    except BaseException:
        engine.stop()
        raise
    return engine


def served_models(
    base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
) -> list[dict[str, object]]:
    """The `/v1/models` list of an OpenAI-compatible endpoint."""
    status, body = http_get(f"{base_url.rstrip('/')}/v1/models", timeout_s=timeout_s, api_key=api_key)
    if status != 200:
        raise RuntimeError(f"{base_url}/v1/models answered HTTP {status}")
    data = json.loads(body.decode()).get("data", [])
    return [m for m in data if isinstance(m, dict)]
