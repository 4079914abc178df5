"""The local runner: one endpoint on this machine, behind `vllm-router` at a fixed address.

The router (an existing proxy, not ours) owns the stable port. Engines come and go behind it:

- `start()` starts the router and the first engine and registers the engine as a worker;
- `check()` restarts a dead engine with exponential back-off, and after `max_restarts` crashes
  inside `restart_window_s` marks the endpoint degraded instead of restart-looping. It reports
  "restarting" through `on_change` *before* the back-off and the new engine's start-up (a
  minute or more here), so whoever watches the state sees the outage while it lasts;
- `deploy(config)` swaps configurations without failing a request: the new engine starts and
  must be healthy, then it joins the router, then the old one leaves the router, drains its
  in-flight requests, and only then stops. On vLLM's CPU build the new engine is not pinned onto
  the cores the serving one is pinned to (`replacement_binding`): both would share one core while
  the cores left to the frontends stay idle, and the new one's start-up could starve behind the
  old one's busy worker for as long as the old one serves.

With an SLA ingest named (`edge`), the measuring proxy (`python -m serving.edge`) takes the
stable address instead: clients reach the proxy, the proxy the router (then on a loopback port),
and every generation request's TTFT and status go to the portal as the client saw them. The
proxy starts after the router and stops first, so it sees every request the endpoint served and
sends its records before the endpoint is gone; `check()` restarts it if it dies (the time it was
down is a gap in the SLA's coverage, never compliance).

The router, the proxy and the engines run under the launcher's watchdog, so none outlives the
process that started it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

import serving.engine
from serving.edge import TOKEN_ENV, IngestTarget
from serving.engine.config import CPU_BIND_ENV, EngineConfig
from serving.engine.host import parse_cpu_list, pinned_cores
from serving.engine.launcher import EngineLaunchError, EngineProcess, free_port, read_log_tail, start_engine
from serving.metrics import scrape

_WATCHDOG = Path(serving.engine.__file__).parent / "watchdog.py"


def replacement_binding(config: EngineConfig, taken: set[int], allowed: set[int]) -> str | None:
    """The CPU binding for an engine started while another, pinned to `taken`, still serves.

    None keeps `config`'s own: nothing is pinned, or the configuration names cores disjoint from
    `taken`. Otherwise the cores `taken` leaves free when they are at least as many (a 2-core
    host: the old worker on core 0, the new on core 1), else "nobind" (the new engine's threads
    float over every core rather than queue behind the old worker's)."""
    if not taken:
        return None
    requested = dict(config.extra_env).get(CPU_BIND_ENV, "auto")
    if requested == "nobind":
        return None
    if requested != "auto":
        with contextlib.suppress(ValueError):
            if not parse_cpu_list(requested.replace("|", ",")) & taken:
                return None
    free = allowed - taken
    if free and len(free) >= len(taken) and config.tensor_parallel_size == 1:
        return ",".join(str(core) for core in sorted(free))
    return "nobind"


class RouterError(RuntimeError):
    """The router did not start or refused a worker change; the message has its log."""


def router_command() -> list[str]:
    """`vllm-router` from this environment (installed with the engine extra)."""
    candidate = Path(sys.executable).parent / "vllm-router"
    return [str(candidate)] if candidate.exists() else ["vllm-router"]


class _WatchedProcess:
    """A helper process of the endpoint started under the engine watchdog: alive while its
    watchdog is; stopped with SIGTERM, then killed after `STOP_WAIT_S`."""

    STOP_WAIT_S = 20.0
    _watchdog: subprocess.Popen[bytes] | None

    def alive(self) -> bool:
        return self._watchdog is not None and self._watchdog.poll() is None

    def stop(self) -> None:
        if self._watchdog is None:
            return
        if self._watchdog.poll() is None:
            self._watchdog.terminate()
            try:
                self._watchdog.wait(timeout=self.STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait(timeout=10)
        if self._watchdog.stdin:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.close()


class RouterProcess(_WatchedProcess):
    """vllm-router on a fixed port, with workers added and removed at run time."""

    def __init__(self, *, port: int, log_path: Path, host: str = "127.0.0.1") -> None:
        self.host, self.port, self.log_path = host, port, log_path
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        # Listening on every address still answers on loopback, which is where we talk to it.
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host  # noqa: S104
        return f"http://{host}:{self.port}"

    def start(self, first_worker: str, timeout_s: float = 60.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        pid_file = Path(tempfile.mkdtemp(prefix="tailguard-router-")) / "router.pid"
        command = [
            *router_command(),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--worker-urls",
            first_worker,
            "--policy",
            "round_robin",
            "--health-check-interval-secs",
            "2",
            "--request-timeout-secs",
            "600",
            "--log-level",
            "warning",
            # Its own metrics port: the default (29000) would collide between two routers.
            "--prometheus-host",
            "127.0.0.1",  # the router's own metrics stay on the host
            "--prometheus-port",
            str(free_port()),
        ]
        with self.log_path.open("ab") as log:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    str(_WATCHDOG),
                    "--pid-file",
                    str(pid_file),
                    "--grace-s",
                    "5",
                    "--",
                    *command,
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._watchdog.poll() is not None:
                raise RouterError(
                    "router exited during start-up:\n" + "\n".join(read_log_tail(self.log_path, 20))
                )
            if first_worker in self.workers(quiet=True):
                return
            time.sleep(0.3)
        self.stop()
        raise RouterError(
            f"router not ready after {timeout_s:.0f} s:\n" + "\n".join(read_log_tail(self.log_path, 20))
        )

    def workers(self, *, quiet: bool = False) -> list[str]:
        try:
            response = httpx.get(f"{self.base_url}/list_workers", timeout=5.0)
            response.raise_for_status()
        except httpx.HTTPError:
            if quiet:
                return []
            raise
        data = response.json()
        urls = (data.get("urls") or data.get("workers") or []) if isinstance(data, dict) else data
        return [u if isinstance(u, str) else str(u.get("url")) for u in urls or []]

    def add_worker(self, url: str) -> None:
        response = httpx.post(f"{self.base_url}/add_worker", params={"url": url}, timeout=60.0)
        if response.status_code >= 400:
            raise RouterError(f"router refused worker {url}: {response.status_code} {response.text[:300]}")

    def remove_worker(self, url: str) -> None:
        response = httpx.post(f"{self.base_url}/remove_worker", params={"url": url}, timeout=30.0)
        if response.status_code >= 400:
            raise RouterError(f"router refused to remove {url}: {response.status_code} {response.text[:300]}")


class EdgeProxyError(RuntimeError):
    """The measuring proxy did not start; the message has its log."""


class EdgeProxyProcess(_WatchedProcess):
    """The measuring proxy (serving.edge) at the endpoint's stable address, in front of `upstream`."""

    # Its own shutdown (running requests finish, then the last flush) fits inside the watchdog's grace.
    SHUTDOWN_GRACE_S = 10.0
    DRAIN_TIMEOUT_S = 10.0
    STOP_WAIT_S = SHUTDOWN_GRACE_S + DRAIN_TIMEOUT_S + 15.0

    def __init__(self, *, port: int, ingest: IngestTarget, log_path: Path, host: str = "127.0.0.1") -> None:
        self.host, self.port, self.ingest, self.log_path = host, port, ingest, log_path
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host  # noqa: S104
        return f"http://{host}:{self.port}"

    def _listening(self) -> bool:
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host  # noqa: S104
        with contextlib.suppress(OSError), socket.create_connection((host, self.port), timeout=1.0):
            return True
        return False

    def start(self, upstream: str, timeout_s: float = 60.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        pid_file = Path(tempfile.mkdtemp(prefix="tailguard-edge-")) / "edge.pid"
        listen = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        command = [
            sys.executable,
            "-m",
            "serving.edge",
            "--listen",
            listen,
            "--upstream",
            upstream,
            "--ingest-url",
            self.ingest.url,
            "--endpoint-id",
            self.ingest.endpoint_id,
            "--shutdown-grace-s",
            str(self.SHUTDOWN_GRACE_S),
            "--drain-timeout-s",
            str(self.DRAIN_TIMEOUT_S),
            # The proxy's own request log, beside the engine logs: what an auditor compares the
            # portal's figures with.
            "--record-log",
            str(self.log_path.with_name("edge-requests.jsonl")),
        ]
        grace = self.SHUTDOWN_GRACE_S + self.DRAIN_TIMEOUT_S + 5.0
        with self.log_path.open("ab") as log:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    str(_WATCHDOG),
                    "--pid-file",
                    str(pid_file),
                    "--grace-s",
                    str(grace),
                    "--",
                    *command,
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                # The token travels in the environment, never on the command line (`ps` shows that).
                env={**os.environ, TOKEN_ENV: self.ingest.token},
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._watchdog.poll() is not None:
                raise EdgeProxyError(
                    "the measuring proxy exited during start-up:\n"
                    + "\n".join(read_log_tail(self.log_path, 20))
                )
            if self._listening():
                return
            time.sleep(0.2)
        self.stop()
        raise EdgeProxyError(
            f"the measuring proxy was not listening after {timeout_s:.0f} s:\n"
            + "\n".join(read_log_tail(self.log_path, 20))
        )


@dataclass
class EndpointState:
    """What the runner reports (the portal stores it)."""

    status: str = "stopped"  # starting | healthy | restarting | degraded | stopped
    restarts: list[float] = field(default_factory=list)  # monotonic times of crash restarts
    generation: int = 0  # how many configurations have been deployed
    last_error: str = ""


class LocalEndpoint:
    def __init__(
        self,
        *,
        model: str,
        config: EngineConfig,
        port: int,
        work_dir: Path,
        startup_timeout_s: float = 600.0,
        drain_timeout_s: float = 120.0,
        max_restarts: int = 3,
        restart_window_s: float = 600.0,
        backoff_s: float = 2.0,
        engine_command: list[str] | None = None,
        on_change: Callable[[], None] | None = None,
        host: str = "127.0.0.1",
        edge: IngestTarget | None = None,
    ) -> None:
        self.model, self.config, self.port, self.work_dir = model, config, port, work_dir
        self.startup_timeout_s, self.drain_timeout_s = startup_timeout_s, drain_timeout_s
        self.max_restarts, self.restart_window_s, self.backoff_s = max_restarts, restart_window_s, backoff_s
        self.engine_command = engine_command
        # Called when `state` changes ahead of a long wait (the CLI writes its state file from
        # it): `check()` returns only once the replacement engine is up.
        self.on_change = on_change
        # The router listens where clients reach it (the pool's bind address); engines stay on
        # loopback behind it. With a measuring proxy, the proxy listens there and the router on
        # loopback behind it.
        self.edge: EdgeProxyProcess | None = None
        if edge is not None:
            self.edge = EdgeProxyProcess(port=port, ingest=edge, log_path=work_dir / "edge.log", host=host)
            self.router = RouterProcess(port=free_port(), log_path=work_dir / "router.log")
        else:
            self.router = RouterProcess(port=port, log_path=work_dir / "router.log", host=host)
        self.engine: EngineProcess | None = None
        self.state = EndpointState()

    @property
    def base_url(self) -> str:
        """The stable address clients use (append /v1 for the OpenAI API)."""
        return self.edge.base_url if self.edge is not None else self.router.base_url

    def _start_engine(self, config: EngineConfig) -> EngineProcess:
        self.state.generation += 1
        return start_engine(
            model=self.model,
            config=config,
            startup_timeout_s=self.startup_timeout_s,
            command=self.engine_command,
            log_path=self.work_dir / f"engine-{self.state.generation}.log",
            port=free_port(),
        )

    def start(self) -> None:
        self.state.status = "starting"
        self.engine = self._start_engine(self.config)
        try:
            self.router.start(self.engine.base_url)
            if self.edge is not None:
                self.edge.start(self.router.base_url)
        except (RouterError, EdgeProxyError):
            self.router.stop()
            self.engine.stop()
            raise
        self.state.status = "healthy"

    def deploy(self, config: EngineConfig) -> None:
        """Zero-failure switch to `config` (see the module docstring). The old engine keeps
        serving if the new one fails to start; the error is raised."""
        old = self.engine
        new = self._start_engine(self._beside(old, config))
        try:
            self.router.add_worker(new.base_url)
        except RouterError:
            new.stop()
            raise
        if old is not None:
            self.router.remove_worker(old.base_url)
            self._drain(old)
            old.stop()
        self.engine, self.config = new, config
        self.state.status = "healthy"

    @staticmethod
    def _beside(old: EngineProcess | None, config: EngineConfig) -> EngineConfig:
        """`config` for an engine started while `old` still serves (see `replacement_binding`)."""
        if old is None or not old.alive():
            return config
        bind = replacement_binding(config, pinned_cores(old.leftover_pids()), os.sched_getaffinity(0))
        if bind is None:
            return config
        env = dict(config.extra_env) | {CPU_BIND_ENV: bind}
        return dataclasses.replace(config, extra_env=tuple(sorted(env.items())))

    def _drain(self, engine: EngineProcess) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline:
            try:
                snap = scrape(engine.base_url, timeout_s=5.0)
            except Exception:
                return  # the engine is gone or not answering: nothing left to drain
            if snap.num_requests_running + snap.num_requests_waiting == 0:
                return
            time.sleep(0.2)

    def check(self) -> str:
        """One supervision round: restart a dead engine (with back-off), or mark degraded."""
        if self.engine is None or self.state.status in {"degraded", "stopped"}:
            return self.state.status
        if self.edge is not None and not self.edge.alive():
            # Requests cannot reach the endpoint without it; the time it was down is a coverage gap.
            try:
                self.edge.start(self.router.base_url)
            except EdgeProxyError as exc:
                self.state.last_error = f"the measuring proxy did not restart: {exc}"
        if self.engine.alive() and self.engine.healthy(timeout_s=5.0):
            self.state.status = "healthy"
            return self.state.status
        now = time.monotonic()
        self.state.restarts = [t for t in self.state.restarts if now - t < self.restart_window_s]
        dead = self.engine
        # The cause comes first (pages show the start); the log tail is kept short enough that
        # the state file's 2,000 characters still hold the cause.
        tail = "\n".join(dead.log_tail(20))[-1500:]
        with contextlib.suppress(RouterError, httpx.HTTPError):
            self.router.remove_worker(dead.base_url)
        why = _exit_description(dead.stop())
        if len(self.state.restarts) >= self.max_restarts:
            self.state.status = "degraded"
            self.state.last_error = (
                f"the engine {why}; not restarted: {len(self.state.restarts)} restarts within "
                f"{self.restart_window_s:.0f} s already\n{tail}"
            )
            return self.state.status
        self.state.status = "restarting"
        self.state.last_error = (
            f"the engine {why}; restarting it (restart {len(self.state.restarts) + 1} of at most "
            f"{self.max_restarts} within {self.restart_window_s:.0f} s)\n{tail}"
        )
        if self.on_change is not None:
            self.on_change()
        time.sleep(self.backoff_s * (2 ** len(self.state.restarts)))
        self.state.restarts.append(time.monotonic())
        try:
            self.engine = self._start_engine(self.config)
            self.router.add_worker(self.engine.base_url)
        except (EngineLaunchError, RouterError) as exc:
            self.state.last_error = str(exc)
            self.state.status = "restarting"
            return self.state.status
        self.state.status = "healthy"
        self.state.last_error = ""
        return self.state.status

    def stop(self) -> None:
        # The proxy first: its running requests finish through the engine, then it sends its records.
        if self.edge is not None:
            self.edge.stop()
        if self.engine is not None:
            self.engine.stop()
        self.router.stop()
        self.state.status = "stopped"

    def __enter__(self) -> LocalEndpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_description(status: int | None) -> str:
    """How an engine ended, from its watchdog's exit status. The watchdog passes the engine's
    own status on through `sys.exit`, so a death by signal N (-N from Popen) arrives as 256 - N."""
    if not status:
        return "stopped answering its health check"
    if status > 128:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(256 - status).name}"
    return f"exited with status {status}"
