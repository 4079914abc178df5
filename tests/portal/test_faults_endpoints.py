"""Faults around live endpoints (issue 12): a Celery worker killed with SIGKILL in the middle of a
continual-loop iteration, and the engine killed under a deployed endpoint.

The worker test reuses test_faults' machinery (real Redis, the test database shared with real
worker processes) and test_continual_loop's endpoint: no engine, the engine's scrapes are
snapshot rows, and the re-tuning job's outcome is recorded as rows the way the tuning pipeline
leaves them (that pipeline's own killed-worker tests are in test_faults). The engine test runs
a real endpoint: the supervisor, the router and a vLLM engine on the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance import sla
from compliance.chain import chain_key
from compliance.models import AuditEvent
from compliance.services import audit_verify
from portal.accounts.models import Organization, User
from portal.endpoints import selectors as endpoint_selectors
from portal.endpoints import services
from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
from portal.endpoints.services import endpoint_dir
from portal.endpoints.tasks import endpoints_watch
from portal.jobs.models import Trial, TuningJob
from portal.sla import services as sla_services
from portal.traffic.models import TrafficSample
from serving.engine.watchdog import start_ticks
from tests.factories import finished_job
from tests.portal.faults import fault_worker, fault_worker_env, fresh_connections_after, redis_url  # noqa: F401 (fixtures)
from tests.portal.loop import loop_scrapes, loop_trial
from tests.workers import sending_to, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The workers take only what the test sends them: the watch ticks (the beat's task), in the
# test's order. What a worker sends itself (its beat's own ticks, the re-tuning job's trial
# step) goes to this queue, which no worker of this module reads.
_UNREAD_QUEUE = "tailguard-faults-unread"


def _loop_worker_env(broker_url: str, settings: Any, models: Path) -> dict[str, str]:
    return {
        **fault_worker_env(broker_url, settings, models),
        "ENDPOINTS_DIR": str(settings.ENDPOINTS_DIR),
        "CELERY_TASK_DEFAULT_QUEUE": _UNREAD_QUEUE,
        # The loop's evidence floor and serving-host rule, lowered and allowed for these tests.
        "LOOP_MIN_LIVE_REQUESTS": str(settings.LOOP_MIN_LIVE_REQUESTS),
        "LOOP_MIN_LIVE_SPAN_S": str(settings.LOOP_MIN_LIVE_SPAN_S),
        "LOOP_RETUNE_ON_SERVING_HOST": "true" if settings.LOOP_RETUNE_ON_SERVING_HOST else "false",
    }


def _worker_pid() -> int:
    """The pid of the worker `fault_worker` started: this process's one child running Celery (the
    worker retitles itself, so its command line is matched on the program's name only)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"celery" in cmdline:
            found.append(int(entry.name))
    assert len(found) == 1, f"expected one worker process, found {found}"
    return found[0]


def _kill_worker(log: Path) -> None:
    pid = _worker_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not services._alive(pid), log, "the killed worker's end")


def _tick() -> None:
    """What the beat sends every 15 s: refresh every active endpoint, then advance its loop."""
    endpoints_watch.delay()


