"""A real Celery worker on Redis picks up a task the portal enqueued and does its work."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from portal.accounts import services
from portal.accounts.models import Invitation, Organization, User
from tests.conftest import PASSWORD
from tests.workers import redis_or_skip, require_postgres, running_worker, sending_to, worker_env

pytestmark = [pytest.mark.celery_worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def redis_url() -> str:
    return redis_or_skip(os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))


def test_invitation_email_goes_through_a_real_worker(tmp_path: Path, redis_url: str, settings) -> None:  # type: ignore[no-untyped-def]
    require_postgres()
    mail_dir = tmp_path / "mail"
    env = worker_env(
        broker_url=redis_url,
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
    )
    log = tmp_path / "worker.log"
    with (
        running_worker(env, log, queues=[settings.CELERY_TASK_DEFAULT_QUEUE], quiet=False) as worker,
        sending_to(redis_url),
    ):
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
            pytest.fail("the worker never processed the task:\n" + log.read_text(errors="replace")[-3000:])
        [message] = [p.read_text() for p in mail_dir.iterdir()]
        assert "w@acme.test" in message
        assert "/invitations/accept/" in message
        assert Organization.objects.get(pk=org.pk).name == "Acme Voice"
        assert Invitation.objects.filter(pk=invitation.pk, sent_at__isnull=False).count() == 1
    assert "invitation_send" in log.read_text(errors="replace")
