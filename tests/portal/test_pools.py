"""Hardware pools: who manages them, who may choose them, and residency at submission."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from compliance.services import residency_policy_set
from portal.accounts.models import User
from portal.endpoints import services as endpoint_services
from portal.endpoints.models import Endpoint
from portal.jobs import services as job_services
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.pools import services
from portal.pools.models import Host, Pool
from portal.traffic.models import TrafficSample
from serving.engine import EngineConfig
from tests.factories import LOOSE_SLO, ready_sample

H200_FACTS = {
    "gpus": [{"index": i, "name": "NVIDIA H200", "memory_total_mib": 143771} for i in range(8)],
    "gpu_source": "nvml",
}


@pytest.fixture
def regions(settings):  # type: ignore[no-untyped-def]
    # Two residency regions in this deployment; organizations default to the first.
    settings.COMPLIANCE_REGIONS = ["local", "us"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["local"]
    return settings


@pytest.fixture
def platform_admin(db) -> User:
    return User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)


def _api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.django_db
def test_pools_are_managed_by_their_owners_and_checked_against_the_registries(
    alice, alice_org, bob, charlie, platform_admin, regions
) -> None:  # type: ignore[no-untyped-def]
    shared = services.pool_create(
        actor=platform_admin, name="cpu-pool", region="local", accelerator="local-cpu"
    )
    # Only platform admins make shared pools; an organization's admins make its own.
    with pytest.raises(PermissionDenied):
        services.pool_create(actor=alice, name="mine", region="local", accelerator="local-cpu")
    # Bad input: every field at fault is named, nothing is created.
    response = _api(alice).post(
        "/api/v1/pools/",
        {
            "name": "Not A Name",
            "region": "mars",
            "accelerator": "tpu-v99",
            "endpoint_url_template": "ftp://x",
            "devices_per_host": 1,
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    body = response.json()
    for field in ("region", "accelerator", "endpoint_url_template"):
        assert field in str(body), body
    assert "tpu-v99" in str(body) and "local-cpu" in str(body)  # the known targets are listed
    assert Pool.objects.count() == 1
    # Bob (viewer) may not create; nothing changes.
    good = {
        "name": "acme-cpu",
        "region": "local",
        "accelerator": "local-cpu",
        "price_per_device_hour_usd": "0.25",
    }
    assert _api(bob).post("/api/v1/pools/", good, format="json").status_code == 403
    assert Pool.objects.count() == 1
    created = _api(alice).post("/api/v1/pools/", good, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["shared"] is False
    assert "waiting for a host of pool acme-cpu" in created.json()["waiting"]
    own = Pool.objects.get(name="acme-cpu")
    assert own.owned_by == alice_org and own.price_per_device_hour_usd == Decimal("0.25")
    assert AuditEvent.objects.filter(action="pool.create", organization=alice_org).exists()
    # Alice sees the shared pool and her own; Charlie sees only the shared one, and Alice's is a 404.
    assert {p["name"] for p in _api(alice).get("/api/v1/pools/").json()["results"]} == {
        "cpu-pool",
        "acme-cpu",
    }
    assert {p["name"] for p in _api(charlie).get("/api/v1/pools/").json()["results"]} == {"cpu-pool"}
    assert _api(charlie).get("/api/v1/pools/acme-cpu/").status_code == 404
    assert (
        _api(charlie).patch("/api/v1/pools/acme-cpu/", {"enabled": False}, format="json").status_code == 404
    )
    # Alice may not change the platform's pool; she may change her own.
    refused = _api(alice).patch("/api/v1/pools/cpu-pool/", {"price_per_device_hour_usd": "9"}, format="json")
    assert refused.status_code == 403
    shared.refresh_from_db()
    assert shared.price_per_device_hour_usd is None  # created without a price: not priced
    changed = _api(alice).patch(
        "/api/v1/pools/acme-cpu/", {"endpoint_url_template": "https://{endpoint}.acme.test"}, format="json"
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["endpoint_url_template"] == "https://{endpoint}.acme.test"


@pytest.mark.django_db
def test_admin_console_lists_pools_and_hosts_with_health(platform_admin, regions) -> None:  # type: ignore[no-untyped-def]
    pool = services.pool_create(
        actor=platform_admin, name="cpu-pool", region="local", accelerator="local-cpu"
    )
    services.host_register(
        pool_name=pool.name, name="engine-a", facts={"cpu_model": "Test CPU", "gpus": []}, agent_pid=1
    )
    # A GPU pool's host that reports another GPU: quarantined, the reason on the admin page.
    from tuning.search.job import HARDWARE

    target = next((name for name, t in HARDWARE.items() if t.device_kind == "gpu"), None)
    if target is not None:
        gpu = services.pool_create(
            actor=platform_admin, name="gpu", region="local", accelerator=target, devices_per_host=1
        )
        services.host_register(
            pool_name=gpu.name, name="wrong-box", facts={"gpus": [{"name": "Acme Tensor 9"}]}, agent_pid=2
        )
    client = Client()
    client.force_login(platform_admin)
    page = client.get("/admin/pools/host/")
    if page.status_code == 302:
        pytest.skip("the admin console needs two-factor for staff here")
    text = page.content.decode()
    assert page.status_code == 200
    assert "engine-a" in text and "live" in text and "Test CPU" in text
    assert "pool.cpu-pool" in text  # the queue its agent consumes (routing)
    if target is not None:
        assert "quarantined" in text and "the host&#x27;s GPUs are Acme Tensor 9" in text
    assert client.get(f"/admin/pools/pool/{pool.pk}/change/").status_code == 200


@pytest.mark.django_db
def test_a_host_whose_hardware_contradicts_its_pool_is_quarantined(platform_admin, regions) -> None:  # type: ignore[no-untyped-def]
    from tuning.search.job import HARDWARE

    gpu_targets = [name for name, target in HARDWARE.items() if target.device_kind == "gpu"]
    cpu = services.pool_create(actor=platform_admin, name="cpu", region="local", accelerator="local-cpu")
    # A CPU target: any host can serve.
    ok = services.host_register(pool_name=cpu.name, name="a", facts={"gpus": []}, agent_pid=1)
    assert ok.state == Host.State.ACTIVE and ok.quarantine_reason == ""
    if not gpu_targets:
        # The GPU targets come from the tuning registry (another change adds them); the rule is
        # still checked on a pool whose accelerator names a GPU of the catalog.
        pool = Pool.objects.create(name="h200", region="local", accelerator="h200", devices_per_host=8)
        reason = services.hardware_contradiction(pool=pool, facts={"gpus": [], "gpu_source": "none"})
        assert "h200" in reason
        return
    name = gpu_targets[0]
    pool = services.pool_create(
        actor=platform_admin, name="gpu", region="local", accelerator=name, devices_per_host=8
    )
    host = services.host_register(
        pool_name=pool.name, name="b", facts={"gpus": [], "gpu_source": "none"}, agent_pid=2
    )
    assert host.state == Host.State.QUARANTINED
    assert "reports no GPU" in host.quarantine_reason
    assert AuditEvent.objects.filter(action="host.quarantine").exists()


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("pool-models")
    build_tiny_model(arch="llama", size="xs", out_dir=root / "llama-xs", seed=0)
    return root


@pytest.mark.django_db
def test_jobs_and_endpoints_choose_a_pool_their_residency_allows(
    alice,
    alice_org,
    charlie,
    platform_admin,
    regions,
    tmp_path,
    shared_traces,
    model_root,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    regions.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    regions.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    regions.TUNING_MODEL_ROOTS = [model_root]
    local = services.pool_create(
        actor=platform_admin,
        name="cpu-pool",
        region="local",
        accelerator="local-cpu",
        price_per_device_hour_usd="0.5",
        devices_per_host=2,
    )
    services.pool_create(actor=platform_admin, name="cpu-us", region="us", accelerator="local-cpu")
    charlies = services.pool_create(
        actor=charlie,
        name="other-cpu",
        region="local",
        accelerator="local-cpu",
        owned_by=charlie.memberships.get().organization,
    )
    sample = ready_sample(
        alice_org, alice, shared_traces / "azure2023_conv.csv", django_capture_on_commit_callbacks
    )
    model = job_services.served_model_register(
        actor=alice, organization=alice_org, name="llama-xs", path=str(model_root / "llama-xs")
    )
    base = {
        "actor": alice,
        "organization": alice_org,
        "name": "",
        "traffic_sample": sample,
        "served_model": model,
        "slo": LOOSE_SLO,
        "peak_rps": 1.0,
    }
    # A pool in a region Alice's organization may not use: refused at submission, nothing written.
    with pytest.raises(ValidationError) as info:
        job_services.tuning_job_create(**base, pool="cpu-us")
    assert "data-residency" in str(info.value.message_dict["pool"])
    # Another organization's own pool is not hers to choose (and not named to her as existing).
    with pytest.raises(ValidationError) as info:
        job_services.tuning_job_create(**base, pool=charlies.name)
    assert "No pool named 'other-cpu'" in str(info.value.message_dict["pool"])
    assert not TuningJob.objects.exists()
    # Once the organization allows "us", the same submission is accepted.
    residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["local", "us"])
    with django_capture_on_commit_callbacks(execute=False):
        job = job_services.tuning_job_create(**base, pool=local.name)
    assert job.pool == local and job.spec["hardware"] == "local-cpu"
    assert job.spec["price_per_hour_usd"] == pytest.approx(1.0)  # 0.5 per device-hour x 2 devices
    # The API takes and shows the pool by name; the job form offers the pools Alice may use.
    response = _api(alice).get(f"/api/v1/tuning-jobs/{job.id}/")
    assert response.json()["pool"] == "cpu-pool"
    page = Client()
    page.force_login(alice)
    form = page.get("/jobs/").content.decode()
    assert "cpu-pool (local-cpu x2, local)" in form and "other-cpu" not in form
    # US-only: a job on the US pool runs in the pool's region, whatever this machine's is; without
    # a pool it would run here ("local"), which the rule refuses.
    residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["us"])
    with django_capture_on_commit_callbacks(execute=False):
        us_job = job_services.tuning_job_create(**base, pool="cpu-us")
    assert us_job.pool is not None and us_job.pool.region == "us"
    with pytest.raises(ValidationError) as info:
        job_services.tuning_job_create(**base)
    assert "region 'local', outside" in str(info.value.message_dict["hardware"])

    # Endpoints: the job's pool by default, residency checked the same way.
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.SUCCEEDED, winner_trial=0)
    job.refresh_from_db()
    config = EngineConfig.cpu_default(max_model_len=1024, cpu_kv_cache_space_gib=1).to_mapping()
    Trial.objects.create(
        organization=alice_org,
        job=job,
        number=0,
        assignment={},
        label="baseline",
        status=Trial.Status.DONE,
        result={"config": config, "ttft_p50_ms": 40.0},
    )
    residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["local"])
    with pytest.raises(ValidationError) as info:
        endpoint_services.endpoint_deploy(actor=alice, job=job, pool="cpu-us")
    assert "data-residency" in str(info.value.message_dict["pool"])
    assert not Endpoint.objects.exists()
    with django_capture_on_commit_callbacks(execute=False):
        endpoint, _ = endpoint_services.endpoint_deploy(actor=alice, job=job)
    # Its address waits for the port its host picks (endpoint_start, on the agent).
    assert endpoint.pool == local and endpoint.port is None and endpoint.base_url == ""
    # No host of the pool has taken its start: the watch sends nothing and the endpoint says why.
    assert endpoint_services.endpoints_watch() == 0
    endpoint.refresh_from_db()
    assert endpoint.status == Endpoint.Status.STARTING
    assert endpoint.status_detail.startswith("waiting for a host of pool cpu-pool"), endpoint.status_detail
    assert not endpoint.snapshots.exists()
    assert ServedModel.objects.count() == 1


@pytest.mark.django_db
def test_a_kubernetes_pool_deploys_through_the_kubernetes_runner(
    alice,
    alice_org,
    platform_admin,
    regions,
    model_root,
    monkeypatch,
    tmp_path,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    """The pool decides the runner: a Kubernetes pool's endpoint is rendered and applied by the
    deployment's workers (no host); with no cluster configured it fails saying so, and its
    address is the pool's ingress, never a host's loopback."""
    from tuning.search.job import HARDWARE

    target = next((n for n, t in HARDWARE.items() if t.device_kind == "gpu"), None)
    if target is None:
        pytest.skip("no GPU hardware target in the tuning registry")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["us"])
    with pytest.raises(ValidationError) as info:
        services.pool_create(
            actor=platform_admin, name="k8s", region="us", accelerator=target, runner="kubernetes"
        )
    assert {"k8s_namespace", "k8s_region"} <= set(info.value.message_dict)
    # The cluster's region must be the pool's residency region (the rule is checked on the pool's).
    from serving.catalog.hardware import HARDWARE as CATALOG

    offered = {r.code: r.name for r in CATALOG[target].regions}
    if "us" not in offered or len(offered) < 2:
        pytest.skip(f"the catalog offers {target} in {offered}: no US region and another to compare")
    elsewhere = next(code for code in offered if code != "us")
    with pytest.raises(ValidationError) as info:
        services.pool_create(
            actor=platform_admin,
            name="k8s",
            region="us",
            accelerator=target,
            runner="kubernetes",
            k8s_namespace="llm",
            k8s_region=offered[elsewhere],
        )
    assert f"{elsewhere!r}" in str(info.value.message_dict["region"])
    pool = services.pool_create(
        actor=platform_admin,
        name="gpu-k8s",
        region="us",
        accelerator=target,
        runner="kubernetes",
        k8s_namespace="llm",
        k8s_region=offered["us"],
        endpoint_url_template="https://{endpoint}.llm.example.test",
    )
    sample = TrafficSample.objects.create(
        organization=alice_org, name="s", status=TrafficSample.Status.READY, profile={"num_requests": 100}
    )
    model = ServedModel.objects.create(organization=alice_org, name="m", path=str(model_root / "llama-xs"))
    job = TuningJob.objects.create(
        organization=alice_org,
        name="j",
        traffic_sample=sample,
        served_model=model,
        pool=pool,
        spec={"hardware": target},
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=0,
    )
    Trial.objects.create(
        organization=alice_org,
        job=job,
        number=0,
        assignment={},
        label="baseline",
        status=Trial.Status.DONE,
        result={"config": EngineConfig().to_mapping(), "ttft_p50_ms": 20.0},
    )
    with django_capture_on_commit_callbacks(execute=True):
        endpoint, _ = endpoint_services.endpoint_deploy(actor=alice, job=job)
    endpoint.refresh_from_db()
    assert endpoint.runner_kind == "kubernetes" and endpoint.host is None
    assert endpoint.base_url.startswith("https://tg-") and endpoint.base_url.endswith(".llm.example.test")
    assert endpoint.status == Endpoint.Status.FAILED
    assert "no Kubernetes cluster is configured" in endpoint.status_detail
    page = Client()
    page.force_login(alice)
    html = page.get(f"/endpoints/{endpoint.id}/").content.decode()
    assert "on pool <strong>gpu-k8s</strong>" in html and "through the kubernetes runner" in html
    assert f"{endpoint.base_url}/v1" in html
