"""Faults around tuning jobs and uploads: the broker down when work is started, the database
lost in the middle of a job step. Real Redis, a real PostgreSQL and real Celery worker processes
(with their beat, which runs `redispatch`); nothing in the worker is replaced.

Only the test marked `engine` starts an engine. In the others every job is one whose step ends
at plan time (its workload is missing or too short), so what they exercise is the dispatch of
steps, the lease, and the job's status transitions (claim, QUEUED -> RUNNING, the final FAILED
with its audit event), not trials.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from compliance.chain import chain_key
from compliance.models import AuditChainHead, AuditEvent
from compliance.services import audit_verify
from portal.accounts.models import Organization, User
from portal.jobs import services
from portal.jobs.models import TuningJob, step_key_prefix
from portal.outbox.models import OutboxMessage
from portal.traffic.models import TrafficSample
from portal.traffic.services import workload_path
from tests.factories import LOOSE_SLO, build_model_dir, ready_sample, served_model
from tests.portal.faults import (  # noqa: F401 (fixtures)
    FAST_RECOVERY,
    fault_worker,
    fault_worker_env,
    fresh_connections_after,
    redis_url,
)
from tests.workers import sending_to, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's own models: its last test checks that no engine of them outlived it."""
    root = tmp_path_factory.mktemp("models")
    build_model_dir(root)
    return root


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def _broker_down(kind: str) -> Iterator[str]:
    """A broker URL nobody answers at: a closed port (connection refused), or a port whose
    listener never accepts or answers (a broker that hangs: only the socket timeouts end it)."""
    if kind == "refused":
        yield f"redis://127.0.0.1:{_closed_port()}/0"
        return
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield f"redis://127.0.0.1:{silent.getsockname()[1]}/0"


def _job_form(sample: TrafficSample, model: Any) -> dict[str, object]:
    return {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "ttft_p50_ms": 2000,
        "ttft_p95_ms": 8000,
        "peak_rps": 1.0,
        "headroom": 1.25,
        "hardware": "local-cpu",
        "budget_trials": 2,  # the form's least (a baseline and one candidate)
        "strategy": "tpe",
    }


def _audit_actions(job: TuningJob) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_id=str(job.id)).order_by("seq").values_list("action", flat=True)
    )


@pytest.mark.celery_worker
@pytest.mark.parametrize("down", ["refused", "hangs"])
def test_work_started_while_the_broker_is_down_is_kept_and_runs_once_it_is_back(
    down: str,
    alice: User,
    alice_org: Organization,
    alice_client: Client,
    settings: Any,
    shared_traces: Path,
    model_root: Path,
    redis_url: str,  # noqa: F811 (the fixture)
    postgres: None,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.TUNING_MODEL_ROOTS = [model_root]
    sample = ready_sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = served_model(alice_org, alice, model_root)
    # A hanging broker is ended by the socket timeout; shorter here than the default, same option.
    timeouts = dict(settings.REDIS_BROKER_TIMEOUTS)
    if down == "hangs":
        timeouts["socket_timeout"] = 2

    with _broker_down(down) as down_url, sending_to(down_url, timeouts):
        started = alice_client.post(reverse("jobs:list"), _job_form(sample, model))
        with (shared_traces / "mooncake_synthetic.jsonl").open("rb") as fh:
            uploaded = alice_client.post(
                reverse("traffic:list"), {"name": "during the outage", "trace_format": "auto", "file": fh}
            )

    # The user is told where things stand, never shown an error page; the work is in the database.
    job = TuningJob.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("jobs:detail", args=[job.id])
    assert job.status == TuningJob.Status.QUEUED
    assert job.dispatch == TuningJob.Dispatch.PENDING and job.awaits_broker
    assert job.lease_owner == "" and job.started_at is None
    page = alice_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "Queued; will start when the worker is reachable." in page
    assert "(waiting for the task queue)" in alice_client.get(reverse("jobs:list")).content.decode()
    late = TrafficSample.objects.get(name="during the outage")
    assert uploaded.status_code == 302 and uploaded["Location"] == reverse("traffic:detail", args=[late.id])
    # Queued with its stored upload (a failed send used to discard the upload of a committed row).
    assert late.status == TrafficSample.Status.QUEUED and late.staging_name
    assert late.error == ""

    # The job's step must end at plan time (no engine here): its workload goes missing.
    workload_path(sample).unlink()
    with (
        sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS),
        fault_worker(fault_worker_env(redis_url, settings, model_root), tmp_path) as log,
    ):
        wait_for(
            lambda: (
                not TuningJob.objects.get(pk=job.pk).is_active
                and not TrafficSample.objects.get(pk=late.pk).is_pending
            ),
            log,
            "the job's step and the sample's ingest",
        )
    output = log.read_text(errors="replace")
    assert "portal.outbox.tasks.redispatch" in output

    job.refresh_from_db()
    # It started (claimed, RUNNING) through the step the beat sent, and ended at plan time.
    assert job.started_at is not None
    assert job.status == TuningJob.Status.FAILED
    assert job.error.startswith("trace: cannot read"), job.error
    assert job.dispatch == TuningJob.Dispatch.TAKEN and job.interruptions == 0
    assert _audit_actions(job) == ["tuning_job.create", "tuning_job.failed"]
    late.refresh_from_db()
    assert late.status == TrafficSample.Status.READY, late.error
    assert late.profile["num_requests"] > 0
    assert audit_verify() == []


