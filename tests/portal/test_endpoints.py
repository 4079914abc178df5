"""Dedicated endpoints: deploy a job's winner, call it with the OpenAI client, watch it, stop it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from compliance.models import AuditEvent
from portal.endpoints import selectors, services
from portal.endpoints.models import Endpoint, MetricSnapshot
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic.models import TrafficSample
from serving.engine import EngineConfig


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("endpoint-models")
    build_tiny_model(arch="llama", size="xs", out_dir=root / "llama-xs", seed=0)
    return root


def _finished_job(org, user, model_root: Path, **config_overrides: object) -> TuningJob:  # type: ignore[no-untyped-def]
    """A job as the tuning pipeline leaves it (that pipeline has its own tests)."""
    sample = TrafficSample.objects.create(
        organization=org, name="s", status=TrafficSample.Status.READY, profile={"num_requests": 100}
    )
    model, _ = ServedModel.objects.get_or_create(
        organization=org, name="llama-xs", defaults={"path": str(model_root / "llama-xs")}
    )
    job = TuningJob.objects.create(
        organization=org,
        name="j",
        traffic_sample=sample,
        served_model=model,
        spec={},
        created_by=user,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=0,
    )
    config = EngineConfig.cpu_default(
        max_model_len=1024, cpu_kv_cache_space_gib=1, **config_overrides
    ).to_mapping()
    Trial.objects.create(
        organization=org,
        job=job,
        number=0,
        assignment={"dtype": "float32"},
        label="dtype=float32",
        status=Trial.Status.DONE,
        result={
            "config": config,
            "ttft_p50_ms": 40.0,
            "ttft_p95_ms": 80.0,
            "load": [{"rate_multiple": 1.0, "tokens_per_s": 500.0}],
        },
    )
    return job


@pytest.fixture
def endpoint_settings(settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    settings.ENDPOINTS_DIR = tmp_path / "endpoints"
    return settings


@pytest.mark.django_db
def test_only_a_finished_job_with_a_winner_deploys_and_tenancy_holds(
    alice, alice_org, bob, charlie, endpoint_settings, model_root
) -> None:  # type: ignore[no-untyped-def]
    job = _finished_job(alice_org, alice, model_root)
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.RUNNING)
    running = TuningJob.objects.get(pk=job.pk)
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="finished job"):
        services.endpoint_deploy(actor=alice, job=running)
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.SUCCEEDED)
    endpoint = Endpoint.objects.create(
        organization=alice_org,
        name="e",
        served_model=job.served_model,
        job=job,
        config={},
        port=1,
        api_key_prefix="x",
        api_key_hash="y",
        status=Endpoint.Status.STOPPED,
    )
    before = (Endpoint.objects.count(), AuditEvent.objects.count())
    charlie_client, bob_client = Client(), Client()
    charlie_client.force_login(charlie)
    bob_client.force_login(bob)
    assert charlie_client.get(reverse("endpoints:detail", args=[endpoint.id])).status_code == 404
    assert charlie_client.post(reverse("endpoints:stop", args=[endpoint.id])).status_code == 404
    assert charlie_client.post(reverse("endpoints:deploy", args=[job.id])).status_code == 404
    assert bob_client.get(reverse("endpoints:detail", args=[endpoint.id])).status_code == 200
    assert bob_client.post(reverse("endpoints:deploy", args=[job.id])).status_code == 403
    assert bob_client.post(reverse("endpoints:stop", args=[endpoint.id])).status_code == 403
    assert (Endpoint.objects.count(), AuditEvent.objects.count()) == before


@pytest.mark.django_db
def test_deploy_confirms_then_deploys_once_and_shows_the_key_once(
    alice,
    alice_org,
    bob,
    charlie,
    endpoint_settings,
    model_root,
    django_capture_on_commit_callbacks,
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    from portal.endpoints import tasks

    started: list[str] = []
    monkeypatch.setattr(  # no engine in this test
        tasks.endpoint_start, "apply_async", lambda *a, **kw: started.append(kw["kwargs"]["endpoint_id"])
    )
    job = _finished_job(alice_org, alice, model_root)
    client = Client()
    client.force_login(alice)
    url = reverse("endpoints:deploy", args=[job.id])
    # The job page's button lands on a summary; nothing is created yet, however often it is sent.
    confirm = client.post(url)
    client.post(url)
    assert confirm.status_code == 200 and not Endpoint.objects.exists()
    body = confirm.content.decode()
    assert "llama-xs (tuned)" in body and "local-cpu" in body and "max_model_len" in body
    token = confirm.context["token"]

    # A double click (or a refresh that re-sends the form): one endpoint.
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(url, {"deploy_token": token})
        second = client.post(url, {"deploy_token": token})
    endpoint = Endpoint.objects.get()
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == reverse("endpoints:deployed", args=[endpoint.id])
    assert started == [str(endpoint.id)]
    assert AuditEvent.objects.filter(action="endpoint.deploy").count() == 1
    # The key is shown on the page after the redirect, once; a reload does not show it again.
    page = client.get(first["Location"])
    api_key = page.context["api_key"]
    assert api_key.startswith(f"tgk_{endpoint.api_key_prefix}_") and api_key in page.content.decode()
    assert page["Cache-Control"] == "no-store"
    again = client.get(first["Location"])
    assert again.context["api_key"] is None and api_key not in again.content.decode()
    # Stopping is a confirmation step that says what goes (address, key), with a red button.
    detail = client.get(reverse("endpoints:detail", args=[endpoint.id])).content.decode()
    stop = detail[detail.index('id="stop-confirm"') :]
    assert f"tgk_{endpoint.api_key_prefix}_" in stop and 'class="danger"' in stop
    # The service keeps the same promise when called directly (two requests at once included).
    same, key = services.endpoint_deploy_once(actor=alice, job=job, deploy_token=token)
    assert same == endpoint and key is None and Endpoint.objects.count() == 1
    # A new form is a new deploy; a made-up token is refused.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url, {"deploy_token": client.post(url).context["token"]})
        client.post(url, {"deploy_token": "x"})
    assert Endpoint.objects.count() == 2

    before = (Endpoint.objects.count(), AuditEvent.objects.count())
    bob_client, charlie_client = Client(), Client()
    bob_client.force_login(bob)
    charlie_client.force_login(charlie)
    assert bob_client.post(url, {"deploy_token": deploy_token_fresh()}).status_code == 403
    assert charlie_client.post(url, {"deploy_token": deploy_token_fresh()}).status_code == 404
    assert charlie_client.get(first["Location"]).status_code == 404
    assert (Endpoint.objects.count(), AuditEvent.objects.count()) == before


def deploy_token_fresh() -> str:
    return services.deploy_token_new()


@pytest.mark.django_db
def test_a_stale_supervisor_pid_is_never_signalled(
    alice, alice_org, endpoint_settings, model_root, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    """The recorded pid of a supervisor that is gone may name another process by now (pids are
    handed out again): stopping or watching the endpoint must not signal it or count it as ours."""
    import subprocess
    import sys

    job = _finished_job(alice_org, alice, model_root)
    # A live process that is not this endpoint's supervisor stands in for the reused pid.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        endpoint = Endpoint.objects.create(
            organization=alice_org,
            name="stale",
            served_model=job.served_model,
            job=job,
            config={},
            port=1,
            api_key_prefix="x",
            api_key_hash="y",
            status=Endpoint.Status.HEALTHY,
            runner_handle={
                "kind": "local",
                "dir": str(endpoint_settings.ENDPOINTS_DIR / "stale"),
                "pid": stranger.pid,
                "hostname": None,
            },
        )
        assert services._alive(stranger.pid) and not services._supervisor_alive(endpoint)
        services.endpoint_refresh(endpoint_id=str(endpoint.id))
        endpoint.refresh_from_db()
        assert endpoint.status == Endpoint.Status.DEGRADED
        assert "supervisor process is not running" in endpoint.status_detail
        with django_capture_on_commit_callbacks(execute=True):  # the stop is a background task
            services.endpoint_stop(actor=alice, endpoint=endpoint)
        endpoint.refresh_from_db()
        assert endpoint.status == Endpoint.Status.STOPPED and endpoint.api_key_hash == ""
        assert stranger.poll() is None, "a process that was not the supervisor got a signal"
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


@pytest.mark.engine
@pytest.mark.django_db
def test_deploy_call_with_openai_watch_and_stop(
    alice, alice_org, endpoint_settings, model_root, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    import openai

    job = _finished_job(alice_org, alice, model_root)
    client = Client()
    client.force_login(alice)
    confirm = client.post(reverse("endpoints:deploy", args=[job.id]))
    with django_capture_on_commit_callbacks(execute=True):
        deployed = client.post(
            reverse("endpoints:deploy", args=[job.id]), {"deploy_token": confirm.context["token"]}
        )
    page = client.get(deployed["Location"])
    assert page.status_code == 200
    endpoint = Endpoint.objects.get()
    api_key = page.context["api_key"]
    assert api_key.startswith("tgk_") and api_key not in str(list(Endpoint.objects.values()))
    try:
        deadline = time.monotonic() + 600
        while services.read_state(endpoint).get("status") != "healthy":
            assert time.monotonic() < deadline, (
                endpoint_settings.ENDPOINTS_DIR / str(endpoint.id) / "supervisor.log"
            ).read_text()[-3000:]
            assert services.read_state(endpoint).get("status") != "failed", services.read_state(endpoint)
            time.sleep(1)
        base_url = f"http://127.0.0.1:{endpoint.port}/v1"
        # Clients name the model by its short name; the engine serves it under that name.
        model = "llama-xs"
        assert selectors.endpoint_model_id(endpoint) == model
        answer = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=60).completions.create(
            model=model, prompt="hello there", max_tokens=5
        )
        assert answer.choices[0].text is not None and answer.usage.completion_tokens == 5
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="tgk_wrong", timeout=60).completions.create(
                model=model, prompt="x", max_tokens=1
            )
        services.endpoint_refresh(endpoint_id=str(endpoint.id))
        openai.OpenAI(base_url=base_url, api_key=api_key, timeout=60).completions.create(
            model=model, prompt="again", max_tokens=3
        )
        snapshot = services.endpoint_refresh(endpoint_id=str(endpoint.id))
        assert snapshot is not None and not snapshot.gap
        assert snapshot.requests_per_s is not None and snapshot.requests_per_s > 0
        endpoint.refresh_from_db()
        assert endpoint.status == Endpoint.Status.HEALTHY
        detail = client.get(reverse("endpoints:detail", args=[endpoint.id]))
        assert b"deployed the winner" in detail.content
        # Promote another job's winner: same address, same key, a new engine behind the router.
        newer = _finished_job(alice_org, alice, model_root, max_num_seqs=8)
        with django_capture_on_commit_callbacks(execute=True):
            promoted = client.post(reverse("endpoints:promote", args=[endpoint.id]), {"job": str(newer.id)})
        assert promoted.status_code == 302
        deadline = time.monotonic() + 600
        while (
            services.read_state(endpoint).get("generation") != 2
            or services.read_state(endpoint).get("status") != "healthy"
        ):
            assert time.monotonic() < deadline, services.read_state(endpoint)
            time.sleep(1)
        assert services.read_state(endpoint)["config"]["max_num_seqs"] == 8
        again = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=60).completions.create(
            model=model, prompt="after the switch", max_tokens=3
        )
        assert again.usage.completion_tokens == 3
        assert list(endpoint.revisions.values_list("generation", flat=True)) == [1, 2]
    finally:
        endpoint.refresh_from_db()
        if endpoint.is_active:
            with django_capture_on_commit_callbacks(execute=True):  # the stop is a background task
                services.endpoint_stop(actor=alice, endpoint=endpoint)
    endpoint.refresh_from_db()
    assert endpoint.status == Endpoint.Status.STOPPED
    assert not services._supervisor_alive(endpoint)  # its pid may be another process's by now
    assert MetricSnapshot.objects.filter(endpoint=endpoint).count() >= 2
