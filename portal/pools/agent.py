"""The engine-host agent: `tailguard agent --pool NAME` on each engine host.

It is a Celery worker of the portal's own app (the same tasks, the same database and broker)
on its pool's queue (`pool.NAME`: trials, endpoint starts; any host of the pool may take them),
one task at a time in its own process (Celery's solo pool, prefetch 1): a measuring host runs
one measurement, and a second trial waits in the queue for another host. Beside it, a second
worker process of the same agent takes its own host's queue (`host.<id>`: a new configuration,
the watch's scrape, a stop for the endpoints running here), so those never wait behind a
trial; it ends with the agent (and on its own if the agent is killed).

Before it takes any work it registers its host with the facts it reports (CPU model and ISA,
GPUs from NVML or torch, vLLM version, free memory, its engine command); a host whose hardware
contradicts its pool's accelerator is quarantined, with the reason shown in the admin console,
and the agent exits without consuming anything. While it runs, a heartbeat thread refreshes the
facts every AGENT_HEARTBEAT_S, and each task it runs is recorded as the host's current task.
A clean shutdown marks the host stopped; a killed agent simply stops heartbeating, so after
POOL_HOST_LIVE_S its pool shows "waiting for a host" again, and its unfinished job step is
handed to another host by the jobs' lease and `jobs_redispatch`.

It needs what every worker needs: DATABASE_URL (with the workers' database role, which
row-level security lets do platform work), CELERY_BROKER_URL, the deployment's SECRET_KEY or
COMPLIANCE_STORAGE_KEY (an endpoint's key reaches the host sealed with it), and the model
folders the portal registered, at the same paths.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("tailguard.agent")

EXIT_REFUSED = 2  # unknown or disabled pool, bad host name
EXIT_QUARANTINED = 3  # the host's hardware contradicts the pool's accelerator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard agent", description="Run this machine as an engine host of a hardware pool."
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, help="the pool this host serves (its queue is pool.NAME)")
    parser.add_argument(
        "--name", default=socket.gethostname(), help="this host's name in the pool (default: the host name)"
    )
    parser.add_argument(
        "--engine-command",
        help="how this host starts vLLM (shell words; default TAILGUARD_ENGINE_COMMAND or this Python's vLLM), "
        "e.g. a GPU host's CUDA build: '/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server'",
    )
    parser.add_argument("--loglevel", default="INFO")
    # Internal: the agent starts its host queue's worker with this (see the module docstring).
    parser.add_argument("--control-for", help=argparse.SUPPRESS)


def _describe(task: Any, args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> str:
    # Ids only (tasks carry nothing else): what runs here, for the admin page.
    short = str(getattr(task, "name", "task")).rsplit(".", 1)[-1]
    parts = [str(a) for a in (args or ())] + [
        f"{k}={v}" for k, v in (kwargs or {}).items() if k not in {"pool", "host"}
    ]
    return f"{short} {' '.join(parts)}".strip()


class _Heartbeat(threading.Thread):
    def __init__(self, host_id: str, interval_s: float, gpus: Any) -> None:
        super().__init__(daemon=True, name="agent-heartbeat")
        self.host_id, self.interval_s, self.gpus = host_id, interval_s, gpus
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import DatabaseError, connection

        from portal.pools.services import host_heartbeat
        from serving.runner.hostfacts import host_facts

        while not self.stopping.wait(self.interval_s):
            try:
                host_heartbeat(host_id=self.host_id, facts=host_facts(gpus=self.gpus).to_dict())
            except DatabaseError as exc:
                # One missed beat; the next reconnects. The host turns "silent" only after
                # POOL_HOST_LIVE_S without one.
                logger.warning("heartbeat not recorded (%s)", exc)
                connection.close()
        connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.engine_command:
        # Trials and endpoints started by this agent use it (serving.engine.launcher reads it).
        os.environ["TAILGUARD_ENGINE_COMMAND"] = args.engine_command
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from celery import signals
    from django.conf import settings
    from django.core.exceptions import ValidationError
    from django.db import DatabaseError

    from portal.celery import app
    from portal.pools import services
    from portal.pools.models import Host
    from serving.runner.hostfacts import gpu_facts, host_facts

    if args.control_for:
        return _control_worker(app, args)

    gpus = gpu_facts()
    facts = host_facts(gpus=gpus).to_dict()
    try:
        host = services.host_register(pool_name=args.pool, name=args.name, facts=facts, agent_pid=os.getpid())
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            print(f"tailguard agent: {field}: {' '.join(messages)}", file=sys.stderr)
        return EXIT_REFUSED
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"tailguard agent: cannot reach the portal's database (DATABASE_URL): {first}", file=sys.stderr)
        return EXIT_REFUSED
    if host.state == Host.State.QUARANTINED:
        print(f"tailguard agent: host {host.name} quarantined: {host.quarantine_reason}", file=sys.stderr)
        return EXIT_QUARANTINED
    host_id = str(host.id)
    # What runs here records this host (endpoints started, trials measured): see host_here().
    from portal.pools.selectors import AGENT_HOST_ENV

    os.environ[AGENT_HOST_ENV] = host_id

    def started(task: Any = None, args: Any = None, kwargs: Any = None, **_: Any) -> None:
        services.host_task_started(host_id=host_id, description=_describe(task, args, kwargs))

    def finished(task: Any = None, args: Any = None, kwargs: Any = None, **_: Any) -> None:
        services.host_task_finished(host_id=host_id, description=_describe(task, args, kwargs))

    signals.task_prerun.connect(started, weak=False)
    signals.task_postrun.connect(finished, weak=False)
    beat = _Heartbeat(host_id, float(settings.AGENT_HEARTBEAT_S), gpus)
    beat.start()
    print(
        f"[tailguard-agent] host {host.name} ({host_id}) of pool {host.pool.name}: queues {host.pool.queue}, {host.queue}",
        flush=True,
    )
    control = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "portal.pools.agent",
            "--pool",
            args.pool,
            "--name",
            args.name,
            "--loglevel",
            args.loglevel,
            "--control-for",
            host_id,
        ]
    )
    try:
        app.worker_main(
            [
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "--prefetch-multiplier=1",
                "-Q",
                host.pool.queue,
                "-n",
                f"agent-{host.name}@{socket.gethostname()}",
                f"--loglevel={args.loglevel}",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:
        beat.stopping.set()
        control.terminate()
        try:
            control.wait(timeout=60)
        except subprocess.TimeoutExpired:
            control.kill()
        services.host_stopped(host_id=host_id)
    return 0


def _control_worker(app: Any, args: argparse.Namespace) -> int:
    """The agent's second worker: its host's queue only, ending when the agent ends."""
    from portal.pools.routing import host_queue

    parent = os.getppid()

    def orphaned() -> None:
        # A killed agent cannot stop this process: it stops itself (a warm shutdown).
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=orphaned, daemon=True, name="agent-parent-watch").start()
    app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "-Q",
            host_queue(args.control_for),
            "-n",
            f"agent-control-{args.name}@{socket.gethostname()}",
            f"--loglevel={args.loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
