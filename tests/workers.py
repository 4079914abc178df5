"""Real Celery workers and brokers for the tests that need them, one way.

A worker is a separate process (`celery -A portal worker --pool=solo`) in its own session, so
stopping it stops whatever it started; it shares the test database (PostgreSQL only: a worker
cannot see an SQLite test database's transactions) and logs to a file the test reads on failure.
The test process itself sends tasks for real (not eagerly) only inside `sending_to`.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.conftest import REPO_ROOT


def require_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("workers share the test database only on PostgreSQL")


def database_url() -> str:
    """The test database as a worker process reaches it."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("postgresql"):
        return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    return f"sqlite:///{s['NAME']}"


def redis_or_skip(url: str, *, flush: bool = True) -> str:
    """`url` if a Redis answers there (CI must have one: a failure, not a skip). With `flush`, the
    database is emptied first: it is the calling test's alone, and an earlier run may have left
    tasks in it."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=2)
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}")
    if flush:
        client.flushdb()
    return url


def worker_env(*, broker_url: str, settings: Any = None, **extra: str) -> dict[str, str]:
    """This process's environment for a worker on `broker_url` and the test database; with
    `settings`, the worker also uses the test's folders for samples, jobs and stored objects."""
    env = dict(os.environ)
    env.update(DATABASE_URL=database_url(), CELERY_BROKER_URL=broker_url, CELERY_TASK_ALWAYS_EAGER="false")
    if settings is not None:
        env.update(
            TRAFFIC_STAGING_DIR=str(settings.TRAFFIC_STAGING_DIR),
            TRAFFIC_WORKLOAD_DIR=str(settings.TRAFFIC_WORKLOAD_DIR),
            TUNING_WORK_DIR=str(settings.TUNING_WORK_DIR),
            COMPLIANCE_STORAGE_DIR=str(settings.COMPLIANCE_STORAGE_DIR),
        )
    env.update(extra)
    return env


def start_worker(
    env: dict[str, str],
    log: Path,
    *,
    queues: Sequence[str] = (),
    beat_schedule: Path | None = None,
    quiet: bool = True,
) -> subprocess.Popen[bytes]:
    """A worker process appending its output to `log`. `beat_schedule` embeds the beat (with its
    schedule file there); `quiet` leaves out mingle and gossip (a worker alone needs neither)."""
    command = [sys.executable, "-m", "celery", "-A", "portal", "worker"]
    if beat_schedule is not None:
        command += ["--beat", f"--schedule={beat_schedule}"]
    command.append("--pool=solo")
    if queues:
        command += ["-Q", ",".join(queues)]
    command.append("--loglevel=INFO")
    if quiet:
        command += ["--without-mingle", "--without-gossip"]
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's session (a warm shutdown), SIGKILL if it is not gone in 30 s."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@contextmanager
def running_worker(env: dict[str, str], log: Path, **options: Any) -> Iterator[subprocess.Popen[bytes]]:
    process = start_worker(env, log, **options)
    try:
        yield process
    finally:
        stop_worker(process)


@contextmanager
def sending_to(url: str, transport_options: dict[str, Any] | None = None) -> Iterator[None]:
    """This process (the web side) sends its tasks to `url` for real (not eagerly), with these
    transport options (None: the configured ones)."""
    from portal.celery import app

    saved = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.update(task_always_eager=False, broker_url=url)
    if transport_options is not None:
        app.conf.update(broker_transport_options=transport_options)
    # Drop connections made to another broker earlier in this process.
    app._pool = None
    app.amqp._producer_pool = None
    try:
        yield
    finally:
        app.conf.update(task_always_eager=True, broker_url=saved[0], broker_transport_options=saved[1])
        app._pool = None
        app.amqp._producer_pool = None


def unreachable_broker_url() -> str:
    """A Redis URL at a port nobody listens on: every send is refused at once (a broker down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def queued_messages(url: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every task message waiting in the Redis broker at `url`, as (queue, task name, keyword
    arguments): what the workers would take, read without taking it."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    found = []
    for key in sorted(client.scan_iter()):
        # Kombu keeps each queue as a list; its bindings and unacknowledged messages are not lists.
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            message = json.loads(raw)
            _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append((key.decode(), message["headers"]["task"], kwargs))
    return found


def wait_for(condition: Callable[[], object], log: Path, what: str, timeout_s: float = 180) -> None:
    """Polls `condition` until it holds; fails with the worker log's tail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen; worker log:\n{log.read_text(errors='replace')[-5000:]}")
        time.sleep(0.3)
