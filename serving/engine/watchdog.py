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
from collections.abc import Callable
from types import FrameType

_PREFIX = "[tailguard-watchdog]"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(engine: subprocess.Popen[bytes], wait_s: float, *, leader_only: bool) -> bool:
    """Wait until the group (or just its leader) is gone; True if it went within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader_done = engine.poll() is not None  # reaps the leader so the group can empty
        if not _group_alive(engine.pid) or (leader_only and leader_done):
            return True
        time.sleep(0.1)
    return False


def _signal(send: Callable[[int, int], None], pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        send(pgid, sig)


def _stop_group(engine: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the server alone first (vLLM then stops its own workers in order), then the
    whole group, then SIGKILL whatever is left."""
    pgid = engine.pid
    _signal(os.kill, pgid, signal.SIGTERM)
    if _wait(engine, grace_s, leader_only=True) and _wait(engine, 3.0, leader_only=False):
        return
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        print(
            f"{_PREFIX} engine processes still running; sending {signal.Signals(sig).name} to the group",
            flush=True,
        )
        _signal(os.killpg, pgid, sig)
        if _wait(engine, wait_s, leader_only=False):
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
    tmp = args.pid_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{engine.pid}\n")
    os.replace(tmp, args.pid_file)

    stdin_open = True
    while not stop_reason:
        status = engine.poll()
        if status is not None:
            # The engine ended by itself (crash, bad flag): clean up anything it left behind.
            _stop_group(engine, grace_s=2.0)
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
    _stop_group(engine, grace_s=args.grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
