"""The launcher and its watchdog, driven with stand-in engine commands (fast, no vLLM)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from serving.engine import EngineConfig, EngineLaunchError, process_group_members, spawn_engine, start_engine

# A stand-in for the vLLM server: answers /health on --port and spawns a child process that
# would be orphaned if the launcher only stopped the top process.
FAKE_ENGINE = """
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"fake engine on {port}, child {child.pid}", flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

CRASHING_ENGINE = """
import sys
print("INFO loading model", flush=True)
print("(Worker pid=1) ERROR 11-30 07:23:05 [loader.py:1] Traceback (most recent call last):", flush=True)
print("(Worker pid=1) ERROR 11-30 07:23:05 [loader.py:1] ValueError: hidden size 100 is not divisible", flush=True)
print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
sys.exit(3)
"""


def _script(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def test_start_health_and_stop_leave_no_process(tmp_path: Path) -> None:
    engine = start_engine(
        model="fake",
        config=EngineConfig(),
        command=_script(tmp_path, "fake_engine.py", FAKE_ENGINE),
        log_path=tmp_path / "engine.log",
        validate=False,
        startup_timeout_s=30,
    )
    try:
        assert engine.healthy()
        assert len(process_group_members(engine.engine_pid)) == 2  # the engine and its child
        assert "--port" in engine.log_path.read_text().splitlines()[0]
    finally:
        engine.stop()
    assert engine.leftover_pids() == []
    assert not engine.alive()


def test_startup_crash_raises_with_the_root_cause(tmp_path: Path) -> None:
    with pytest.raises(EngineLaunchError) as excinfo:
        start_engine(
            model="fake",
            config=EngineConfig(),
            command=_script(tmp_path, "crash.py", CRASHING_ENGINE),
            log_path=tmp_path / "engine.log",
            validate=False,
            startup_timeout_s=30,
        )
    error = excinfo.value
    assert error.engine_errors[0] == "ValueError: hidden size 100 is not divisible"
    assert "status 3" in str(error) and "ValueError: hidden size 100" in str(error)


def test_startup_timeout_stops_the_engine(tmp_path: Path) -> None:
    hang = _script(tmp_path, "hang.py", "import time\nprint('warming up', flush=True)\ntime.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(EngineLaunchError, match="not healthy after 2 s") as excinfo:
        start_engine(
            model="fake",
            config=EngineConfig(),
            command=hang,
            log_path=tmp_path / "e.log",
            validate=False,
            startup_timeout_s=2,
        )
    assert time.monotonic() - started < 30
    assert "warming up" in "\n".join(excinfo.value.log_tail)


def test_watchdog_stops_the_engine_when_the_launcher_dies(tmp_path: Path) -> None:
    import signal
    import subprocess
    import textwrap

    fake = _script(tmp_path, "fake_engine.py", FAKE_ENGINE)
    caller_code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from serving.engine import EngineConfig, spawn_engine
        engine = spawn_engine(model="fake", config=EngineConfig(), command={fake!r}, validate=False,
                              log_path=Path({str(tmp_path / "engine.log")!r}))
        print(engine.engine_pid, flush=True)
        time.sleep(600)
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", caller_code], stdout=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    pgid = int(caller.stdout.readline())
    deadline = time.monotonic() + 20
    while len(process_group_members(pgid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(process_group_members(pgid)) == 2
    caller.send_signal(signal.SIGKILL)
    caller.wait(timeout=10)
    deadline = time.monotonic() + 30
    while process_group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_group_members(pgid) == []


def test_spawn_does_not_validate_when_told_not_to(tmp_path: Path) -> None:
    engine = spawn_engine(
        model="fake",
        config=EngineConfig(extra_args=("--not-a-vllm-flag",)),
        command=_script(tmp_path, "fake_engine.py", FAKE_ENGINE),
        log_path=tmp_path / "engine.log",
        validate=False,
    )
    with engine:
        engine.wait_healthy(30)
    assert engine.leftover_pids() == []


def test_a_reused_group_number_is_never_taken_for_the_engine_s() -> None:
    """The kernel hands a freed pid out again, and a process that gets it may lead a group of its
    own (a PostgreSQL backend does). Such a group is told from the engine's by its leader's start
    time, so neither the launcher nor the watchdog signals it."""
    import subprocess

    from serving.engine import watchdog

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ticks = watchdog.start_ticks(stranger.pid)
        assert ticks is not None
        # Its own group, led by itself: ours only if it is the process we started.
        assert process_group_members(stranger.pid, ticks) == [stranger.pid]
        assert process_group_members(stranger.pid, ticks - 1) == []
        assert watchdog._group_alive(stranger.pid, ticks)
        assert not watchdog._group_alive(stranger.pid, ticks - 1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(timeout=10)
    assert watchdog.start_ticks(stranger.pid) is None
