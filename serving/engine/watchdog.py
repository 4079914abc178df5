"""Keeps an engine process tree from outliving the program that started it.

Run as a script (standard library only, so it works with any Python):

    python watchdog.py --pid-file F --grace-s 20 -- ENGINE COMMAND...

It starts the engine in a new session (so the engine and every process it spawns share one
process group), then waits for any of: a stop request (SIGTERM/SIGINT/SIGHUP), end of file on
its standard input (the launcher holds the other end of that pipe, so the kernel closes it when
the launcher dies, even by SIGKILL), a change of parent (the launcher is gone), or the engine
exiting by itself. In every case it terminates the whole engine process group: SIGTERM to the
server (which stops its own workers), then SIGTERM to the group, then SIGKILL. It exits with
the engine's status when the engine exited by itself, 0 after a requested stop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType

_PREFIX = "[tailguard-watchdog]"


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if gone.

    A pid and a process group id are numbers the kernel hands out again once they are free
    (32768 of them on a default Linux, and every thread takes one), so "the group of pid P" is
    only the engine's while its leader is the process we started: same number, same start time.
    """
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 (one read; standard library only)
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _group_alive(pgid: int, leader_ticks: int | None) -> bool:
    """Whether the engine's process group still has members. Once the leader has been reaped,
    its number may be reused: a process that holds it now and started at another time leads
    a group of its own (a PostgreSQL backend does, for one), which is never ours to signal."""
    if leader_ticks is not None:
        now = start_ticks(pgid)
        if now is not None and now != leader_ticks:
            return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(engine: subprocess.Popen[bytes], ticks: int | None, wait_s: float, *, leader_only: bool) -> bool:
    """Wait until the group (or just its leader) is gone; True if it went within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader_done = engine.poll() is not None  # reaps the leader so the group can empty
        if not _group_alive(engine.pid, ticks) or (leader_only and leader_done):
            return True
        time.sleep(0.1)
    return False


def _stop_group(engine: subprocess.Popen[bytes], ticks: int | None, grace_s: float) -> None:
    """SIGTERM the server alone first (vLLM then stops its own workers in order), then the
    whole group, then SIGKILL whatever is left."""
    pgid = engine.pid
    if engine.poll() is None:  # never a reaped leader's pid: it may be someone else's by now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGTERM)
    if _wait(engine, ticks, grace_s, leader_only=True) and _wait(engine, ticks, 3.0, leader_only=False):
        return
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        if not _group_alive(pgid, ticks):
            return
        print(
            f"{_PREFIX} engine processes still running; sending {signal.Signals(sig).name} to the group",
            flush=True,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        if _wait(engine, ticks, wait_s, leader_only=False):
            return
    engine.poll()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--grace-s", type=float, default=20.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no engine command given")

    stop_reason: list[str] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop_reason.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, request_stop)

    parent = os.getppid()
    engine = subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL)
    # Read before anything can reap it: the engine is our child, its pid cannot be reused yet.
    ticks = start_ticks(engine.pid)
    tmp = args.pid_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{engine.pid} {ticks if ticks is not None else ''}\n")
    os.replace(tmp, args.pid_file)

    stdin_open = True
    while not stop_reason:
        status = engine.poll()
        if status is not None:
            # The engine ended by itself (crash, bad flag): clean up anything it left behind.
            _stop_group(engine, ticks, grace_s=2.0)
            return status
        if os.getppid() != parent:
            stop_reason.append("launcher gone")
            break
        if stdin_open:
            try:
                readable, _, _ = select.select([sys.stdin.fileno()], [], [], 0.2)
            except InterruptedError:
                continue
            if readable and not os.read(sys.stdin.fileno(), 64):
                stop_reason.append("launcher closed its pipe")
                stdin_open = False
        else:
            time.sleep(0.2)
    print(f"{_PREFIX} stopping engine ({stop_reason[0]})", flush=True)
    _stop_group(engine, ticks, grace_s=args.grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
