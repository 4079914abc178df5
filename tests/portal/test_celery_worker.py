"""A real Celery worker on Redis picks up a task the portal enqueued and does its work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from portal.accounts import services
from portal.accounts.models import Invitation, Organization, User
from tests.conftest import PASSWORD, REPO_ROOT

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


def _database_url() -> str:
    s = connection.settings_dict
    if s["ENGINE"].endswith("postgresql"):
        return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    return f"sqlite:///{s['NAME']}"


@pytest.fixture
def redis_url() -> str:
    import redis

    url = os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}")
    return url


def test_invitation_email_goes_through_a_real_worker(tmp_path: Path, redis_url: str, settings) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor == "sqlite":
        pytest.skip("the worker shares the test database only on PostgreSQL")
    import redis

    # The test Redis database is this test's alone: clear what an earlier run may have left.
    redis.Redis.from_url(redis_url, socket_timeout=5).flushdb()
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    mail_dir = tmp_path / "mail"
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_database_url(),
        CELERY_BROKER_URL=redis_url,
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
        CELERY_TASK_ALWAYS_EAGER="false",
    )
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--loglevel=INFO",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    from portal.celery import app

    app.conf.update(task_always_eager=False, broker_url=redis_url)
    # Drop connections made to the embedded broker earlier in this process.
    app._pool = None
    app.amqp._producer_pool = None
    try:
        alice = User.objects.create_user(email="alice@acme.test", password=PASSWORD)
        org = services.organization_create(actor=alice, name="Acme Voice")
        invitation = services.invitation_create(
            actor=alice, organization=org, email="w@acme.test", role="member"
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            invitation.refresh_from_db()
            if invitation.sent_at is not None and mail_dir.exists() and any(mail_dir.iterdir()):
                break
            if worker.poll() is not None:
                break
            time.sleep(0.5)
        invitation.refresh_from_db()
        if invitation.sent_at is None:
            os.killpg(worker.pid, signal.SIGTERM)
            pytest.fail("the worker never processed the task:\n" + worker.communicate(timeout=30)[0][-3000:])
        [message] = [p.read_text() for p in mail_dir.iterdir()]
        assert "w@acme.test" in message
        assert "/invitations/accept/" in message
        assert Organization.objects.get(pk=org.pk).name == "Acme Voice"
        assert Invitation.objects.filter(pk=invitation.pk, sent_at__isnull=False).count() == 1
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            output, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            output, _ = worker.communicate()
        app.conf.update(task_always_eager=True)
    assert "invitation_send" in output
