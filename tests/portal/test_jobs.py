"""Tuning jobs in the portal: submission checks, tenancy, and (with a real engine) whole jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts.models import Organization, User
from portal.jobs import services
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.conftest import REPO_ROOT

SLO = "ttft_p50_ms<=2000,ttft_p95_ms<=8000"


@pytest.fixture(scope="session")
def tiny_model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    build_tiny_model(arch="llama", size="xs", out_dir=root / "llama-xs", seed=0)
    return root


@pytest.fixture
def job_settings(settings, tmp_path: Path, tiny_model_root: Path):  # type: ignore[no-untyped-def]
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    settings.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    settings.TUNING_MODEL_ROOTS = [tiny_model_root]
    return settings


def _sample(org: Organization, user: User, trace: Path, capture) -> TrafficSample:  # type: ignore[no-untyped-def]
    from django.core.files.uploadedfile import SimpleUploadedFile

    with capture(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=user,
            organization=org,
            name=trace.name,
            upload=SimpleUploadedFile(trace.name, trace.read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    return sample


def _model(org: Organization, user: User, root: Path) -> ServedModel:
    return services.served_model_register(
        actor=user, organization=org, name="llama-xs", path=str(root / "llama-xs")
    )


@pytest.mark.django_db
def test_submission_is_checked_before_any_engine(
    alice, alice_org, job_settings, shared_traces, tiny_model_root, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    sample = _sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)
    base = {
        "actor": alice,
        "organization": alice_org,
        "name": "",
        "traffic_sample": sample,
        "served_model": model,
        "slo": SLO,
        "peak_rps": 1.0,
    }
    for changes, field in [
        ({"slo": "ttft<=5"}, "slo"),
        ({"budget_trials": 0}, "budget_trials"),
        ({"peak_rps": 0.0}, "peak_rps"),
        ({"hardware": "mi355x-moon"}, "hardware"),
        ({"duration_s": 1.0}, "duration_s"),
        ({"capacity_steps": (2.0, 1.5)}, "capacity_steps"),
        ({"capacity_steps": (1.5, 2, 3, 4, 5, 6, 7)}, "capacity_steps"),
        ({"capacity_steps": (0.5,)}, "capacity_steps"),
    ]:
        with pytest.raises(ValidationError) as info:
            services.tuning_job_create(**{**base, **changes})
        assert field in info.value.message_dict, info.value
    TrafficSample.objects.filter(pk=sample.pk).update(status=TrafficSample.Status.FAILED)
    sample.refresh_from_db()
    with pytest.raises(ValidationError, match="finished validating"):
        services.tuning_job_create(**{**base, "traffic_sample": sample})
    assert not TuningJob.objects.exists()


@pytest.mark.django_db
def test_models_only_from_the_hosts_model_folders(
    alice, alice_org, job_settings, tiny_model_root, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as info:
        services.served_model_register(actor=alice, organization=alice_org, name="x", path="/etc")
    assert "model folders" in info.value.message_dict["path"][0]
    (tiny_model_root / "empty").mkdir(exist_ok=True)
    with pytest.raises(ValidationError) as info:
        services.served_model_register(
            actor=alice, organization=alice_org, name="x", path=str(tiny_model_root / "empty")
        )
    assert "config.json" in info.value.message_dict["path"][0]
    model = _model(alice_org, alice, tiny_model_root)
    assert model.architecture == "LlamaForCausalLM" and model.num_params > 0


@pytest.mark.django_db
def test_tenancy_on_jobs(
    alice,
    alice_org,
    bob,
    charlie,
    job_settings,
    shared_traces,
    tiny_model_root,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    sample = _sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)
    # Created without running it: the step task is not executed here.
    job = services.tuning_job_create(
        actor=alice,
        organization=alice_org,
        name="j",
        traffic_sample=sample,
        served_model=model,
        slo=SLO,
        peak_rps=1.0,
    )
    before = (TuningJob.objects.count(), AuditEvent.objects.count(), TuningJob.objects.get().cancel_requested)
    charlie_client, bob_client = Client(), Client()
    charlie_client.force_login(charlie)
    bob_client.force_login(bob)
    for name in ("jobs:detail", "jobs:trials"):
        assert charlie_client.get(reverse(name, args=[job.id])).status_code == 404
        assert bob_client.get(reverse(name, args=[job.id])).status_code == 200
    assert charlie_client.post(reverse("jobs:cancel", args=[job.id])).status_code == 404
    assert bob_client.post(reverse("jobs:cancel", args=[job.id])).status_code == 403
    assert bob_client.post(reverse("jobs:list"), {"traffic_sample": str(sample.id)}).status_code == 403
    assert bob_client.post(reverse("jobs:model_register"), {"name": "m", "path": "/x"}).status_code == 403
    charlie_api, bob_api = APIClient(), APIClient()
    charlie_api.force_login(charlie)
    bob_api.force_login(bob)
    assert charlie_api.get(f"/api/v1/tuning-jobs/{job.id}/").status_code == 404
    assert charlie_api.post(f"/api/v1/tuning-jobs/{job.id}/cancel/").status_code == 404
    assert charlie_api.get("/api/v1/tuning-jobs/").json()["count"] == 0
    # Charlie cannot point a job of his at Alice's sample or model.
    response = charlie_api.post(
        "/api/v1/tuning-jobs/",
        {"traffic_sample": str(sample.id), "served_model": str(model.id), "slo": SLO, "peak_rps": 1},
        format="json",
    )
    assert response.status_code == 400
    assert set(response.json()) == {"traffic_sample", "served_model"}
    assert bob_api.post(f"/api/v1/tuning-jobs/{job.id}/cancel/").status_code == 403
    assert bob_api.post("/api/v1/models/", {"name": "m", "path": "/x"}, format="json").status_code == 403
    assert (
        TuningJob.objects.count(),
        AuditEvent.objects.count(),
        TuningJob.objects.get().cancel_requested,
    ) == before
    # Alice cancels her queued job at once.
    alice_api = APIClient()
    alice_api.force_login(alice)
    cancelled = alice_api.post(f"/api/v1/tuning-jobs/{job.id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert alice_api.post(f"/api/v1/tuning-jobs/{job.id}/cancel/").status_code == 400


@pytest.mark.django_db
def test_the_simulator_is_calibrated_by_the_organizations_earlier_trials_only(
    alice,
    alice_org,
    charlie,
    job_settings,
    shared_traces,
    tiny_model_root,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    from tuning.search.prior import pairs_from_results

    sample = _sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)

    def job(org: Organization, user: User) -> TuningJob:
        return services.tuning_job_create(
            actor=user,
            organization=org,
            name="j",
            traffic_sample=sample,
            served_model=model,
            slo=SLO,
            peak_rps=1.0,
        )

    earlier = job(alice_org, alice)
    TuningJob.objects.filter(pk=earlier.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    earlier.refresh_from_db()
    measured = {
        "status": "ok",
        "ttft_p50_ms": 300.0,
        "tpot_p50_ms": 40.0,
        "predicted": {"base_ttft_p50_ms": 200.0, "base_tpot_p50_ms": 20.0, "ttft_p50_ms": 200.0},
    }
    Trial.objects.create(
        organization=alice_org,
        job=earlier,
        number=0,
        assignment={},
        label="x",
        status=Trial.Status.DONE,
        result=measured,
        finished_at=timezone.now() - timedelta(minutes=5),
    )
    charlie_org = charlie.memberships.get().organization
    other = TuningJob.objects.create(
        organization=charlie_org, name="c", spec=earlier.spec, traffic_sample=sample, served_model=model
    )
    Trial.objects.create(
        organization=charlie_org,
        job=other,
        number=0,
        assignment={},
        label="x",
        status=Trial.Status.DONE,
        result=measured,
        finished_at=timezone.now() - timedelta(minutes=5),
    )
    # Alice's trial of another model: its step times say nothing about this one's.
    bigger = ServedModel.objects.create(organization=alice_org, name="bigger", path=model.path)
    of_bigger = TuningJob.objects.create(
        organization=alice_org, name="b", spec=earlier.spec, traffic_sample=sample, served_model=bigger
    )
    Trial.objects.create(
        organization=alice_org,
        job=of_bigger,
        number=0,
        assignment={},
        label="x",
        status=Trial.Status.DONE,
        result={**measured, "ttft_p50_ms": 900.0},
        finished_at=timezone.now() - timedelta(minutes=5),
    )
    later = job(alice_org, alice)
    pairs = services._calibration_pairs(later)
    assert pairs == pairs_from_results([measured])  # Alice's one trial of this model, not Charlie's
    # The earlier job's own trials did not exist before it was created: it is uncalibrated.
    assert services._calibration_pairs(earlier) == []


@pytest.mark.engine
@pytest.mark.django_db
def test_a_job_runs_end_to_end_in_the_portal(
    alice, alice_org, job_settings, shared_traces, tiny_model_root, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    sample = _sample(
        alice_org, alice, shared_traces / "mooncake_synthetic.jsonl", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)
    client = Client()
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("jobs:list"),
            {
                "traffic_sample": str(sample.id),
                "served_model": str(model.id),
                "ttft_p50_ms": 2000,
                "ttft_p95_ms": 8000,
                "peak_rps": 1.0,
                "headroom": 1.25,
                "hardware": "local-cpu",
                # The smallest search the form takes: the competent baseline and one candidate,
                # without confirmation rounds (each would start more engines), each load level
                # replayed once for the form's shortest window (the test checks the flow, not
                # the figures).
                "budget_trials": 2,
                "confirm_repeats": 0,
                "duration_s": 5,
                "repeats": 1,
                "strategy": "tpe",
                # One load step past the target (the form's default probes four).
                "capacity_steps": "1.5",
            },
        )
    assert response.status_code == 302, response.content.decode()[-1500:]
    # Eager tasks: the first step ran trial 0, enqueued the next step, and so on to the end.
    job = TuningJob.objects.get()
    assert job.status == TuningJob.Status.SUCCEEDED, job.error
    # The last step tunes no kernel tables on a CPU pool, and says why (issue 25).
    assert job.moe_tables == {}
    assert job.moe_tables_note.startswith("not tuned: local-cpu runs no fused-MoE Triton kernel")
    trials = list(job.trials.order_by("number"))
    assert [t.number for t in trials] == [0, 1, 2]
    # Trial 0 is the reference: captured at the highest precision, never measured or a candidate.
    reference, competent, candidate = trials
    assert reference.assignment["dtype"] == "float32"
    assert reference.result["phase"] == "reference" and reference.result["capture"]["greedy"]
    assert not reference.result["load"]
    # Trial 1 is the search's first: the competent baseline, judged against the reference.
    assert competent.result["phase"] == "search"
    assert competent.assignment == job.report["baselines"]["competent"]
    assert competent.result["status"] == "ok", competent.result.get("error")
    assert competent.result["correctness"]["positions"] > 0
    assert len(competent.result["load"]) >= 2
    # No warm-up replay unless the plan asks for one (it made no difference on this host).
    assert competent.result["warmup"] is None
    # The host was held and watched while it measured.
    assert competent.result["foreign_load"]["window_s"] > 0
    assert competent.result["contended"] in (True, False)
    assert competent.result["gpu_load"] is None  # no GPU on this host: nothing to sample
    # The engine's own TTFT (its /metrics histogram) sits beside the client's: what the load
    # generator adds is visible in every trial.
    assert 0 < competent.result["engine_ttft_p50_ms"] <= competent.result["engine_ttft_p95_ms"]
    assert competent.result["engine_queue_p95_ms"] is not None
    # ... and where it went, as the engine saw it, beside the simulator's split of it.
    assert competent.result["engine_queue_mean_ms"] >= 0 and competent.result["engine_prefill_mean_ms"] > 0
    assert competent.result["ttft_mean_ms"] > 0 and competent.result["engine_ttft_mean_ms"] > 0
    assert set(competent.result["predicted"]["ttft_split_ms"]) == {
        "outside_engine",
        "queueing",
        "prefill",
        "preemption",
    }
    # Trial 2 is the search's first candidate: something other than the baseline.
    assert candidate.result["phase"] == "search" and candidate.assignment != competent.assignment
    # Without confirmation rounds nothing is called a confirmed gain: said so, never a "win".
    assert job.report["selection"]["outcome"] == "unconfirmed"
    assert job.report["selection"]["summary"]
    assert job.report["caps"]["line"]
    # Every measured trial was also simulated; the job reports the simulator's error on it.
    assert competent.result["predicted"]["ttft_p50_ms"] > 0
    assert job.report["simulator"]["errors"]["num_trials"] == 2
    page = client.get(reverse("jobs:detail", args=[job.id]))
    assert b"selection-summary" in page.content and b'data-trial="1"' in page.content
    assert b'id="job-caps"' in page.content


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.engine
@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_job_survives_a_killed_worker(
    alice,
    alice_org,
    job_settings,
    shared_traces,
    tiny_model_root,
    tmp_path,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    import redis

    if connection.vendor != "postgresql":
        pytest.skip("workers share the test database only on PostgreSQL")
    redis_url = os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    redis.Redis.from_url(redis_url, socket_timeout=5).flushdb()
    sample = _sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)
    s = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        CELERY_BROKER_URL=redis_url,
        CELERY_TASK_ALWAYS_EAGER="false",
        TRAFFIC_WORKLOAD_DIR=str(job_settings.TRAFFIC_WORKLOAD_DIR),
        TUNING_WORK_DIR=str(job_settings.TUNING_WORK_DIR),
        TUNING_MODEL_ROOTS=str(tiny_model_root),
        TUNING_LEASE_S="15",
        CELERY_VISIBILITY_TIMEOUT_S="30",
        CELERY_UNACKED_RESTORE_INTERVAL_S="2",
    )
    from portal.celery import app

    app.conf.update(task_always_eager=False, broker_url=redis_url)
    app._pool = None
    app.amqp._producer_pool = None
    log = tmp_path / "workers.log"
    first = _worker(env, log)
    second = None
    try:
        job = services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="survivor",
            traffic_sample=sample,
            served_model=model,
            slo=SLO,
            peak_rps=1.0,
            budget_trials=2,
            confirm_repeats=0,
            duration_s=8,
            repeats=1,
            capacity_steps=(1.5,),
        )
        # Kill the worker once trial 0 is under way (its engine is starting or measuring).
        deadline = time.monotonic() + 120
        while not Trial.objects.filter(job=job, number=0).exists():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(5)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert Trial.objects.get(job=job, number=0).status == Trial.Status.RUNNING
        second = _worker(env, log)
        # Once the second worker re-runs trial 0 (its attempt counted: past the step's check for
        # a cancellation), the job is cancelled: the re-run finishes, and the next step, which
        # the re-run's commit owes, ends the job. The later trials would only repeat what the
        # end-to-end test shows.
        deadline = time.monotonic() + 600
        while not Trial.objects.filter(job=job, number=0, attempts=2).exists():
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            assert second.poll() is None, log.read_text()[-4000:]
            time.sleep(0.5)
        services.tuning_job_cancel(actor=alice, job=TuningJob.objects.get(pk=job.pk))
        deadline = time.monotonic() + 900
        while TuningJob.objects.get(pk=job.pk).is_active:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            assert second.poll() is None, log.read_text()[-4000:]
            time.sleep(2)
        job.refresh_from_db()
        assert job.status == TuningJob.Status.CANCELLED, job.error
        trials = list(job.trials.order_by("number"))
        assert [(t.number, t.status) for t in trials] == [(0, "done")]
        assert trials[0].attempts == 2  # re-run after the kill, not duplicated
        assert trials[0].result["status"] == "ok" and trials[0].result["capture"]["greedy"]
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
        app.conf.update(task_always_eager=True)
    # No engine outlived its worker.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tiny_model_root)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == "", leftovers.stdout


@pytest.mark.django_db
def test_what_if_predicts_the_sample_on_the_hardware_the_residency_allows(
    alice,
    alice_org,
    charlie,
    job_settings,
    settings,
    shared_traces,
    tiny_model_root,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    from compliance.models import ResidencyPolicy

    settings.COMPLIANCE_REGIONS = ["local", "us"]
    ResidencyPolicy.objects.create(organization=alice_org, allowed_regions=["local", "us"])
    sample = _sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = _model(alice_org, alice, tiny_model_root)
    query = {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "ttft_p50_ms": "600",
        "ttft_p95_ms": "1500",
    }
    client = Client()
    client.force_login(alice)
    assert client.get(reverse("jobs:what_if")).status_code == 200  # the empty form
    page = client.get(reverse("jobs:what_if"), query)
    assert page.status_code == 200
    rows = {r["hardware"]: r for r in page.context["forecast"]["rows"]}
    # This machine and the US hardware (every cloud entry of the catalog is offered in "us").
    assert "local-cpu" in rows and "h200" in rows and "trainium2" in rows
    assert rows["h200"]["ttft_p50_ms"] is not None and rows["h200"]["calibration"].startswith(
        "measured on h200"
    )
    assert rows["trainium2"]["withheld"] and rows["trainium2"]["ttft_p50_ms"] is None
    html = page.content.decode()
    assert (
        "Every figure here is a prediction" in html
        and "No prediction: no calibration measured on a trainium" in html
    )
    # Another organization cannot name Alice's sample or model: a form error, no forecast.
    other = Client()
    other.force_login(charlie)
    refused = other.get(reverse("jobs:what_if"), query)
    assert refused.context["forecast"] is None and "traffic_sample" in refused.context["form"].errors
    # Bad targets are refused before any simulation.
    bad = client.get(reverse("jobs:what_if"), {**query, "ttft_p95_ms": "-1"})
    assert bad.context["forecast"] is None and "ttft_p95_ms" in bad.context["form"].errors