def _tick_until(condition: Callable[[], bool], log: Path, what: str, timeout_s: float = 180) -> None:
    """Send watch ticks, one every few seconds, until `condition` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        _tick()
        step_end = min(deadline, time.monotonic() + 3)
        while time.monotonic() < step_end:
            if condition():
                return
            time.sleep(0.3)
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} did not happen; worker log:\n{log.read_text(errors='replace')[-5000:]}")


class _AuditChainLock:
    """Holds the organization's audit chain head row locked from another session, as a long
    transaction elsewhere would: every step of the loop audits inside its own transaction, so a
    step that gets there waits, its other writes made but not committed."""

    def __init__(self, organization: Organization) -> None:
        import psycopg

        s = connection.settings_dict
        self._conn = psycopg.connect(
            host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"]
        )
        self._conn.execute(
            "SELECT chain FROM compliance_auditchainhead WHERE chain = %s FOR UPDATE",
            [chain_key(organization.id)],
        ).fetchone()

    def release(self) -> None:
        if not self._conn.closed:
            self._conn.rollback()
            self._conn.close()


def _waits_for_the_audit_chain() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
            "AND query ILIKE '%%compliance_auditchainhead%%'"
        )
        return cursor.fetchone() is not None


def _folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def _config_file(endpoint: Endpoint) -> Any:
    return json.loads((endpoint_dir(endpoint) / "config.json").read_text())


def _loop_actions(endpoint: Endpoint) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_id=str(endpoint.id), action__startswith="endpoint.loop")
        .order_by("seq")
        .values_list("action", flat=True)
    )


@pytest.mark.celery_worker
def test_workers_killed_mid_iteration_leave_it_to_the_next_which_finishes_it_once(
    deployed: Endpoint,
    alice_org: Organization,
    settings: Any,
    model_root: Path,
    redis_url: str,  # noqa: F811
    postgres: None,
    tmp_path: Path,
) -> None:
    """Three workers in turn take one iteration from detection to confirmation.

    - The first detects the drift, then is killed while its re-tuning step (live-like sample
      synthesised, tuning job created, both audited) waits on the audit chain: nothing of the
      step is committed. Its database session lives on (it waits on the lock) holding the
      iteration's row: the second worker's ticks skip the row instead of hanging, and watching
      goes on. Once that session ends, the second worker does the step, once.
    - The second promotes the re-tuning job's winner and is killed after the commit, while
      handing the new configuration to the supervisor (the hand-over's temporary file is a FIFO
      nobody reads): the new generation is recorded, the supervisor's file still says the old.
    - The third brings the file in line without another generation, and confirms the iteration.
    """
    endpoint = deployed
    env = _loop_worker_env(redis_url, settings, model_root)
    base_job = endpoint.job
    assert base_job is not None
    first_config = dict(endpoint.config)
    loop_scrapes(endpoint, long=True, p95=2600.0, start=timedelta(0))
    samples_before = set(TrafficSample.objects.values_list("id", flat=True))
    w1, w2, w3 = (_folder(tmp_path, name) for name in ("worker-1", "worker-2", "worker-3"))

    with sending_to(redis_url, settings.REDIS_BROKER_TIMEOUTS):
        lock: _AuditChainLock | None = None
        try:
            with fault_worker(env, w1) as log1:
                _tick_until(lambda: LoopIteration.objects.exists(), log1, "the detection")
                it = LoopIteration.objects.get()
                assert it.status == LoopIteration.Status.DETECTED and "input length rose" in it.trigger
                assert _config_file(endpoint) == first_config
                lock = _AuditChainLock(alice_org)
                # A window later (as in test_continual_loop): the next tick starts the re-tune.
                LoopIteration.objects.filter(pk=it.pk).update(
                    detected_at=timezone.now() - timedelta(minutes=3)
                )
                _tick_until(_waits_for_the_audit_chain, log1, "the re-tuning step reaching its audit")
                _kill_worker(log1)
            # Nothing of the killed step is visible: no sample, no job, the iteration as it was.
            it.refresh_from_db()
            assert it.status == LoopIteration.Status.DETECTED and it.job_id is None
            assert set(TrafficSample.objects.values_list("id", flat=True)) == samples_before
            assert TuningJob.objects.count() == 1

            with fault_worker(env, w2) as log2:
                # The killed worker's session still holds the iteration's row (it waits on the
                # audit chain). Ticks skip the row: two in a row both finish their scrape.
                scraped = MetricSnapshot.objects.filter(gap=True).count()
                _tick()
                _tick()
                wait_for(
                    lambda: MetricSnapshot.objects.filter(gap=True).count() >= scraped + 2,
                    log2,
                    "two watch rounds while the row is held",
                )
                assert LoopIteration.objects.get(pk=it.pk).status == LoopIteration.Status.DETECTED
                lock.release()  # the dead session gets the lock, finds its client gone, and ends
                _tick_until(
                    lambda: LoopIteration.objects.get(pk=it.pk).status == LoopIteration.Status.TUNING,
                    log2,
                    "the re-tuning step",
                )
                it.refresh_from_db()
                job = it.job
                assert job is not None and TuningJob.objects.count() == 2
                # The job's trials, as its steps leave them (run elsewhere; see the docstring).
                loop_trial(
                    job, 0, {"dtype": "float32"}, ttft_p50_ms=2500.0, ttft_p95_ms=5000.0, slo_met=False
                )
                loop_trial(
                    job,
                    1,
                    {"dtype": "float32", "max_num_seqs": 16},
                    ttft_p50_ms=2000.0,
                    ttft_p95_ms=4000.0,
                    slo_met=False,
                )
                candidate = {"dtype": "float32", "max_num_batched_tokens": 512, "enable_prefix_caching": True}
                winner = loop_trial(job, 2, candidate, ttft_p50_ms=600.0, ttft_p95_ms=1500.0)
                # In place before the job ends: the promotion follows at the next tick.
                handover = endpoint_dir(endpoint) / "config.tmp"
                os.mkfifo(handover)
                TuningJob.objects.filter(pk=job.pk).update(
                    status=TuningJob.Status.SUCCEEDED, winner_trial=2, finished_at=timezone.now()
                )
                _tick_until(
                    lambda: LoopIteration.objects.get(pk=it.pk).status == LoopIteration.Status.PROMOTED,
                    log2,
                    "the promotion",
                )
                _kill_worker(log2)
            handover.unlink()
            # The promotion committed once; the supervisor was not told.
            endpoint.refresh_from_db()
            assert list(endpoint.revisions.values_list("generation", flat=True)) == [1, 2]
            assert endpoint.config == winner.result["config"] != first_config
            assert _config_file(endpoint) == first_config

            with fault_worker(env, w3) as log3:
                _tick_until(
                    lambda: _config_file(endpoint) == winner.result["config"], log3, "the config hand-over"
                )
                # A window of live traffic on the new configuration, as good as it measured, ten
                # minutes after the promotion (the earlier scrapes moved before it). The promotion
                # time moves last: a tick in between must not judge on the old scrapes.
                for snap in MetricSnapshot.objects.all():
                    MetricSnapshot.objects.filter(pk=snap.pk).update(
                        taken_at=snap.taken_at - timedelta(minutes=11)
                    )
                loop_scrapes(endpoint, long=True, p95=1500.0, start=timedelta(0))
                LoopIteration.objects.filter(pk=it.pk).update(
                    promoted_at=timezone.now() - timedelta(minutes=10)
                )
                _tick_until(
                    lambda: LoopIteration.objects.get(pk=it.pk).status == LoopIteration.Status.CONFIRMED,
                    log3,
                    "the confirmation",
                )
        finally:
            if lock is not None:
                lock.release()

    it.refresh_from_db()
    assert it.status == LoopIteration.Status.CONFIRMED and it.finished_at is not None
    assert it.after_p95_ms == pytest.approx(1500.0) and it.revision is not None
    # Once each: one iteration, one synthesised sample, one re-tuning job with its trials once,
    # one new generation; every step audited once, in order; the chains verify.
    assert LoopIteration.objects.count() == 1
    new_samples = set(TrafficSample.objects.values_list("id", flat=True)) - samples_before
    assert new_samples == {it.traffic_sample_id}
    assert set(TuningJob.objects.values_list("id", flat=True)) == {base_job.id, job.id}
    assert sorted(Trial.objects.filter(job=job).values_list("number", flat=True)) == [0, 1, 2]
    assert Trial.objects.filter(job=base_job).count() == 2
    assert list(EndpointRevision.objects.filter(endpoint=endpoint).values_list("generation", flat=True)) == [
        1,
        2,
    ]
    assert it.revision.generation == 2 and it.revision.trial_number == 2
    endpoint.refresh_from_db()
    assert endpoint.config == _config_file(endpoint) == winner.result["config"]
    assert _loop_actions(endpoint) == [
        "endpoint.loop.detected",
        "endpoint.loop.retune",
        "endpoint.loop.promote",
        "endpoint.loop.confirmed",
    ]
    assert AuditEvent.objects.filter(action="traffic_sample.synthesized").count() == 1
    assert list(
        AuditEvent.objects.filter(action="tuning_job.create").values_list("target_id", flat=True)
    ) == [str(job.id)]
    assert audit_verify() == []


# --- The engine killed under a live endpoint ---------------------------------------------------


def _state_until(
    endpoint: Endpoint, condition: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 600
    while True:
        state = services.read_state(endpoint)
        if condition(state):
            return state
        if state.get("status") == "failed" or time.monotonic() > deadline:
            log = endpoint_dir(endpoint) / "supervisor.log"
            pytest.fail(f"{what} did not happen ({state}); supervisor log:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _complete(endpoint: Endpoint, api_key: str, model: str) -> None:
    response = httpx.post(
        f"http://127.0.0.1:{endpoint.port}/v1/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": model, "prompt": "hello there", "max_tokens": 4},
        timeout=120.0,
    )
    assert response.status_code == 200, response.text[:500]


@pytest.mark.engine
def test_an_engine_killed_under_a_live_endpoint_is_restarted_and_its_downtime_is_a_gap(
    alice: User,
    alice_org: Organization,
    alice_client: Client,
    settings: Any,
    model_root: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    job = finished_job(alice_org, alice, model_root, winner=True)
    with django_capture_on_commit_callbacks(execute=True):
        endpoint, api_key = services.endpoint_deploy(actor=alice, job=job)
    endpoint.refresh_from_db()  # the port its start picked on the serving host
    terms = sla_services.sla_terms_set(
        actor=alice, endpoint=endpoint, target_ms=60_000.0, metric="ttft_p50_ms"
    )
    model = "llama-xs"  # the short name the endpoint serves it under
    eid = str(endpoint.id)
    try:
        first = _state_until(endpoint, lambda s: s.get("status") == "healthy", "the endpoint's start")
        baseline = services.endpoint_refresh(endpoint_id=eid)
        assert baseline is not None and baseline.gap  # nothing measured before it
        _complete(endpoint, api_key, model)
        _complete(endpoint, api_key, model)
        measured = services.endpoint_refresh(endpoint_id=eid)
        assert measured is not None and not measured.gap, measured.gap_reason
        assert measured.requests_per_s is not None and measured.requests_per_s > 0

        engine_started = start_ticks(first["engine_pid"])
        assert engine_started is not None
        os.kill(first["engine_pid"], signal.SIGKILL)
        # The supervisor reports the crash as soon as it finds it, while the new engine starts.
        down_state = _state_until(endpoint, lambda s: s.get("status") == "restarting", "the crash report")
        assert "was killed by SIGKILL" in down_state["last_error"]
        down = services.endpoint_refresh(endpoint_id=eid)
        assert down is not None and down.gap and down.ttft_p50_ms is None and down.requests_per_s is None
        assert "killed by SIGKILL" in down.gap_reason, down.gap_reason
        endpoint.refresh_from_db()
        assert endpoint.status == Endpoint.Status.DEGRADED
        assert endpoint.status_detail.startswith("the engine was killed by SIGKILL; restarting it")
        page = alice_client.get(reverse("endpoints:detail", args=[endpoint.id])).content.decode()
        assert 'id="endpoint-status" data-status="degraded">Degraded<' in page
        assert "the engine was killed by SIGKILL; restarting it" in page
        during = alice_client.get(reverse("api:compliance_endpoint_sla", args=[endpoint.id])).json()
        assert during["report"]["gaps"], during
        assert during["report"]["gaps"][-1]["end"] == down.taken_at.isoformat()

        second = _state_until(
            endpoint,
            lambda s: s.get("status") == "healthy" and s.get("restarts") == 1,
            "the supervised restart",
        )
        assert second["engine_pid"] != first["engine_pid"] and second["base_url"] == first["base_url"]
        # The killed engine is gone (its pid may name another process by now: compare start times).
        assert start_ticks(first["engine_pid"]) != engine_started
        again = services.endpoint_refresh(endpoint_id=eid)
        # The restarted engine's counters began again: measured from here, not against the old.
        assert again is not None and again.gap and again.requests_per_s is None
        _complete(endpoint, api_key, model)  # the same address and key
        after = services.endpoint_refresh(endpoint_id=eid)
        assert after is not None and not after.gap, after.gap_reason
        assert after.requests_per_s is not None and after.requests_per_s > 0
        endpoint.refresh_from_db()
        assert endpoint.status == Endpoint.Status.HEALTHY and endpoint.status_detail == ""
    finally:
        endpoint.refresh_from_db()
        if endpoint.is_active:
            services.endpoint_stop(actor=alice, endpoint=endpoint)

    # No interval is zeros or negative: every value is either measured or absent.
    for snap in MetricSnapshot.objects.filter(endpoint=endpoint):
        for value in (snap.requests_per_s, snap.prompt_tokens_per_s, snap.generation_tokens_per_s):
            assert value is None or value >= 0
    # The SLA window: the measured intervals before and after are compliant; from the last
    # measured scrape before the kill to the first answer of the new engine it is a gap.
    report = endpoint_selectors.sla_report(terms=terms, now=after.taken_at)
    spans = sla.timeline(
        endpoint_selectors._terms_measurements(terms, report.window_start, report.window_end),
        target_ms=terms.target_ms,
        start=baseline.taken_at,
        end=after.taken_at,
        max_interval_s=settings.COMPLIANCE_SLA_MAX_INTERVAL_S,
    )
    assert [(s.start, s.end, s.kind) for s in spans] == [
        (baseline.taken_at, measured.taken_at, sla.COMPLIANT),
        (measured.taken_at, again.taken_at, sla.GAP),
        (again.taken_at, after.taken_at, sla.COMPLIANT),
    ]
    assert any(g.start <= measured.taken_at and g.end >= again.taken_at for g in report.gaps)
    assert report.compliant_s == pytest.approx(
        (measured.taken_at - baseline.taken_at + after.taken_at - again.taken_at).total_seconds()
    )
