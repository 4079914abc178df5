"""The endpoints REST API: deploy a job's winner once per Idempotency-Key, promote, stop, start
again, live metrics and the loop policy; Charlie (another organization) gets 404 and Bob (a
viewer, or any token capped at viewer) 403, and nothing changes when they try. No engine runs:
the start and stop tasks are recorded instead of sent (the workers have their own tests)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts import services as account_services
from portal.accounts.models import Membership, Organization, Role, User
from portal.endpoints import tasks
from portal.endpoints.models import Endpoint, EndpointRevision
from portal.jobs.models import TuningJob
from tests.factories import deployed_endpoint, finished_job, metric_series

pytestmark = pytest.mark.django_db


def _bearer(user: User, organization: Organization) -> APIClient:
    client = APIClient()
    secret = account_services.api_token_create(actor=user, organization=organization, name="api-test").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _viewer_token(bob: User, organization: Organization) -> APIClient:
    """Bob's token, made while he was a member; he is a viewer again, and the token acts as one
    (a token never acts above its creator's current role)."""
    Membership.objects.filter(user=bob, organization=organization).update(role=Role.MEMBER)
    client = _bearer(bob, organization)
    Membership.objects.filter(user=bob, organization=organization).update(role=Role.VIEWER)
    return client


def _org(user: User) -> Organization:
    return user.memberships.get().organization


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The endpoint tasks sent, as (task, endpoint id): recorded, not run."""
    calls: list[tuple[str, str]] = []
    for name in ("endpoint_start", "endpoint_stop", "endpoint_apply"):
        monkeypatch.setattr(
            getattr(tasks, name),
            "apply_async",
            lambda *a, _name=name, **kw: calls.append((_name, kw["kwargs"]["endpoint_id"])),
        )
    return calls


def _state() -> tuple[Any, ...]:
    """What a refused request must leave as it was."""
    return (
        sorted(Endpoint.objects.values_list("id", "status", "config", "api_key_hash", "retune_cooldown_s")),
        EndpointRevision.objects.count(),
        AuditEvent.objects.count(),
    )


def _deploy(client: APIClient, job: TuningJob, key: str | None = "deploy-1", **body: Any) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(reverse("api:tuning_job_deploy", args=[job.id]), body, format="json", **headers)


def test_a_retried_deploy_creates_one_endpoint_and_shows_the_key_once(
    alice, alice_org, charlie, sent, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(alice_org, alice, winner=True)
    client = _bearer(alice, alice_org)
    with django_capture_on_commit_callbacks(execute=True):
        first = _deploy(client, job, name="voice agent")
        second = _deploy(client, job, name="voice agent")
    assert first.status_code == 201, first.json()
    assert second.status_code == 200, second.json()
    endpoint = Endpoint.objects.get()
    assert first.json()["id"] == second.json()["id"] == str(endpoint.id)
    assert first.json()["api_key"].startswith(f"tgk_{endpoint.api_key_prefix}_")
    assert second.json()["api_key"] is None
    assert first.json()["name"] == "voice agent" and first.json()["status"] == "starting"
    # No address yet: the host that starts the endpoint picks its port and reports it.
    assert first.json()["base_url"] == "" and first.json()["job"] == str(job.id)
    assert sent == [("endpoint_start", str(endpoint.id))]
    assert AuditEvent.objects.filter(action="endpoint.deploy").count() == 1
    # Another key is another deploy; the same key for another job deploys that job.
    assert _deploy(client, job, key="deploy-2").status_code == 201
    other = finished_job(alice_org, alice, name="second tuning", winner=True)
    assert _deploy(client, other, key="deploy-1").status_code == 201
    assert Endpoint.objects.count() == 3

    # Charlie's key never meets Alice's: the same text deploys his own job.
    charlie_job = finished_job(_org(charlie), charlie, winner=True)
    charlie_client = _bearer(charlie, _org(charlie))
    before = _state()
    assert _deploy(charlie_client, job).status_code == 404
    assert _state() == before
    mine = _deploy(charlie_client, charlie_job)
    assert mine.status_code == 201 and Endpoint.objects.get(id=mine.json()["id"]).organization == _org(
        charlie
    )


def test_deploy_refuses_a_missing_or_overlong_key_and_a_job_without_a_winner(alice, alice_org, sent) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(alice_org, alice, winner=True)
    client = _bearer(alice, alice_org)
    before = _state()
    missing = _deploy(client, job, key=None)
    assert missing.status_code == 400 and "Idempotency-Key" in missing.json()
    assert _deploy(client, job, key="k" * 256).status_code == 400
    too_long_name = _deploy(client, job, name="n" * 121)
    assert too_long_name.status_code == 400 and "name" in too_long_name.json()
    unknown_pool = _deploy(client, job, pool="no-such-pool")
    assert unknown_pool.status_code == 400 and "pool" in unknown_pool.json()
    running = finished_job(alice_org, alice, name="running", winner=True)
    TuningJob.objects.filter(pk=running.pk).update(status=TuningJob.Status.RUNNING)
    refused = _deploy(client, running)
    assert refused.status_code == 400 and "finished job" in str(refused.json())
    assert _state() == before and sent == []


def test_a_viewer_token_cannot_deploy_stop_start_promote_or_change_policy(
    alice, alice_org, bob, sent
) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(alice_org, alice, winner=True)
    endpoint = deployed_endpoint(alice_org, alice)
    bob_token = _viewer_token(bob, alice_org)
    before = _state()
    assert _deploy(bob_token, job).status_code == 403
    assert bob_token.post(reverse("api:endpoint_stop", args=[endpoint.id])).status_code == 403
    assert bob_token.post(reverse("api:endpoint_start", args=[endpoint.id])).status_code == 403
    promote = bob_token.post(
        reverse("api:endpoint_promote", args=[endpoint.id]), {"job": str(job.id)}, format="json"
    )
    assert promote.status_code == 403
    policy = bob_token.put(
        reverse("api:endpoint_policy", args=[endpoint.id]),
        {
            "auto_retune": False,
            "retune_cooldown_s": 600,
            "retune_max_per_day": 1,
            "retune_budget_trials": 2,
            "detect_window_s": 60,
        },
        format="json",
    )
    assert policy.status_code == 403 and "viewer" in policy.json()["detail"]
    # Reads are a viewer's.
    assert bob_token.get(reverse("api:endpoint_detail", args=[endpoint.id])).status_code == 200
    assert bob_token.get(reverse("api:endpoint_metrics", args=[endpoint.id])).status_code == 200
    assert bob_token.get(reverse("api:endpoint_policy", args=[endpoint.id])).status_code == 200
    assert _state() == before and sent == []


def test_charlie_sees_none_of_alices_endpoints(alice, alice_org, charlie, sent) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    job = finished_job(alice_org, alice, name="second", winner=True)
    client = _bearer(charlie, _org(charlie))
    before = _state()
    listed = client.get(reverse("api:endpoints"))
    assert listed.status_code == 200 and listed.json()["results"] == []
    for name in ("api:endpoint_detail", "api:endpoint_metrics", "api:endpoint_policy"):
        assert client.get(reverse(name, args=[endpoint.id])).status_code == 404, name
    for name in ("api:endpoint_stop", "api:endpoint_start"):
        assert client.post(reverse(name, args=[endpoint.id])).status_code == 404, name
    assert (
        client.post(
            reverse("api:endpoint_promote", args=[endpoint.id]), {"job": str(job.id)}, format="json"
        ).status_code
        == 404
    )
    # His own endpoint with Alice's job named in the body: no such job.
    own = deployed_endpoint(_org(charlie), charlie, port=59102)
    before = _state()
    refused = client.post(reverse("api:endpoint_promote", args=[own.id]), {"job": str(job.id)}, format="json")
    assert refused.status_code == 400 and refused.json() == {"job": ["No such tuning job."]}
    assert _state() == before and sent == []


def test_list_and_detail(alice, alice_org, bob) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    listed = _viewer_token(bob, alice_org).get(reverse("api:endpoints"))
    assert listed.status_code == 200
    (row,) = listed.json()["results"]
    assert row["id"] == str(endpoint.id) and row["status"] == "healthy" and row["model_name"] == "llama-xs"
    assert row["config"] == endpoint.config and "api_key" not in row and "api_key_hash" not in row
    assert _bearer(alice, alice_org).get(reverse("api:endpoints"), {"limit": "0"}).status_code == 400


def test_promote_records_a_new_generation_at_the_same_address(
    alice, alice_org, sent, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    first = finished_job(alice_org, alice, winner=True)
    client = _bearer(alice, alice_org)
    with django_capture_on_commit_callbacks(execute=True):
        endpoint_id = _deploy(client, first).json()["id"]
    better = finished_job(alice_org, alice, name="re-tuned", winner=True, max_num_seqs=64)
    url = reverse("api:endpoint_promote", args=[endpoint_id])
    promoted = client.post(url, {"job": str(better.id)}, format="json")
    assert promoted.status_code == 201, promoted.json()
    body = promoted.json()
    assert body["generation"] == 2 and body["job"] == str(better.id) and body["config"]["max_num_seqs"] == 64
    endpoint = Endpoint.objects.get(id=endpoint_id)
    assert endpoint.config["max_num_seqs"] == 64 and endpoint.job == better
    assert AuditEvent.objects.filter(action="endpoint.promote").count() == 1
    # Bad input: not a UUID, an unknown job, a job without a winner.
    before = _state()
    assert client.post(url, {"job": "not-a-uuid"}, format="json").status_code == 400
    assert client.post(url, {}, format="json").status_code == 400
    TuningJob.objects.filter(pk=first.pk).update(winner_trial=None)
    refused = client.post(url, {"job": str(first.id)}, format="json")
    assert refused.status_code == 400 and "winner" in str(refused.json())
    assert _state() == before


def test_stop_then_start_again_with_a_new_key(
    alice, alice_org, sent, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    job = finished_job(alice_org, alice, winner=True)
    client = _bearer(alice, alice_org)
    with django_capture_on_commit_callbacks(execute=True):
        created = _deploy(client, job).json()
    endpoint_id, old_key = created["id"], created["api_key"]
    start = reverse("api:endpoint_start", args=[endpoint_id])
    stop = reverse("api:endpoint_stop", args=[endpoint_id])
    # A running endpoint is not started again.
    refused = client.post(start)
    assert refused.status_code == 400 and "stopped or failed" in str(refused.json())

    with django_capture_on_commit_callbacks(execute=True):
        stopped = client.post(stop)
    assert stopped.status_code == 202 and stopped.json()["status"] == "stopping"
    endpoint = Endpoint.objects.get(id=endpoint_id)
    assert endpoint.api_key_hash == "" and endpoint.api_key_sealed is None
    assert sent[-1] == ("endpoint_stop", endpoint_id)
    assert client.post(stop).status_code == 400  # already stopping
    assert client.post(start).status_code == 400  # the stop has not finished
    # The host's half of the stop (tested with the workers) leaves it stopped.
    Endpoint.objects.filter(id=endpoint_id).update(status=Endpoint.Status.STOPPED, stopped_at=timezone.now())

    with django_capture_on_commit_callbacks(execute=True):
        started = client.post(start)
        again = client.post(start)
    assert started.status_code == 202, started.json()
    assert again.status_code == 400
    body = started.json()
    endpoint.refresh_from_db()
    assert body["status"] == "starting" and endpoint.stopped_at is None
    assert body["api_key"].startswith(f"tgk_{endpoint.api_key_prefix}_") and body["api_key"] != old_key
    assert endpoint.api_key_sealed and endpoint.api_key_hash
    assert [s for s in sent if s[0] == "endpoint_start"] == [("endpoint_start", endpoint_id)] * 2
    assert AuditEvent.objects.filter(action="endpoint.start_again").count() == 1


def test_a_failed_endpoint_starts_again_with_the_key_it_has(alice, alice_org, sent) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice, status=Endpoint.Status.FAILED, api_key_sealed=b"sealed")
    started = _bearer(alice, alice_org).post(reverse("api:endpoint_start", args=[endpoint.id]))
    assert started.status_code == 202 and started.json()["api_key"] is None
    endpoint.refresh_from_db()
    assert endpoint.status == Endpoint.Status.STARTING and endpoint.api_key_hash == "0" * 64


def test_metrics_are_the_dashboards_series_with_gaps_as_null(alice, alice_org, bob) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    start = timezone.now() - timedelta(minutes=20)
    metric_series(endpoint, start, [300.0, None, 320.0, 340.0])
    client = _viewer_token(bob, alice_org)
    url = reverse("api:endpoint_metrics", args=[endpoint.id])
    response = client.get(url)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["range"] == "1h" and body["status"] == "healthy"
    series = body["series"]
    assert series["num_snapshots"] == 5 and series["num_gaps"] == 1
    assert series["ttft_p50_ms"] == [None, 300.0, None, 320.0, 340.0]
    assert body["slo"]["ttft_p95_ms"] == 1500 and body["sla"]["source"] == "slo"
    assert body["last_snapshot"]["gap"] is False
    week = client.get(url, {"range": "7d"}).json()
    assert week["range"] == "7d" and week["series"]["bucket_s"] == 1800
    for bad in ({"range": "1y"}, {"range": ""}):
        refused = client.get(url, bad)
        assert refused.status_code == 400 and "range" in refused.json()
    assert client.get(f"{url}?range=1h&range=7d").status_code == 400


def test_policy_reads_and_replaces_within_bounds(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    client = _bearer(alice, alice_org)
    url = reverse("api:endpoint_policy", args=[endpoint.id])
    assert client.get(url).json() == {
        "auto_retune": True,
        "retune_cooldown_s": 3600,
        "retune_max_per_day": 4,
        "retune_budget_trials": 4,
        "detect_window_s": 120,
    }
    wanted = {
        "auto_retune": False,
        "retune_cooldown_s": 600,
        "retune_max_per_day": 2,
        "retune_budget_trials": 3,
        "detect_window_s": 300,
    }
    changed = client.put(url, wanted, format="json")
    assert changed.status_code == 200 and changed.json() == wanted
    endpoint.refresh_from_db()
    assert (endpoint.auto_retune, endpoint.retune_cooldown_s, endpoint.detect_window_s) == (False, 600, 300)
    assert AuditEvent.objects.filter(action="endpoint.policy_set").count() == 1
    before = _state()
    for bad in (
        {**wanted, "retune_cooldown_s": 59},
        {**wanted, "retune_cooldown_s": 10**30},
        {**wanted, "retune_budget_trials": 21},
        {**wanted, "detect_window_s": 1.5},
        {**wanted, "auto_retune": "perhaps"},
        {k: v for k, v in wanted.items() if k != "retune_max_per_day"},
    ):
        refused = client.put(url, bad, format="json")
        assert refused.status_code == 400, bad
        assert set(refused.json()) <= set(wanted)
    assert client.put(url, "[]", content_type="application/json").status_code == 400
    assert _state() == before


def test_the_schema_documents_every_new_operation_and_the_idempotency_key(alice_client) -> None:  # type: ignore[no-untyped-def]
    schema = alice_client.get("/api/schema/", {"format": "json"}).json()
    paths = {
        path: set(ops) & {"get", "post", "put", "patch", "delete"} for path, ops in schema["paths"].items()
    }
    assert {
        "/api/v1/endpoints/": {"get"},
        "/api/v1/endpoints/{id}/": {"get"},
        "/api/v1/tuning-jobs/{id}/deploy/": {"post"},
        "/api/v1/endpoints/{id}/promote/": {"post"},
        "/api/v1/endpoints/{id}/stop/": {"post"},
        "/api/v1/endpoints/{id}/start/": {"post"},
        "/api/v1/endpoints/{id}/metrics/": {"get"},
        "/api/v1/endpoints/{id}/policy/": {"get", "put"},
        "/api/v1/benchmark-reports/": {"get", "post"},
        "/api/v1/benchmark-reports/{id}/": {"get"},
        "/api/v1/benchmark-reports/{id}/result/": {"get"},
        "/api/v1/benchmark-reports/{id}/share-links/": {"get", "post"},
        "/api/v1/benchmark-reports/{id}/share-links/{link_id}/": {"delete"},
    }.items() <= paths.items()
    deploy = schema["paths"]["/api/v1/tuning-jobs/{id}/deploy/"]["post"]
    (header,) = [p for p in deploy["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key" and header["required"] is True
    assert header["schema"] == {"type": "string", "minLength": 1, "maxLength": 255}
    assert {"200", "201", "400", "403", "404"} <= set(deploy["responses"])
    # Benchmark lists are a 404 to non-staff: said in the schema too.
    assert "404" in schema["paths"]["/api/v1/benchmark-reports/"]["get"]["responses"]
    cooldown = schema["components"]["schemas"]["PolicyRequest"]["properties"]["retune_cooldown_s"]
    assert (cooldown["minimum"], cooldown["maximum"]) == (60, 30 * 86_400)


@pytest.mark.django_db(transaction=True)
def test_two_deploys_at_once_with_one_key_make_one_endpoint(alice, alice_org, sent) -> None:  # type: ignore[no-untyped-def]
    """Both requests miss the lookup; the unique token lets one insert and the other, blocked on
    it until the first commits, answers with the first's endpoint (and no key)."""
    import threading

    from django.db import connection, transaction

    from portal.endpoints import services

    job = finished_job(alice_org, alice, winner=True)
    barrier = threading.Barrier(2)
    results: list[tuple[str, str | None]] = []
    errors: list[BaseException] = []
    lookup = services.Endpoint.objects.filter

    waited = threading.local()

    def racing_filter(*args: Any, **kwargs: Any) -> Any:
        rows = lookup(*args, **kwargs)
        first = not getattr(waited, "done", False)
        if first and "deploy_token" in kwargs and threading.current_thread().name.startswith("deploy-"):
            waited.done = True
            rows = list(rows)  # looked, and found nothing, before either inserts
            barrier.wait(timeout=10)
            return lookup(pk__in=[r.pk for r in rows])
        return rows

    def deploy() -> None:
        try:
            with transaction.atomic():
                endpoint, key = services.endpoint_deploy_keyed(actor=alice, job=job, idempotency_key="same")
            results.append((str(endpoint.id), key))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(services.Endpoint.objects, "filter", racing_filter)
        threads = [threading.Thread(target=deploy, name=f"deploy-{i}") for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    assert Endpoint.objects.count() == 1
    (ids, keys) = zip(*results, strict=True)
    assert set(ids) == {str(Endpoint.objects.get().id)}
    assert sorted(key is None for key in keys) == [False, True]
