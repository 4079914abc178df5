"""The harness of the portal's fault tests and journeys: a real Celery worker with its beat on
the fault tests' own Redis database, recovery timings made quick, and connections dropped after
each test (these tests end database sessions on purpose).

Imported by `test_faults`, `test_faults_endpoints` and `test_journeys`; `model_root` and
`postgres` come from tests/portal/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tests.workers import redis_or_skip, running_worker, worker_env

# Worker settings that make the recovery quick: a step's lease runs out after 10 s (the least
# the settings allow) and the beat looks for undelivered or abandoned work every second.
FAST_RECOVERY = {
    "TUNING_LEASE_S": "10",
    "REDISPATCH_INTERVAL_S": "1",
}


@pytest.fixture(autouse=True)
def fresh_connections_after() -> Iterator[None]:
    """These tests end database sessions on purpose (as a server restart does). Whatever this
    process still holds afterwards may be one of them: drop them all, so the next test (in any
    module) opens new ones instead of inheriting a terminated session. Autouse in every module
    that imports it."""
    yield
    from django.db import connections

    connections.close_all()


@pytest.fixture
def redis_url() -> str:
    """The fault tests' own Redis database (emptied first)."""
    return redis_or_skip(os.environ.get("TAILGUARD_TEST_FAULTS_REDIS_URL", "redis://127.0.0.1:6379/14"))


def fault_worker_env(redis_url: str, settings: Any, model_root: Path) -> dict[str, str]:
    """A worker's environment on `redis_url`, the test's folders and models, quick recovery."""
    return worker_env(
        broker_url=redis_url, settings=settings, TUNING_MODEL_ROOTS=str(model_root), **FAST_RECOVERY
    )


@contextmanager
def fault_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    """A real worker process with its embedded beat; yields its log file."""
    log = tmp_path / "worker.log"
    with running_worker(
        env, log, queues=[django_settings.CELERY_TASK_DEFAULT_QUEUE], beat_schedule=tmp_path / "beat-schedule"
    ):
        yield log
