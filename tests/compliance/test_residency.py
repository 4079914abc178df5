"""Data residency: the default, the policy, and refusals for storage, tuning and export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from compliance import selectors, services
from compliance.models import AuditEvent, ResidencyPolicy, StoredObject
from portal.jobs import services as job_services
from portal.jobs.models import TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample

pytestmark = pytest.mark.django_db


def _api(user):  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_default_is_the_home_region_only_never_anywhere(alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    assert selectors.allowed_regions(organization=alice_org) == ["us"]
    assert selectors.residency_is_default(organization=alice_org)
    with pytest.raises(ValidationError, match="data-residency rule"):
        services.residency_require(organization=alice_org, region="eu", doing="this test")


def test_owner_sets_residency_and_it_is_audited(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    response = _api(alice).put(
        "/api/v1/compliance/residency/", {"allowed_regions": ["eu", "us"]}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"allowed_regions": ["eu", "us"], "is_default": False}
    event = AuditEvent.objects.get(action="residency.set")
    assert event.data == {"allowed_regions": ["eu", "us"], "previous": ["us"]}
    assert event.before_digest and event.after_digest
    response = _api(alice).put("/api/v1/compliance/residency/", {"allowed_regions": ["mars"]}, format="json")
    assert response.status_code == 400 and "Unknown region mars" in json.dumps(response.json())


def test_viewer_cannot_change_residency_and_nothing_changes(bob, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    before = (ResidencyPolicy.objects.count(), AuditEvent.objects.count())
    response = _api(bob).put("/api/v1/compliance/residency/", {"allowed_regions": ["eu"]}, format="json")
    assert response.status_code == 403
    assert (
        _api(bob)
        .put("/api/v1/compliance/retention/", {"sample_retention_days": 5}, format="json")
        .status_code
        == 403
    )
    assert (ResidencyPolicy.objects.count(), AuditEvent.objects.count()) == before
    assert selectors.allowed_regions(organization=alice_org) == ["us"]


def test_charlie_changes_only_his_own_organization(alice_org, charlie, regions) -> None:  # type: ignore[no-untyped-def]
    response = _api(charlie).put("/api/v1/compliance/residency/", {"allowed_regions": ["eu"]}, format="json")
    assert response.status_code == 200
    assert selectors.allowed_regions(organization=alice_org) == ["us"]
    assert not ResidencyPolicy.objects.filter(organization=alice_org).exists()


def test_narrowing_is_refused_while_objects_live_in_the_region(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    services.sensitive_object_store(
        actor=alice, organization=alice_org, kind="baa_document", stream=_file(b"x")
    )
    services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["us", "eu"])
    with pytest.raises(ValidationError, match=r"1 stored object\(s\) are in us"):
        services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["eu"])


def _file(content: bytes, name: str = "trace.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content)


def test_uploads_go_to_the_bucket_the_policy_chooses(alice, alice_org, regions, shared_traces: Path) -> None:  # type: ignore[no-untyped-def]
    services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["eu"])
    data = (shared_traces / "mooncake_synthetic.jsonl").read_bytes()
    sample = traffic_services.traffic_sample_create(
        actor=alice, organization=alice_org, name="eu only", upload=_file(data)
    )
    stored = StoredObject.objects.get(owner_id=str(sample.id))
    assert stored.region == "eu" and stored.kind == "sample_upload"
    object_dir = regions.COMPLIANCE_STORAGE_DIR
    assert (object_dir / "eu" / stored.key).is_file()
    assert not (object_dir / "us").exists()
    # Encrypted at rest: the file on disk is not the upload.
    assert data[:64] not in (object_dir / "eu" / stored.key).read_bytes()


def test_storage_refused_before_anything_is_written(alice, alice_org, regions, settings) -> None:  # type: ignore[no-untyped-def]
    # The policy allows only "us", and this deployment no longer has a US region.
    settings.COMPLIANCE_REGIONS = ["eu"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["eu"]
    ResidencyPolicy.objects.create(organization=alice_org, allowed_regions=["us"])
    before = (TrafficSample.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count())
    with pytest.raises(ValidationError, match="data-residency rule of Acme Voice") as info:
        traffic_services.traffic_sample_create(
            actor=alice, organization=alice_org, name="nowhere", upload=_file(b'{"timestamp": 1}\n')
        )
    assert "allowed regions (us)" in str(info.value)
    assert (TrafficSample.objects.count(), StoredObject.objects.count(), AuditEvent.objects.count()) == before
    assert not regions.COMPLIANCE_STORAGE_DIR.exists()
    assert (
        not any(Path(regions.TRAFFIC_STAGING_DIR).glob("**/*"))
        if Path(regions.TRAFFIC_STAGING_DIR).exists()
        else True
    )


@pytest.fixture(scope="module")
def tiny_model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    build_tiny_model(arch="llama", size="xs", out_dir=root / "llama-xs", seed=0)
    return root


def test_tuning_hardware_outside_the_allowed_regions_is_refused(
    alice, alice_org, regions, settings, shared_traces, tiny_model_root, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    settings.COMPLIANCE_REGIONS = ["us", "local"]
    settings.TUNING_MODEL_ROOTS = [tiny_model_root]
    with django_capture_on_commit_callbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="conv",
            upload=_file((shared_traces / "azure2023_conv.csv").read_bytes(), "conv.csv"),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    model = job_services.served_model_register(
        actor=alice, organization=alice_org, name="llama-xs", path=str(tiny_model_root / "llama-xs")
    )
    spec = {
        "actor": alice,
        "organization": alice_org,
        "name": "",
        "traffic_sample": sample,
        "served_model": model,
        "slo": "ttft_p50_ms<=2000,ttft_p95_ms<=8000",
        "peak_rps": 2.0,
        "hardware": "local-cpu",
    }
    before = (TuningJob.objects.count(), AuditEvent.objects.filter(action="tuning_job.create").count())
    with pytest.raises(ValidationError) as info:
        job_services.tuning_job_create(**spec)
    assert "region 'local', outside the organization's allowed regions (us)" in str(
        info.value.message_dict["hardware"]
    )
    assert (
        TuningJob.objects.count(),
        AuditEvent.objects.filter(action="tuning_job.create").count(),
    ) == before
    # The owner allows the local region: the same job is accepted.
    services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["us", "local"])
    job = job_services.tuning_job_create(**spec)
    assert job.pk is not None


def test_deployment_hardware_outside_the_allowed_regions_is_refused(
    alice, alice_org, regions, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.COMPLIANCE_REGIONS = ["us", "local"]
    with pytest.raises(ValidationError, match="data-residency rule") as info:
        services.residency_require_hardware(
            organization=alice_org, hardware="local-cpu", doing="this endpoint"
        )
    assert "would be in 'local'" in info.value.message_dict["hardware"][0]
    services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["local"])
    services.residency_require_hardware(organization=alice_org, hardware="local-cpu", doing="this endpoint")
