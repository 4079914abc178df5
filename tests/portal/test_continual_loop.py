"""The continual loop in the portal, engine-free: detect -> re-tune -> canary -> promote -> roll back.

The engine side (the supervisor's zero-failure switch under load, a real drift on real traffic)
is measured by `benchmarks/continual_loop.py` and the endpoint tests; here the engine's scrapes
are snapshot rows and the re-tuning job's trials are rows, so every decision is checked exactly.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from compliance.models import AuditEvent
from portal.endpoints import loop
from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
from portal.endpoints.services import endpoint_dir
from portal.jobs.models import ServedModel, TuningJob
from portal.traffic.models import TrafficSample
from tests.portal.loop import SLO, loop_scrapes, loop_trial
from tuning.search.job import JobSpec


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("loop-models")
    build_tiny_model(arch="llama", size="xs", out_dir=root / "llama-xs", seed=0)
    return root


def _detect_then_confirm(endpoint: Endpoint) -> str:
    """Detection, then (a window later, the new traffic still flowing) the re-tune starts."""
    assert loop.loop_tick(endpoint_id=str(endpoint.id)) == "confirming"
    assert loop.loop_tick(endpoint_id=str(endpoint.id)) == "confirming"  # idempotent meanwhile
    # A window later: the scrapes since the detection are the new traffic alone.
    LoopIteration.objects.update(detected_at=timezone.now() - timedelta(minutes=3))
    return loop.loop_tick(endpoint_id=str(endpoint.id))


@pytest.mark.django_db
def test_steady_traffic_starts_nothing(deployed: Endpoint) -> None:
    loop_scrapes(deployed, long=False, p95=700.0, start=timedelta(0))
    assert loop.loop_tick(endpoint_id=str(deployed.id)) == "no drift"
    assert not LoopIteration.objects.exists()


@pytest.mark.django_db
def test_a_few_test_calls_to_a_fresh_endpoint_are_not_drift(deployed: Endpoint, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOOP_MIN_LIVE_REQUESTS = 200
    settings.LOOP_MIN_LIVE_SPAN_S = 600
    # Two minutes of long, prefix-heavy prompts: drift by every measure, but 72 requests.
    loop_scrapes(deployed, long=True, p95=2600.0, start=timedelta(0))
    assert loop.loop_tick(endpoint_id=str(deployed.id)) == "not enough live traffic (72 of 200 requests)"
    # Enough requests, but over two minutes, not the ten the loop needs.
    settings.LOOP_MIN_LIVE_REQUESTS = 50
    assert loop.loop_tick(endpoint_id=str(deployed.id)) == "not enough observed time (120 of 600 s)"
    assert not LoopIteration.objects.exists()


@pytest.mark.django_db
def test_retuning_on_the_serving_host_needs_the_operators_leave(
    deployed: Endpoint, settings, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    settings.LOOP_RETUNE_ON_SERVING_HOST = False
    loop_scrapes(deployed, long=True, p95=2600.0, start=timedelta(0))
    with django_capture_on_commit_callbacks(execute=False):
        step = _detect_then_confirm(deployed)
    it = LoopIteration.objects.get()
    assert step == "failed" and it.status == LoopIteration.Status.FAILED
    assert "LOOP_RETUNE_ON_SERVING_HOST" in it.error
    assert TuningJob.objects.count() == 1  # no re-tuning job was started


@pytest.mark.django_db
def test_drift_retunes_promotes_then_rolls_back_a_live_regression(
    deployed: Endpoint, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    loop_scrapes(deployed, long=True, p95=2600.0, start=timedelta(0))
    with django_capture_on_commit_callbacks(execute=False):  # the job's own step tasks are not run here
        step = _detect_then_confirm(deployed)
    it = LoopIteration.objects.get()
    assert step == "tuning", it.error
    assert it.status == LoopIteration.Status.TUNING and it.number == 1
    assert "input length rose" in it.trigger
    assert {d["dimension"] for d in it.drift["report"]["dimensions"] if d["drifted"]} == {"input_tokens"}
    job = it.job
    assert job is not None and job.organization_id == deployed.organization_id
    spec = JobSpec.from_dict(job.spec)
    assert spec.incumbent == {"dtype": "float32", "max_num_seqs": 16}  # the running config is a candidate
    assert spec.slo == SLO and spec.budget_trials == deployed.retune_budget_trials
    assert spec.target_rps == pytest.approx(0.6, rel=0.15)  # the live rate
    synthesized = it.traffic_sample
    assert synthesized is not None and synthesized.status == TrafficSample.Status.READY
    assert synthesized.profile["input_tokens"]["p50"] > 1000
    # A second tick while the job runs changes nothing (idempotent).
    with django_capture_on_commit_callbacks(execute=False):
        assert loop.loop_tick(endpoint_id=str(deployed.id)) == "tuning"
    assert TuningJob.objects.count() == 2
    # The job ends: the running configuration and a clear winner, both measured on the new traffic.
    loop_trial(job, 0, {"dtype": "float32"}, ttft_p50_ms=2500.0, ttft_p95_ms=5000.0, slo_met=False)
    loop_trial(
        job,
        1,
        {"dtype": "float32", "max_num_seqs": 16},
        ttft_p50_ms=2000.0,
        ttft_p95_ms=4000.0,
        slo_met=False,
    )
    candidate = {"dtype": "float32", "max_num_batched_tokens": 512, "enable_prefix_caching": True}
    loop_trial(job, 2, candidate, ttft_p50_ms=600.0, ttft_p95_ms=1500.0)
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.SUCCEEDED, winner_trial=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert loop.loop_tick(endpoint_id=str(deployed.id)) == "promoted"
    it.refresh_from_db()
    deployed.refresh_from_db()
    assert it.status == LoopIteration.Status.PROMOTED and it.incumbent_ttft_p50_ms == 2000.0
    assert deployed.config["max_num_batched_tokens"] == 512
    written = json.loads((endpoint_dir(deployed) / "config.json").read_text())
    assert written == deployed.config  # the supervisor's cue to switch engines
    assert it.revision is not None and it.revision.generation == 2 and "continual loop" in it.revision.reason
    # Live p95 after the switch is far worse than before it: roll back.
    # Ten minutes later: the scrapes before the switch are older than the promotion.
    LoopIteration.objects.filter(pk=it.pk).update(promoted_at=timezone.now() - timedelta(minutes=10))
    for snap in MetricSnapshot.objects.all():
        MetricSnapshot.objects.filter(pk=snap.pk).update(taken_at=snap.taken_at - timedelta(minutes=11))
    loop_scrapes(deployed, long=True, p95=9000.0, start=timedelta(0))
    with django_capture_on_commit_callbacks(execute=True):
        assert loop.loop_tick(endpoint_id=str(deployed.id)) == "rolled back"
    it.refresh_from_db()
    deployed.refresh_from_db()
    assert it.status == LoopIteration.Status.ROLLED_BACK and it.after_p95_ms == pytest.approx(9000.0)
    assert deployed.config == EndpointRevision.objects.get(endpoint=deployed, generation=1).config
    assert EndpointRevision.objects.get(endpoint=deployed, generation=3).reason.startswith("rolled back")
    actions = set(
        AuditEvent.objects.filter(action__startswith="endpoint.loop").values_list("action", flat=True)
    )
    assert actions == {
        "endpoint.loop.detected",
        "endpoint.loop.retune",
        "endpoint.loop.promote",
        "endpoint.loop.rollback",
    }
    # The policy's cool-down holds the next iteration back.
    assert loop.loop_tick(endpoint_id=str(deployed.id)) == "cooling down"


@pytest.mark.django_db
def test_a_candidate_that_does_not_beat_the_running_config_changes_nothing(
    deployed: Endpoint, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    loop_scrapes(deployed, long=True, p95=2600.0, start=timedelta(0))
    with django_capture_on_commit_callbacks(execute=False):
        assert _detect_then_confirm(deployed) == "tuning"
    it = LoopIteration.objects.get()
    assert it.job is not None
    loop_trial(it.job, 0, {"dtype": "float32"}, ttft_p50_ms=900.0, ttft_p95_ms=2500.0)
    loop_trial(it.job, 1, {"dtype": "float32", "max_num_seqs": 16}, ttft_p50_ms=800.0, ttft_p95_ms=2400.0)
    loop_trial(it.job, 2, {"dtype": "float32", "max_num_seqs": 8}, ttft_p50_ms=780.0, ttft_p95_ms=2300.0)
    TuningJob.objects.filter(pk=it.job.pk).update(status=TuningJob.Status.SUCCEEDED, winner_trial=2)
    assert loop.loop_tick(endpoint_id=str(deployed.id)) == "kept"
    it.refresh_from_db()
    assert it.status == LoopIteration.Status.KEPT and "noise" in it.verdict
    assert EndpointRevision.objects.filter(endpoint=deployed).count() == 1
    # A detection while one is in flight cannot start a second: one active iteration per endpoint.
    assert not LoopIteration.objects.filter(status__in=LoopIteration.ACTIVE).exists()


@pytest.mark.django_db
def test_a_refused_retune_fails_the_iteration_cleanly(deployed: Endpoint, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TUNING_MODEL_ROOTS = []  # the model is no longer allowed: job submission refuses it
    ServedModel.objects.filter(pk=deployed.served_model_id).update(path="/nonexistent/model")
    loop_scrapes(deployed, long=True, p95=2600.0, start=timedelta(0))
    assert _detect_then_confirm(deployed) == "failed"
    it = LoopIteration.objects.get()
    assert it.status == LoopIteration.Status.FAILED and "refused" in it.error
    assert TuningJob.objects.count() == 1  # nothing half-created
