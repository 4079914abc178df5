"""`make run`'s worker: Celery on the embedded SQLite broker (no server) runs the portal's tasks."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from portal.accounts import services
from portal.accounts.models import Invitation
from tests.conftest import PASSWORD
from tests.workers import database_url, require_postgres, running_worker, sending_to

pytestmark = [pytest.mark.celery_worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_embedded_broker_worker_runs_a_task(tmp_path: Path) -> None:
    require_postgres()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env.update(DATABASE_URL=database_url(), TAILGUARD_VAR_DIR=str(tmp_path))
    log = tmp_path / "worker.log"
    # Publish to the same embedded broker file the worker reads (its default for this var dir).
    broker = f"sqla+sqlite:///{tmp_path / 'celery-broker.sqlite3'}"
    with running_worker(env, log, quiet=False) as worker, sending_to(broker):
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
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the embedded-broker worker never ran the task"
            time.sleep(0.5)
    output = log.read_text(errors="replace")
    assert "invitations_expire" in output and "CRITICAL" not in output
