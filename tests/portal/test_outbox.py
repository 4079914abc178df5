"""The task outbox (portal/outbox) under a broker outage, for each action that goes through it:
an endpoint's start, stop and new configuration, a benchmark report's run, an invitation, a
service credit and a billing notice.

Real PostgreSQL and a real Redis broker. With the broker unreachable the action succeeds, its
message is pending and nothing reaches any broker; once the broker answers again the beat sends
it, exactly one message on the queue the task is routed to, and a second beat sends nothing.
A duplicate delivery of each consuming task (what a sender that died after the broker took the
message causes) does its work once. One test runs it end to end through a real worker and its
embedded beat.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core import mail
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.utils import timezone

from portal.accounts import services as account_services
from portal.accounts.models import Invitation, Organization, User
from portal.benchmarks import services as benchmark_services
from portal.benchmarks.models import BenchmarkReport
from portal.billing import services as billing_services
from portal.billing.models import BillingAccount, InvoiceCredit, SubscriptionStatus
from portal.endpoints import services as endpoint_services
from portal.endpoints.models import Endpoint
from portal.outbox import services
from portal.outbox.models import OutboxMessage
from portal.pools.models import Host, Pool
from portal.pools.routing import host_queue, pool_queue
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.factories import ENDPOINT_CONFIG, deployed_endpoint
from tests.portal.benchmarks import FakeOpenAI, target_spec
from tests.portal.billing import FakeStripe, enable_billing, subscription_event
from tests.workers import (
    queued_messages,
    redis_or_skip,
    require_postgres,
    running_worker,
    sending_to,
    unreachable_broker_url,
    wait_for,
    worker_env,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_url() -> str:
    return redis_or_skip(os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/12"))


@pytest.fixture
def stripe(settings: Any) -> Iterator[FakeStripe]:
    fake = FakeStripe()
    enable_billing(settings, fake.url)
    yield fake
    fake.close()


def _during_an_outage(
    settings: Any, capture: Any, redis_url: str, action: Callable[[], object]
) -> OutboxMessage:
    """Runs `action` (and its after-commit work) with the broker unreachable; returns its message."""
    before = set(OutboxMessage.objects.values_list("id", flat=True))  # e.g. a sample's ingest, sent
    with sending_to(unreachable_broker_url(), settings.REDIS_BROKER_TIMEOUTS), capture(execute=True):
        action()
    message = OutboxMessage.objects.exclude(id__in=before).get()
    assert message.status == OutboxMessage.Status.PENDING and message.sent_at is None
    # The after-commit try was made, failed, and says why.
    assert message.attempts == 1 and "Connection refused" in message.last_error, message.last_error
    assert queued_messages(redis_url) == []
    return message


def _broker_back(
    settings: Any, redis_url: str, message: OutboxMessage
) -> list[tuple[str, str, dict[str, Any]]]:
    """Two beats once the broker answers: the first sends the message, the second nothing.
    Returns what is queued on the broker afterwards."""
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        first = services.outbox_redispatch(now=message.next_attempt_at)
        second = services.outbox_redispatch(now=message.next_attempt_at + timedelta(minutes=10))
    assert first == {"sent": 1, "unsent": 0, "failed": 0, "purged": 0}
    assert second == {"sent": 0, "unsent": 0, "failed": 0, "purged": 0}
    message.refresh_from_db()
    assert message.status == OutboxMessage.Status.SENT and message.sent_at is not None
    assert message.attempts == 2 and message.last_error == ""
    return queued_messages(redis_url)


# --- Endpoints: start, stop and a new configuration, routed where the endpoint runs --------------


@pytest.fixture
def pool_host(db: None) -> tuple[Pool, Host]:
    pool = Pool.objects.create(name="cpu-pool", region="local", accelerator="local-cpu")
    return pool, Host.objects.create(pool=pool, name="cpu-1")


def test_an_endpoint_stopped_during_an_outage_is_stopped_on_its_host_once_the_broker_is_back(
    alice: User,
    alice_org: Organization,
    pool_host: tuple[Pool, Host],
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pool, host = pool_host
    endpoint = deployed_endpoint(alice_org, alice, pool=pool, host=host)
    message = _during_an_outage(
        settings,
        django_capture_on_commit_callbacks,
        redis_url,
        lambda: endpoint_services.endpoint_stop(actor=alice, endpoint=endpoint),
    )
    # The user's stop took effect at once: the key is revoked, the endpoint is stopping.
    endpoint.refresh_from_db()
    assert endpoint.status == Endpoint.Status.STOPPING and endpoint.api_key_hash == ""
    kwargs = {"endpoint_id": str(endpoint.id), "host": str(host.id)}
    assert (message.task, message.kwargs) == ("portal.endpoints.tasks.endpoint_stop", kwargs)
    assert _broker_back(settings, redis_url, message) == [
        (host_queue(str(host.id)), "portal.endpoints.tasks.endpoint_stop", kwargs)
    ]


def test_an_endpoint_started_again_during_an_outage_goes_to_its_pool_once_the_broker_is_back(
    alice: User,
    alice_org: Organization,
    pool_host: tuple[Pool, Host],
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pool, host = pool_host
    endpoint = deployed_endpoint(alice_org, alice, pool=pool, host=host, status=Endpoint.Status.STOPPED)
    message = _during_an_outage(
        settings,
        django_capture_on_commit_callbacks,
        redis_url,
        lambda: endpoint_services.endpoint_start_again(actor=alice, endpoint=endpoint),
    )
    endpoint.refresh_from_db()
    assert endpoint.status == Endpoint.Status.STARTING and endpoint.host is None
    # No live host in the pool: the endpoint says what its start waits for.
    assert endpoint.status_detail.startswith("waiting for a host of pool cpu-pool"), endpoint.status_detail
    # A start goes to any host of the pool.
    kwargs = {"endpoint_id": str(endpoint.id), "pool": pool.name}
    assert (message.task, message.kwargs) == ("portal.endpoints.tasks.endpoint_start", kwargs)
    assert _broker_back(settings, redis_url, message) == [
        (pool_queue(pool.name), "portal.endpoints.tasks.endpoint_start", kwargs)
    ]


def test_a_configuration_switched_during_an_outage_is_applied_on_the_host_once_the_broker_is_back(
    alice: User,
    alice_org: Organization,
    pool_host: tuple[Pool, Host],
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pool, host = pool_host
    endpoint = deployed_endpoint(alice_org, alice, pool=pool, host=host)
    config = {**ENDPOINT_CONFIG, "max_num_seqs": 64}

    def switch() -> object:
        return endpoint_services.endpoint_switch(
            endpoint=endpoint,
            config=config,
            job=None,
            trial_number=None,
            result={},
            reason="operator's change",
            actor=alice,
            action="endpoint.config",
        )

    message = _during_an_outage(settings, django_capture_on_commit_callbacks, redis_url, switch)
    endpoint.refresh_from_db()
    assert endpoint.config == config and endpoint.revisions.get().generation == 1
    assert message.key == f"endpoint_apply:{endpoint.id}:generation-1"
    kwargs = {"endpoint_id": str(endpoint.id), "host": str(host.id)}
    assert _broker_back(settings, redis_url, message) == [
        (host_queue(str(host.id)), "portal.endpoints.tasks.endpoint_apply", kwargs)
    ]


# --- Traffic samples -----------------------------------------------------------------------------


def test_a_sample_uploaded_during_an_outage_is_read_once_after_it(
    alice: User,
    alice_org: Organization,
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    lines = b"".join(
        b'{"timestamp": %d, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n' % (i * 1000)
        for i in range(5)
    )

    def upload() -> object:
        return traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="during the outage",
            upload=SimpleUploadedFile("during.jsonl", lines, content_type="application/json"),
        )

    message = _during_an_outage(settings, django_capture_on_commit_callbacks, redis_url, upload)
    sample = TrafficSample.objects.get()
    # Kept, with its stored upload, until the broker is back.
    assert sample.status == TrafficSample.Status.QUEUED and sample.staging_name
    kwargs = {"sample_id": str(sample.id)}
    assert _broker_back(settings, redis_url, message) == [
        (settings.CELERY_TASK_DEFAULT_QUEUE, "portal.traffic.tasks.traffic_sample_ingest", kwargs)
    ]
    # Delivered twice (a sender died after the broker took it): the sample is read once.
    assert traffic_services.traffic_sample_ingest(**kwargs) == TrafficSample.Status.READY
    assert traffic_services.traffic_sample_ingest(**kwargs) == "skipped"
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY and sample.ingest_attempts == 1


# --- Benchmark reports ---------------------------------------------------------------------------


def test_a_benchmark_report_created_during_an_outage_runs_once_after_it(
    sam: User,
    sample: TrafficSample,
    serve: Any,
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    target = serve(FakeOpenAI())

    def create() -> object:
        return benchmark_services.benchmark_report_create(
            actor=sam,
            traffic_sample=sample,
            targets=[target_spec("A", target.base_url)],
            load_multipliers=[1.0],
            duration_s=1.0,
            request_timeout_s=5.0,
        )

    message = _during_an_outage(settings, django_capture_on_commit_callbacks, redis_url, create)
    report = BenchmarkReport.objects.get()
    assert report.status == BenchmarkReport.Status.QUEUED and report.attempts == 0
    kwargs = {"report_id": str(report.id)}
    assert _broker_back(settings, redis_url, message) == [
        (settings.CELERY_TASK_DEFAULT_QUEUE, "portal.benchmarks.tasks.benchmark_report_run", kwargs)
    ]
    # Delivered twice (a sender died after the broker took it): the report runs once.
    assert benchmark_services.benchmark_report_run(**kwargs) == BenchmarkReport.Status.SUCCEEDED
    replayed = len(target.received)
    assert replayed > 0
    assert benchmark_services.benchmark_report_run(**kwargs) == "skipped"
    assert len(target.received) == replayed
    report.refresh_from_db()
    assert report.status == BenchmarkReport.Status.SUCCEEDED and report.attempts == 1


# --- Invitations ---------------------------------------------------------------------------------


def test_an_invitation_made_during_an_outage_is_emailed_once_after_it(
    alice: User,
    alice_org: Organization,
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    message = _during_an_outage(
        settings,
        django_capture_on_commit_callbacks,
        redis_url,
        lambda: account_services.invitation_create(
            actor=alice, organization=alice_org, email="dana@acme.test", role="member"
        ),
    )
    invitation = Invitation.objects.get(email="dana@acme.test")
    assert invitation.sent_at is None and mail.outbox == []
    kwargs = {"invitation_id": str(invitation.id)}
    assert _broker_back(settings, redis_url, message) == [
        (settings.CELERY_TASK_DEFAULT_QUEUE, "portal.accounts.tasks.invitation_send", kwargs)
    ]
    # Delivered twice: one email.
    assert account_services.invitation_send_email(**kwargs) is True
    assert account_services.invitation_send_email(**kwargs) is False
    assert [m.to for m in mail.outbox] == [["dana@acme.test"]]


# --- Billing: a service credit and the notice of a subscription's change --------------------------


def test_a_credit_recorded_during_an_outage_reaches_stripe_once_after_it(
    alice_org: Organization,
    stripe: FakeStripe,
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    BillingAccount.objects.create(organization=alice_org, stripe_customer_id="cus_test_acme")
    now = timezone.now()

    def record() -> object:
        with transaction.atomic():
            return billing_services.invoice_credit_add(
                organization=alice_org,
                key="sla:acme:2026-11",
                amount_cents=1250,
                currency="usd",
                description="SLA credit, November",
                period_start=now - timedelta(days=30),
                period_end=now,
            )

    message = _during_an_outage(settings, django_capture_on_commit_callbacks, redis_url, record)
    credit = InvoiceCredit.objects.get()
    assert credit.status == InvoiceCredit.Status.PENDING and stripe.calls("/v1/invoiceitems") == []
    kwargs = {"credit_id": str(credit.id)}
    assert _broker_back(settings, redis_url, message) == [
        (settings.CELERY_TASK_DEFAULT_QUEUE, "portal.billing.tasks.invoice_credit_send", kwargs)
    ]
    # Delivered twice: one invoice item at Stripe.
    assert billing_services.invoice_credit_send(**kwargs) == "sent"
    assert billing_services.invoice_credit_send(**kwargs) == "busy-or-done"
    assert len(stripe.calls("/v1/invoiceitems")) == 1
    credit.refresh_from_db()
    assert credit.status == InvoiceCredit.Status.SENT and credit.attempts == 1


def test_a_past_due_notice_decided_during_an_outage_is_emailed_once_after_it(
    alice: User,
    alice_org: Organization,
    stripe: FakeStripe,
    settings: Any,
    redis_url: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    account = BillingAccount.objects.create(
        organization=alice_org, stripe_customer_id="cus_test_acme", status=SubscriptionStatus.ACTIVE
    )
    event = json.loads(subscription_event("evt_past_due", "past_due"))
    message = _during_an_outage(
        settings,
        django_capture_on_commit_callbacks,
        redis_url,
        lambda: billing_services.webhook_event_process(event=event),
    )
    account.refresh_from_db()
    assert account.status == SubscriptionStatus.PAST_DUE and mail.outbox == []
    kwargs = {"account_id": str(account.id), "status": SubscriptionStatus.PAST_DUE}
    assert _broker_back(settings, redis_url, message) == [
        (settings.CELERY_TASK_DEFAULT_QUEUE, "portal.billing.tasks.billing_status_notify", kwargs)
    ]
    # Delivered twice: one email to the owner.
    assert billing_services.billing_status_notify(**kwargs) == 1
    assert billing_services.billing_status_notify(**kwargs) == 0
    assert [m.to for m in mail.outbox] == [[alice.email]]
    # The same Stripe event again records no second notice.
    with django_capture_on_commit_callbacks(execute=True):
        assert billing_services.webhook_event_process(event=event) == "duplicate"
    assert OutboxMessage.objects.count() == 1


# --- The kit itself --------------------------------------------------------------------------------


def test_a_broker_that_hangs_leaves_the_action_done_and_its_message_pending(
    alice: User, alice_org: Organization, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # A listener that never answers: only the socket timeout (shortened here, same option) ends
    # each try, after the commit and again in the beat, which then counts it as unsent.
    timeouts = {**settings.REDIS_BROKER_TIMEOUTS, "socket_timeout": 2}
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        with sending_to(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeouts):
            with django_capture_on_commit_callbacks(execute=True):
                invitation = account_services.invitation_create(
                    actor=alice, organization=alice_org, email="dana@acme.test", role="member"
                )
            message = OutboxMessage.objects.get()
            assert message.status == OutboxMessage.Status.PENDING and message.attempts == 1
            assert "imeout" in message.last_error, message.last_error
            counts = services.outbox_redispatch(now=message.next_attempt_at)
    assert counts == {"sent": 0, "unsent": 1, "failed": 0, "purged": 0}
    message.refresh_from_db()
    assert message.status == OutboxMessage.Status.PENDING and message.attempts == 2
    assert Invitation.objects.get(pk=invitation.pk).sent_at is None and mail.outbox == []


def test_the_same_action_is_one_message_and_an_unknown_task_is_refused(
    alice: User, alice_org: Organization, django_capture_on_commit_callbacks: Any
) -> None:
    invitation = account_services.invitation_create(
        actor=alice, organization=alice_org, email="erin@acme.test", role="member"
    )
    key = f"invitation.send:{invitation.id}"
    first = OutboxMessage.objects.get(key=key)
    again = services.outbox_enqueue(
        task="portal.accounts.tasks.invitation_send", kwargs={"invitation_id": str(invitation.id)}, key=key
    )
    assert again.pk == first.pk and OutboxMessage.objects.count() == 1
    with pytest.raises(ValueError, match="already names task"):
        services.outbox_enqueue(task="portal.billing.tasks.invoice_credit_send", kwargs={}, key=key)
    with pytest.raises(LookupError, match="no Celery task is registered"):
        services.outbox_enqueue(task="portal.accounts.tasks.no_such_task", kwargs={}, key="other")
    assert OutboxMessage.objects.count() == 1


def test_the_beat_sends_oldest_first_a_bounded_batch_and_stops_at_an_unreachable_broker(
    settings: Any, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    settings.OUTBOX_BATCH = 2
    with sending_to(unreachable_broker_url(), settings.REDIS_BROKER_TIMEOUTS):
        with django_capture_on_commit_callbacks(execute=False):
            ids = [
                services.outbox_enqueue(
                    task="portal.accounts.tasks.invitations_expire", kwargs={}, key=f"expire:{n}"
                ).id
                for n in range(3)
            ]
        now = timezone.now()
        # Down: the first try fails and the rest of the batch is not tried (each would wait out
        # the same timeouts); those are due again at once, the one tried after its back-off.
        assert services.outbox_redispatch(now=now) == {"sent": 0, "unsent": 2, "failed": 0, "purged": 0}
    rows = {m.id: m for m in OutboxMessage.objects.all()}
    assert [rows[i].attempts for i in ids] == [1, 0, 0]
    assert rows[ids[1]].next_attempt_at == now and rows[ids[0]].next_attempt_at > now
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        assert services.outbox_redispatch(now=now)["sent"] == 2
        assert services.outbox_redispatch(now=rows[ids[0]].next_attempt_at)["sent"] == 1
    assert [t for _q, t, _k in queued_messages(redis_url)] == ["portal.accounts.tasks.invitations_expire"] * 3
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {OutboxMessage.Status.SENT}


@pytest.mark.django_db(transaction=True)
def test_a_beat_skips_the_messages_another_beat_has_locked(settings: Any, redis_url: str) -> None:
    require_postgres()
    with sending_to(unreachable_broker_url(), settings.REDIS_BROKER_TIMEOUTS):
        first, second = (
            services.outbox_enqueue(
                task="portal.accounts.tasks.invitations_expire", kwargs={}, key=f"beat:{n}"
            )
            for n in range(2)
        )
    later = timezone.now() + timedelta(seconds=services.RETRY_MAX_S)
    # Another beat's transaction holds the first row (it is claiming it), from its own session.
    s = connection.settings_dict
    other = psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"]
    )
    try:
        other.execute("SELECT id FROM outbox_outboxmessage WHERE id = %s FOR UPDATE", [first.id])
        with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
            assert services.outbox_redispatch(now=later)["sent"] == 1
    finally:
        other.rollback()
        other.close()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.attempts) == (OutboxMessage.Status.PENDING, 1)
    assert (second.status, second.attempts) == (OutboxMessage.Status.SENT, 2)
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        assert services.outbox_redispatch(now=later)["sent"] == 1
    assert len(queued_messages(redis_url)) == 2


def test_a_message_held_by_one_sender_is_not_sent_by_another_and_old_sent_ones_are_purged(
    settings: Any, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        message = services.outbox_enqueue(
            task="portal.accounts.tasks.invitations_expire", kwargs={}, key="held"
        )
    now = timezone.now()
    # A beat holds it (it claimed the row and is sending): the after-commit try leaves it alone.
    OutboxMessage.objects.filter(id=message.id).update(
        next_attempt_at=now + timedelta(seconds=services.CLAIM_S)
    )
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        assert services.outbox_publish(message_id=message.id, now=now) is False
        assert services.outbox_redispatch(now=now)["sent"] == 0
        assert queued_messages(redis_url) == []
        # A sender that died holding it frees it when its claim runs out.
        later = now + timedelta(seconds=services.CLAIM_S)
        assert services.outbox_publish(message_id=message.id, now=later) is True
        assert services.outbox_publish(message_id=message.id, now=later) is False
    assert len(queued_messages(redis_url)) == 1
    message.refresh_from_db()
    assert message.sent_at is not None
    kept = settings.OUTBOX_KEEP_SENT_DAYS
    assert services.outbox_purge(now=message.sent_at + timedelta(days=kept)) == 0
    assert services.outbox_purge(now=message.sent_at + timedelta(days=kept, seconds=1)) == 1
    assert not OutboxMessage.objects.exists()


# --- End to end: a real worker and its beat -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_an_invitation_made_during_an_outage_reaches_a_real_worker_once_the_broker_is_back(
    alice: User, alice_org: Organization, settings: Any, redis_url: str, tmp_path: Path
) -> None:
    require_postgres()
    with sending_to(unreachable_broker_url(), settings.REDIS_BROKER_TIMEOUTS):
        invitation = account_services.invitation_create(
            actor=alice, organization=alice_org, email="dana@acme.test", role="member"
        )
    message = OutboxMessage.objects.get()
    assert message.status == OutboxMessage.Status.PENDING and message.attempts == 1
    mail_dir = tmp_path / "mail"
    env = worker_env(
        broker_url=redis_url,
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
        REDISPATCH_INTERVAL_S="1",
    )
    log = tmp_path / "worker.log"
    with running_worker(
        env, log, queues=[settings.CELERY_TASK_DEFAULT_QUEUE], beat_schedule=tmp_path / "beat-schedule"
    ):
        wait_for(
            lambda: Invitation.objects.filter(pk=invitation.pk, sent_at__isnull=False).exists(),
            log,
            "the invitation's email",
        )
        # The worker's beat keeps running: the message is sent, and stays sent once.
        wait_for(
            lambda: OutboxMessage.objects.filter(pk=message.pk, status=OutboxMessage.Status.SENT).exists(),
            log,
            "the message marked sent",
        )
    message.refresh_from_db()
    assert message.attempts == 2
    [email] = [p.read_text() for p in mail_dir.iterdir()]
    assert "dana@acme.test" in email
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        assert services.outbox_redispatch()["sent"] == 0
    assert queued_messages(redis_url) == []


def test_one_beat_recovers_every_apps_work_then_sends_then_delivers(settings: Any, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The schedule has one redispatch beat; it runs each app's registered recoverer (the apps
    register theirs when Django loads them), the outbox's sends, then the deliveries to outside
    services, in that order; one recoverer that raises is reported and the rest still run."""
    from portal.outbox import recovery

    beats = [e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values() if "redispatch" in e["task"]]
    assert beats == ["portal.outbox.tasks.redispatch"]
    assert set(recovery.registered(recovery.RECOVER)) == {
        "tuning_jobs",
        "traffic_samples",
        "benchmark_reports",
    }
    assert set(recovery.registered(recovery.DELIVER)) == {"alert_deliveries"}

    calls: list[str] = []

    def broken(now: Any) -> int:
        calls.append("broken")
        raise RuntimeError("a bug in one app")

    monkeypatch.setattr(recovery, "_REGISTERED", {})
    recovery.register(
        "deliveries", lambda now: calls.append("deliver") or {"delivered": 0}, phase=recovery.DELIVER
    )
    recovery.register("broken", broken)
    recovery.register("jobs", lambda now: calls.append("recover") or 2)
    real_send = services.outbox_redispatch
    monkeypatch.setattr(services, "outbox_redispatch", lambda now: calls.append("send") or real_send(now=now))
    counts = services.redispatch()
    assert calls == ["broken", "recover", "send", "deliver"]
    assert counts == {
        "broken": "error",
        "jobs": 2,
        "outbox": {"sent": 0, "unsent": 0, "failed": 0, "purged": 0},
        "deliveries": {"delivered": 0},
    }
    with pytest.raises(ValueError, match="phase"):
        recovery.register("late", lambda now: 0, phase="later")