def _terminate_other_backends() -> int:
    """Ends every other session on the test database (the worker's), as a server restart does."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@contextmanager
def _database_refusing_connections() -> Iterator[Any]:
    """Lets the test database refuse new sessions while the block runs (only this test's
    database: the shared server keeps running). Yields a function that ends the refusal."""
    import psycopg

    s = connection.settings_dict
    name = s["NAME"]
    admin = psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        dbname="postgres",
        autocommit=True,
    )

    def allow() -> None:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        yield allow
    finally:
        allow()
        admin.close()


def _short_trace(path: Path) -> bytes:
    # Five requests: a valid trace, too short for a p95, so planning stops with a clear error.
    return b"".join(path.read_bytes().splitlines(keepends=True)[:5])


@pytest.mark.celery_worker
@pytest.mark.parametrize("outage", ["outlasts the step", "ends before the step writes"])
def test_a_database_restart_during_a_step(
    outage: str,
    alice: User,
    alice_org: Organization,
    settings: Any,
    shared_traces: Path,
    model_root: Path,
    redis_url: str,  # noqa: F811 (the fixture)
    postgres: None,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Like a database restart in the middle of a step: the step is paused inside plan_job (its
    trace is a FIFO the test holds open) after it claimed the job and made it RUNNING; every
    worker session is terminated and the database refuses new ones; then the step goes on.

    - The outage outlasts the step: its writes fail, and so does releasing its lease. Once the
      database is back and the lease has run out, the beat hands the job to a new step, which
      finishes it (FAILED at plan time: the trace is too short) exactly once.
    - The outage ends before the step writes: the step replaces its dead session and finishes
      the job itself; nothing is interrupted.
    """
    settings.TUNING_MODEL_ROOTS = [model_root]
    source = shared_traces / "mooncake_synthetic.jsonl"
    sample = ready_sample(alice_org, alice, source, django_capture_on_commit_callbacks)
    model = served_model(alice_org, alice, model_root)
    trace = workload_path(sample)
    trace.unlink()
    os.mkfifo(trace)
    lost = "lost the database; its lease will run out"

    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        job = services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="outage",
            traffic_sample=sample,
            served_model=model,
            slo=LOOSE_SLO,
            peak_rps=1.0,
            budget_trials=2,
        )
        queued = TuningJob.objects.get(pk=job.pk)
        assert queued.dispatch == TuningJob.Dispatch.PENDING and not queued.awaits_broker
        with fault_worker(fault_worker_env(redis_url, settings, model_root), tmp_path) as log:
            writer: int | None = None

            def step_reads_the_trace() -> bool:
                nonlocal writer
                try:
                    # Succeeds only once a reader (the step, inside plan_job) has the FIFO open.
                    writer = os.open(trace, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    return False
                return True

            try:
                wait_for(step_reads_the_trace, log, "the step opening its trace")
                first = TuningJob.objects.get(pk=job.pk)
                assert first.status == TuningJob.Status.RUNNING
                assert first.dispatch == TuningJob.Dispatch.TAKEN and first.lease_owner
                with _database_refusing_connections() as allow:
                    # The step's own session is among them: it claimed the job through it.
                    assert _terminate_other_backends() >= 1
                    if outage == "ends before the step writes":
                        allow()
                    # Later steps read a plain file with the same short trace.
                    staged = trace.with_suffix(".staged")
                    staged.write_bytes(_short_trace(source))
                    assert writer is not None
                    os.write(writer, _short_trace(source))
                    os.close(writer)
                    writer = None
                    staged.replace(trace)
                    if outage == "outlasts the step":
                        wait_for(lambda: lost in log.read_text(errors="replace"), log, "the step failing")
                        # Nothing the failed step did after the outage reached the database.
                        held = TuningJob.objects.get(pk=job.pk)
                        assert held.status == TuningJob.Status.RUNNING
                        assert held.lease_owner == first.lease_owner
                        allow()
                wait_for(lambda: not TuningJob.objects.get(pk=job.pk).is_active, log, "the job's end")
            finally:
                if writer is not None:
                    os.close(writer)
        output = log.read_text(errors="replace")

    job.refresh_from_db()
    assert job.status == TuningJob.Status.FAILED
    assert "too few to estimate a p95" in job.error, job.error
    if outage == "outlasts the step":
        # Taken over once, by a step the beat sent.
        assert job.interruptions == 1 and "its step stopped without finishing; sending it again" in output
    else:
        assert job.interruptions == 0 and lost not in output
    # Resumed, not restarted: the first step's start time stands; the job ended once.
    assert job.started_at == first.started_at
    assert job.lease_owner == "" and job.trials.count() == 0
    assert _audit_actions(job) == ["tuning_job.create", "tuning_job.failed"]
    assert audit_verify() == []


@pytest.mark.celery_worker
def test_a_step_killed_inside_its_final_transaction_leaves_nothing_half_written(
    alice: User,
    alice_org: Organization,
    settings: Any,
    shared_traces: Path,
    model_root: Path,
    redis_url: str,  # noqa: F811 (the fixture)
    postgres: None,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The step's session is terminated while its last transaction (job FAILED + the audit event)
    waits for the audit chain's lock, which the test holds: the transaction is rolled back whole
    (the job is not FAILED without its audit event), the step releases its lease, and the beat
    hands the job to a new step, which finishes it once."""
    settings.TUNING_MODEL_ROOTS = [model_root]
    sample = ready_sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = served_model(alice_org, alice, model_root)

    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        job = services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="killed while finishing",
            traffic_sample=sample,
            served_model=model,
            slo=LOOSE_SLO,
            peak_rps=1.0,
            budget_trials=2,
        )
        # Its step ends at plan time (no engine here): the workload goes missing.
        workload_path(sample).unlink()
        with fault_worker(fault_worker_env(redis_url, settings, model_root), tmp_path) as log:
            with transaction.atomic():
                AuditChainHead.objects.select_for_update().get(chain=chain_key(alice_org.id))

                def step_waits_for_the_audit_lock() -> bool:
                    with connection.cursor() as cursor:
                        # Inside a transaction pg_stat_activity is read once, then kept: renew it.
                        cursor.execute("SELECT pg_stat_clear_snapshot()")
                        cursor.execute(
                            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
                            "AND query ILIKE '%%compliance_auditchainhead%%'"
                        )
                        return cursor.fetchone() is not None

                wait_for(step_waits_for_the_audit_lock, log, "the step's final transaction")
                # Its job update is written but not committed: nobody else sees FAILED.
                assert TuningJob.objects.get(pk=job.pk).status == TuningJob.Status.RUNNING
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND wait_event_type = 'Lock' AND query ILIKE '%%compliance_auditchainhead%%'"
                    )
                    assert cursor.fetchone()[0] == 1
            # The lock is free again: the step the beat sends next can finish.
            wait_for(lambda: not TuningJob.objects.get(pk=job.pk).is_active, log, "the job's end")
            output = log.read_text(errors="replace")

    assert "terminating connection due to administrator command" in output
    job.refresh_from_db()
    assert job.status == TuningJob.Status.FAILED
    assert job.error.startswith("trace: cannot read"), job.error
    assert job.interruptions == 1
    assert _audit_actions(job) == ["tuning_job.create", "tuning_job.failed"]
    assert audit_verify() == []


def test_redispatch_leaves_live_steps_alone_and_stops_a_job_whose_step_keeps_dying(
    alice: User,
    alice_org: Organization,
    settings: Any,
    shared_traces: Path,
    model_root: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The beat's rules on their own (no worker; sends go to a closed port, so none is run)."""
    from datetime import timedelta

    from django.utils import timezone

    settings.TUNING_MODEL_ROOTS = [model_root]
    settings.TUNING_MAX_INTERRUPTIONS = 3
    sample = ready_sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = served_model(alice_org, alice, model_root)
    with sending_to(f"redis://127.0.0.1:{_closed_port()}/0", settings.REDIS_BROKER_TIMEOUTS):
        jobs = [
            services.tuning_job_create(
                actor=alice,
                organization=alice_org,
                name=name,
                traffic_sample=sample,
                served_model=model,
                slo=LOOSE_SLO,
                peak_rps=1.0,
            )
            for name in ("live", "died once", "died thrice", "lost by the broker", "sent lately", "unsent")
        ]
        live, died, dying, lost, lately, _unsent = jobs
        now = timezone.now()
        fresh, stale = now - timedelta(seconds=1), now - timedelta(seconds=settings.TUNING_LEASE_S + 1)
        running = {"status": TuningJob.Status.RUNNING, "dispatch": TuningJob.Dispatch.TAKEN}
        TuningJob.objects.filter(pk=live.pk).update(**running, lease_owner="a", lease_heartbeat_at=fresh)
        TuningJob.objects.filter(pk=died.pk).update(**running, lease_owner="b", lease_heartbeat_at=stale)
        TuningJob.objects.filter(pk=dying.pk).update(
            **running, lease_owner="c", lease_heartbeat_at=stale, interruptions=2
        )
        # The broker took two steps' messages: one long ago and nobody claimed the job (lost),
        # one a second ago (in the queue). "unsent" never reached the broker: the outbox's own
        # sends see to it, not the job's recoverer.
        long_ago = now - timedelta(seconds=settings.TUNING_REDISPATCH_AFTER_S + 1)
        for job, sent_at in ((lost, long_ago), (lately, fresh)):
            OutboxMessage.objects.filter(key__startswith=step_key_prefix(job.pk)).update(
                status=OutboxMessage.Status.SENT, sent_at=sent_at
            )
        counts = services.tuning_jobs_redispatch(now=now)

    assert counts == {"lost": 1, "died": 1, "failed": 1} | dict.fromkeys(
        ("trials_lost", "trials_died", "trials_failed"), 0
    )
    by_name = {j.name: j for j in TuningJob.objects.all()}
    messages = {
        name: list(
            OutboxMessage.objects.filter(key__startswith=step_key_prefix(job.pk))
            .order_by("created_at", "id")
            .values_list("status", flat=True)
        )
        for name, job in by_name.items()
    }
    assert by_name["live"].dispatch == TuningJob.Dispatch.TAKEN and by_name["live"].lease_owner == "a"
    # Owed again, recorded as such in the outbox (the broker is still down): its beat sends it.
    assert by_name["died once"].dispatch == TuningJob.Dispatch.PENDING
    assert by_name["died once"].interruptions == 1 and by_name["died once"].lease_owner == ""
    assert messages["died once"] == ["pending", "pending"]
    assert by_name["lost by the broker"].dispatch == TuningJob.Dispatch.PENDING
    assert (
        messages["lost by the broker"] == ["sent", "pending"] and by_name["lost by the broker"].awaits_broker
    )
    assert messages["sent lately"] == ["sent"] and not by_name["sent lately"].awaits_broker
    assert messages["unsent"] == ["pending"] and by_name["unsent"].awaits_broker
    # Run again at once, the beat owes nothing more: what it recorded waits for the broker.
    with sending_to(f"redis://127.0.0.1:{_closed_port()}/0", settings.REDIS_BROKER_TIMEOUTS):
        again = services.tuning_jobs_redispatch(now=now)
    assert again["lost"] == 0 and again["died"] == 0, again
    stopped = by_name["died thrice"]
    assert stopped.status == TuningJob.Status.FAILED and stopped.lease_owner == ""
    assert "3 interrupted attempts in a row" in stopped.error
    assert _audit_actions(stopped)[-1] == "tuning_job.failed"


@pytest.mark.engine
@pytest.mark.celery_worker
def test_a_database_restart_during_a_live_trial_keeps_its_measurement(
    alice: User,
    alice_org: Organization,
    settings: Any,
    shared_traces: Path,
    model_root: Path,
    redis_url: str,  # noqa: F811 (the fixture)
    postgres: None,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A real engine runs trial 0 while the worker's sessions are terminated and the database
    refuses new ones for a few seconds. The heartbeat reconnects (the lease holds), the step
    replaces its dead session before writing, the trial is recorded once, and the next step runs."""
    settings.TUNING_MODEL_ROOTS = [model_root]
    sample = ready_sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = served_model(alice_org, alice, model_root)
    env = {**fault_worker_env(redis_url, settings, model_root), "TUNING_LEASE_S": "30"}
    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS), fault_worker(env, tmp_path) as log:
        job = services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="restart under a trial",
            traffic_sample=sample,
            served_model=model,
            slo=LOOSE_SLO,
            peak_rps=1.0,
            budget_trials=2,
            confirm_repeats=0,
            duration_s=8,
            repeats=1,
            capacity_steps=(1.5,),
        )
        wait_for(lambda: job.trials.filter(number=0).exists(), log, "trial 0 starting", timeout_s=300)
        time.sleep(5)  # inside run_trial: the engine is starting
        with _database_refusing_connections():
            assert _terminate_other_backends() >= 1
            time.sleep(3)
        # Cancelled while trial 0 still runs: the trial ends and records its result, and the next
        # step (owed by that commit) ends the job; later trials would repeat what other tests show.
        services.tuning_job_cancel(actor=alice, job=TuningJob.objects.get(pk=job.pk))
        wait_for(lambda: not TuningJob.objects.get(pk=job.pk).is_active, log, "the job's end", timeout_s=900)
    job.refresh_from_db()
    assert job.status == TuningJob.Status.CANCELLED, job.error
    trials = list(job.trials.order_by("number"))
    assert [(t.number, t.status, t.attempts) for t in trials] == [(0, "done", 1)]
    assert trials[0].result["status"] == "ok", trials[0].result.get("error")
    assert job.interruptions == 0
    assert _audit_actions(job) == ["tuning_job.create", "tuning_job.cancel", "tuning_job.cancelled"]
    leftovers = subprocess.run(["pgrep", "-f", str(model_root)], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == "", leftovers.stdout
