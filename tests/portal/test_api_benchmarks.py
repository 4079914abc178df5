"""The benchmark reports REST API: a sales engineer who is a member of the prospect's
organization creates a report (measured here against a local OpenAI-compatible server), polls
its status, reads its result and shares it; anyone who is not benchmark staff (the prospect's
own owner included) gets 404 everywhere, a viewer-capped token 403, and nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts import services as account_services
from portal.accounts.models import Membership, Organization, Role, User
from portal.benchmarks import services
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink
from portal.traffic.models import TrafficSample
from tests.conftest import PASSWORD
from tests.portal.benchmarks import API_KEY, FakeOpenAI

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _local_targets_allowed(settings: Any) -> None:
    """The fake endpoint listens on loopback: the operator setting that allows it (the refusal
    itself is tested in test_benchmark_ssrf)."""
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def _bearer(user: User, organization: Organization) -> APIClient:
    client = APIClient()
    secret = account_services.api_token_create(actor=user, organization=organization, name="api-test").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def sam_api(sam: User, alice_org: Organization) -> APIClient:
    """The sales engineer, a member of Alice's (the prospect's) organization, by token."""
    Membership.objects.create(organization=alice_org, user=sam, role=Role.MEMBER)
    return _bearer(sam, alice_org)


def _body(sample: Any, url: str = "https://api.provider.example/v1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "traffic_sample": str(sample.id),
        "load_multipliers": [1.0],
        "duration_s": 2,
        "request_timeout_s": 5,
        "targets": [
            {
                "name": "Provider",
                "base_url": url,
                "model": "acme-chat",
                "api_key": API_KEY,
                "pricing": "per_token",
                "price_input_per_mtok_usd": "0.5",
                "price_output_per_mtok_usd": "1.5",
            }
        ],
    }
    return {**body, **overrides}


def _state() -> tuple[int, int, int]:
    return (BenchmarkReport.objects.count(), BenchmarkShareLink.objects.count(), AuditEvent.objects.count())


def test_create_poll_read_and_share_a_measured_report(
    sam_api, sample, serve, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    server = serve(FakeOpenAI())
    with django_capture_on_commit_callbacks(execute=True):
        created = sam_api.post(
            reverse("api:benchmark_reports"), _body(sample, server.base_url), format="json"
        )
    assert created.status_code == 201, created.json()
    report_id = created.json()["id"]
    assert created.json()["status"] == "queued" and created.json()["cells_total"] == 1
    assert API_KEY not in created.content.decode()

    status = sam_api.get(reverse("api:benchmark_report_detail", args=[report_id]))
    assert status.status_code == 200
    assert status.json()["status"] == "succeeded", status.json()["error"]
    assert status.json()["cells_done"] == status.json()["cells_total"] == 1
    listed = sam_api.get(reverse("api:benchmark_reports")).json()["results"]
    assert [r["id"] for r in listed] == [report_id]

    result = sam_api.get(reverse("api:benchmark_report_result", args=[report_id]))
    assert result.status_code == 200
    body = result.json()
    assert body["finished"] is True and body["attribution"] is None
    (target,) = body["targets"]
    assert target["name"] == "Provider" and target["has_api_key"] is True
    (level,) = body["levels"]
    (row,) = level["rows"]
    assert (
        row["target"] == target["id"] and row["cell"]["num_requests"] >= 1 and row["cell"]["num_errors"] == 0
    )
    assert API_KEY not in result.content.decode()
    assert server.received and {r["authorization"] for r in server.received} == {f"Bearer {API_KEY}"}

    links = reverse("api:benchmark_share_links", args=[report_id])
    shared = sam_api.post(links, {"days": 7}, format="json")
    assert shared.status_code == 201, shared.json()
    url = shared.json()["url"]
    assert "/benchmarks/shared/" in url and shared.json()["state"] == "active"
    secret = url.rstrip("/").rsplit("/", 1)[1]
    assert services.benchmark_share_open(secret=secret).id == BenchmarkReport.objects.get().id
    listing = sam_api.get(links).json()["results"]
    assert [link["state"] for link in listing] == ["active"] and secret not in str(listing)
    link_id = shared.json()["id"]
    revoked = sam_api.delete(reverse("api:benchmark_share_link_detail", args=[report_id, link_id]))
    assert revoked.status_code == 204
    assert services.benchmark_share_open(secret=secret) is None
    assert sam_api.get(links).json()["results"][0]["state"] == "revoked"
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"benchmark_report.create", "benchmark_share.create", "benchmark_share.revoke"} <= actions


def test_bad_input_is_a_400_naming_the_field_and_creates_nothing(sam_api, sample, charlie) -> None:  # type: ignore[no-untyped-def]
    other = charlie.memberships.get().organization
    other_sample = TrafficSample.objects.create(
        organization=other, name="charlie's", status=TrafficSample.Status.READY, profile={}
    )
    target = _body(sample)["targets"][0]
    cases = {
        "load_multipliers": _body(sample, load_multipliers=[0.5 * i for i in range(1, 10)]),
        "duration_s": _body(sample, duration_s=0),
        "request_timeout_s": _body(sample, request_timeout_s=601),
        "max_output_tokens": _body(sample, max_output_tokens=10**12),
        "targets": _body(sample, targets=[{**target, "name": f"t{i}"} for i in range(5)]),
        "traffic_sample": _body(sample, traffic_sample=str(other_sample.id)),
    }
    before = _state()
    for field, body in cases.items():
        response = sam_api.post(reverse("api:benchmark_reports"), body, format="json")
        assert response.status_code == 400, (field, response.json())
        assert field in response.json(), (field, response.json())
    # The service's own checks: a repeated multiplier, a target at an internal address.
    repeated = sam_api.post(
        reverse("api:benchmark_reports"), _body(sample, load_multipliers=[1, 1]), format="json"
    )
    assert repeated.status_code == 400 and "load_multipliers" in repeated.json()
    internal = sam_api.post(
        reverse("api:benchmark_reports"), _body(sample, "http://10.1.2.3/v1"), format="json"
    )
    assert internal.status_code == 400 and "targets" in internal.json()
    assert _state() == before


def test_only_benchmark_staff_see_the_routes_and_a_viewer_token_cannot_write(
    alice, alice_org, bob, sam, sample, charlie
) -> None:  # type: ignore[no-untyped-def]
    report = BenchmarkReport.objects.create(
        organization=alice_org,
        name="acme report",
        traffic_sample=sample,
        sample_name=sample.name,
        peak_rps=3.0,
        load_multipliers=[1.0],
        duration_s=10,
        status=BenchmarkReport.Status.SUCCEEDED,
        created_by=sam,
    )
    urls = [
        reverse("api:benchmark_reports"),
        reverse("api:benchmark_report_detail", args=[report.id]),
        reverse("api:benchmark_report_result", args=[report.id]),
        reverse("api:benchmark_share_links", args=[report.id]),
    ]
    before = _state()
    # The prospect's owner is not staff: nothing is there for her, reads or writes.
    alice_api = _bearer(alice, alice_org)
    for url in urls:
        assert alice_api.get(url).status_code == 404, url
        assert alice_api.post(url, _body(sample) | {"days": 7}, format="json").status_code in (404, 405), url
    # A sales engineer acting in another organization: Alice's report is not found there.
    other_se = User.objects.create_user(
        email="se2@tailguard.test", password=PASSWORD, is_staff=True, staff_role=User.StaffRole.SALES_ENGINEER
    )
    charlie_org = charlie.memberships.get().organization
    Membership.objects.create(organization=charlie_org, user=other_se, role=Role.MEMBER)
    other_api = _bearer(other_se, charlie_org)
    assert other_api.get(urls[0]).json()["results"] == []
    for url in urls[1:]:
        assert other_api.get(url).status_code == 404, url
    created = other_api.post(urls[0], _body(sample), format="json")
    assert created.status_code == 400 and created.json() == {"traffic_sample": ["No such traffic sample."]}
    # Sam with a token that acts as a viewer (made as a member; he is a viewer now): reads only.
    membership = Membership.objects.create(organization=alice_org, user=sam, role=Role.MEMBER)
    sam_token = _bearer(sam, alice_org)
    membership.role = Role.VIEWER
    membership.save(update_fields=["role"])
    before = _state()
    assert sam_token.get(urls[1]).status_code == 200
    assert sam_token.post(urls[0], _body(sample), format="json").status_code == 403
    assert sam_token.post(urls[3], {"days": 7}, format="json").status_code == 403
    # Bob (a viewer, not staff) is told nothing exists, not that his role is too low.
    bob_client = APIClient()
    bob_client.force_authenticate(bob)
    assert bob_client.post(urls[0], _body(sample), format="json").status_code == 404
    assert _state() == before


def test_share_links_only_for_finished_reports_and_within_bounds(sam_api, sample, sam) -> None:  # type: ignore[no-untyped-def]
    report = BenchmarkReport.objects.create(
        organization=sample.organization,
        name="queued report",
        traffic_sample=sample,
        sample_name=sample.name,
        peak_rps=3.0,
        load_multipliers=[1.0],
        duration_s=10,
        created_by=sam,
    )
    links = reverse("api:benchmark_share_links", args=[report.id])
    before = _state()
    for body in ({"days": 7}, {"days": 0}, {"days": 31}, {"days": "soon"}):
        refused = sam_api.post(links, body, format="json")
        assert refused.status_code == 400 and "days" in refused.json(), body
    assert _state() == before
    result = sam_api.get(reverse("api:benchmark_report_result", args=[report.id]))
    assert result.status_code == 200 and result.json()["finished"] is False and result.json()["levels"] == []
    # Revoking a link of another report through this report's address is a 404.
    other = BenchmarkReport.objects.create(
        organization=sample.organization,
        name="finished",
        traffic_sample=sample,
        sample_name=sample.name,
        peak_rps=3.0,
        load_multipliers=[1.0],
        duration_s=10,
        status=BenchmarkReport.Status.SUCCEEDED,
        created_by=sam,
    )
    link, _secret = services.benchmark_share_create(actor=sam, report=other, days=3)
    wrong = sam_api.delete(reverse("api:benchmark_share_link_detail", args=[report.id, link.id]))
    assert wrong.status_code == 404
    link.refresh_from_db()
    assert link.revoked_at is None
