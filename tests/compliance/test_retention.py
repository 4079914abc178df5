"""Retention and deletion across regions, on the S3 server (moto, loopback)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from compliance import services, tasks
from compliance.models import AuditEvent, BAARecord, StoredObject
from portal.accounts.models import Membership, Organization
from portal.sla import services as sla_services
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.compliance.helpers import s3_keys
from tests.factories import SLA_TERMS, deployed_endpoint, metric_series

pytestmark = pytest.mark.django_db


def _objects_in_both_regions(alice, org):  # type: ignore[no-untyped-def]
    """One object in the EU bucket, then one in the US bucket (the policy decides each time)."""
    services.residency_policy_set(actor=alice, organization=org, allowed_regions=["eu"])
    eu = services.sensitive_object_store(
        actor=alice, organization=org, kind="sample_upload", stream=io.BytesIO(b"eu calls"), owner_id="s-eu"
    )
    services.residency_policy_set(actor=alice, organization=org, allowed_regions=["eu", "us"])
    us = services.sensitive_object_store(
        actor=alice, organization=org, kind="sample_upload", stream=io.BytesIO(b"us calls"), owner_id="s-us"
    )
    assert (eu.region, us.region) == ("eu", "us")
    return eu, us


def test_retention_deletes_expired_objects_in_every_region(alice, alice_org, charlie, s3_regions) -> None:  # type: ignore[no-untyped-def]
    eu, us = _objects_in_both_regions(alice, alice_org)
    charlie_org = charlie.memberships.get().organization
    kept = services.sensitive_object_store(
        actor=charlie, organization=charlie_org, kind="sample_upload", stream=io.BytesIO(b"charlie")
    )
    services.retention_policy_set(actor=alice, organization=alice_org, sample_retention_days=7)
    assert services.retention_enforce(now=timezone.now() + timedelta(days=1)) == {
        "samples": 0,
        "objects": 0,
        "metric_snapshots": 0,
    }
    result = services.retention_enforce(now=timezone.now() + timedelta(days=8))
    assert result["objects"] == 2  # Alice's two (7 days); Charlie's default is 30 days
    assert s3_keys(s3_regions, "eu") == []
    assert s3_keys(s3_regions, "us") == [kept.key]
    assert set(StoredObject.objects.values_list("id", flat=True)) == {kept.id}
    assert not StoredObject.objects.filter(id__in=[eu.id, us.id]).exists()
    assert AuditEvent.objects.filter(action="retention.object_delete", organization=alice_org).count() == 2
    assert services.audit_verify() == []
    # Idempotent: a second run finds nothing.
    assert services.retention_enforce(now=timezone.now() + timedelta(days=8))["objects"] == 0


def test_retention_deletes_expired_samples(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    sample = traffic_services.traffic_sample_create(
        actor=alice,
        organization=alice_org,
        name="old",
        upload=SimpleUploadedFile("a.jsonl", b'{"timestamp": 1}\n'),
    )
    TrafficSample.objects.filter(id=sample.id).update(created_at=timezone.now() - timedelta(days=31))
    result = tasks.retention_enforce.apply().get()
    assert result == {"samples": 1, "objects": 1, "metric_snapshots": 0}
    assert not TrafficSample.objects.filter(id=sample.id).exists()
    assert not StoredObject.objects.exists()


def test_delete_my_organizations_data_everywhere(alice, alice_org, bob, charlie, s3_regions) -> None:  # type: ignore[no-untyped-def]
    _objects_in_both_regions(alice, alice_org)
    services.baa_record_create(
        actor=alice,
        organization=alice_org,
        counterparty="Tailguard Inc.",
        version="v1",
        signed_on=timezone.now().date(),
        effective_on=timezone.now().date(),
        document=SimpleUploadedFile("baa.pdf", b"%PDF-1.4"),
    )
    charlie_org = charlie.memberships.get().organization
    theirs = services.sensitive_object_store(
        actor=charlie, organization=charlie_org, kind="baa_document", stream=io.BytesIO(b"charlie")
    )
    org_id = alice_org.pk
    events_before = AuditEvent.objects.filter(organization_id=org_id).count()

    # Bob (viewer) and a wrong confirmation change nothing.
    api = APIClient()
    api.force_authenticate(bob)
    assert api.post("/api/v1/compliance/delete-organization/", {"confirm": alice_org.slug}).status_code == 403
    with pytest.raises(ValidationError, match="slug"):
        services.organization_data_delete(actor=alice, organization=alice_org, confirm="nope")
    assert len(s3_keys(s3_regions, "us")) == 3 and len(s3_keys(s3_regions, "eu")) == 1

    api.force_authenticate(alice)
    response = api.post("/api/v1/compliance/delete-organization/", {"confirm": alice_org.slug})
    assert response.status_code == 200, response.content
    assert response.json()["objects"] == 3
    assert s3_keys(s3_regions, "eu") == [] and s3_keys(s3_regions, "us") == [theirs.key]
    assert not Organization.objects.filter(pk=org_id).exists()
    assert not Membership.objects.filter(organization_id=org_id).exists()
    assert not BAARecord.objects.filter(organization_id=org_id).exists()
    assert not StoredObject.objects.filter(organization_id=org_id).exists()
    # Only the audit trail remains, ending with the deletion, and it still verifies.
    events = AuditEvent.objects.filter(organization_id=org_id).order_by("seq")
    assert events.count() == events_before + 1
    last = events.last()
    assert last.action == "organization.data_delete" and last.data["objects_by_region"] == {"us": 2, "eu": 1}
    assert services.audit_verify() == []


def test_charlie_cannot_delete_alices_data(alice, alice_org, charlie_client, regions) -> None:  # type: ignore[no-untyped-def]
    response = charlie_client.post(reverse("compliance:organization_delete"), {"confirm": alice_org.slug})
    assert response.status_code == 400  # his own slug is what his organization would need
    assert Organization.objects.filter(pk=alice_org.pk).exists()


def test_metric_retention_freezes_sla_windows_before_deleting_snapshots(alice, alice_org, regions) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from portal.endpoints.models import Endpoint, MetricSnapshot, SLAWindowReport

    endpoint = deployed_endpoint(alice_org, alice)
    Endpoint.objects.filter(id=endpoint.id).update(created_at=datetime(2026, 9, 1, tzinfo=UTC))
    metric_series(endpoint, datetime(2026, 10, 31, 23, 0, tzinfo=UTC), [500.0] * 30)
    sla_services.sla_terms_set(actor=alice, endpoint=endpoint, **SLA_TERMS)
    with pytest.raises(ValidationError, match="Use 35 to 3650 days"):
        services.retention_policy_set(
            actor=alice, organization=alice_org, sample_retention_days=30, metric_retention_days=7
        )
    services.retention_policy_set(
        actor=alice, organization=alice_org, sample_retention_days=30, metric_retention_days=35
    )
    counts = services.retention_enforce(now=datetime(2026, 12, 10, tzinfo=UTC))
    assert counts["metric_snapshots"] == 31
    assert not MetricSnapshot.objects.exists()
    # October and November were frozen first (the one-hour close runs at each enforcement).
    october = SLAWindowReport.objects.get(window_start=datetime(2026, 10, 1, tzinfo=UTC))
    assert october.result["compliant_s"] == 30 * 60


def test_deleting_an_organization_takes_each_apps_share(
    alice, alice_org, regions, settings, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Endpoints, jobs and traffic register what they hold (compliance.holders; SLA only what
    retention freezes first): a serving endpoint refuses the deletion; once stopped, their rows and
    files all go, counted in the audit event."""
    from compliance import holders
    from portal.endpoints.models import Endpoint, MetricSnapshot
    from portal.jobs.models import TuningJob

    assert [holder.name for holder in holders.holders()] == ["endpoints", "jobs", "traffic", "sla"]
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    settings.ENDPOINTS_DIR = tmp_path / "endpoints"
    endpoint = deployed_endpoint(alice_org, alice)
    metric_series(endpoint, timezone.now() - timedelta(hours=1), [500.0] * 3)
    job_dir = tmp_path / "jobs" / str(endpoint.job_id)
    endpoint_dir = tmp_path / "endpoints" / str(endpoint.id)
    for folder in (job_dir, endpoint_dir):
        folder.mkdir(parents=True)
        (folder / "state.json").write_text("{}")
    with pytest.raises(ValidationError, match="Stop the organization's 1 running endpoint"):
        services.organization_data_delete(actor=alice, organization=alice_org, confirm=alice_org.slug)
    assert job_dir.exists() and endpoint_dir.exists()  # refused before anything was touched
    Endpoint.objects.filter(id=endpoint.id).update(status=Endpoint.Status.STOPPED)

    counts = services.organization_data_delete(actor=alice, organization=alice_org, confirm=alice_org.slug)
    assert counts == {"objects": 0, "samples": 1, "jobs": 1}
    assert not job_dir.exists() and not endpoint_dir.exists()
    assert (
        not Endpoint.objects.exists()
        and not TuningJob.objects.exists()
        and not MetricSnapshot.objects.exists()
    )
    assert not TrafficSample.objects.exists()
    event = AuditEvent.objects.filter(action="organization.data_delete").get()
    assert (event.data["samples"], event.data["jobs"]) == (1, 1)
    assert services.audit_verify() == []
