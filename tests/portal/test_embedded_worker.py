"""`make run`'s worker: Celery on the embedded SQLite broker (no server) runs the portal's tasks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from portal.accounts import services
from portal.accounts.models import Invitation
from tests.conftest import PASSWORD, REPO_ROOT

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


def test_embedded_broker_worker_runs_a_task(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the worker shares the test database only on PostgreSQL")
    s = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env.update(
        DATABASE_URL=f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        TAILGUARD_VAR_DIR=str(tmp_path),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool=solo", "--loglevel=INFO"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    from portal.celery import app

    # Publish to the same embedded broker file the worker reads (its default for this var dir).
    app.conf.update(
        task_always_eager=False, broker_url=f"sqla+sqlite:///{tmp_path / 'celery-broker.sqlite3'}"
    )
    app._pool = None
    app.amqp._producer_pool = None
    try:
        user = services.user_signup(email="e@x.test", password=PASSWORD)
        org = services.organization_create(actor=user, name="Embedded")
        Invitation.objects.create(
            organization=org,
            email="late@x.test",
            role="member",
            token_hash="h" * 64,
            expires_at=timezone.now() - timedelta(hours=1),
        )
        from portal.accounts.tasks import invitations_expire

        invitations_expire.delay()
        deadline = time.monotonic() + 90
        while Invitation.objects.filter(revoked_at__isnull=True).exists():
            assert worker.poll() is None, worker.communicate(timeout=10)[0][-3000:]
            assert time.monotonic() < deadline, "the embedded-broker worker never ran the task"
            time.sleep(0.5)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            output, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            output, _ = worker.communicate()
        app.conf.update(task_always_eager=True)
    assert "invitations_expire" in output and "CRITICAL" not in output
