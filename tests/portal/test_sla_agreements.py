"""SLA as a two-party agreement measured at the edge: the provider proposes terms derived from the
tuning job, the customer signs, either side's change is a new version; a customer cannot edit
credit terms nor countersign its own proposal (403, audited); the measuring point's batches are
validated whole; a closed month is judged from the request records exactly and its credit goes
to Stripe once, as a negative invoice item (the loopback Stripe stand-in)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.test import Client
from django.urls import reverse

from compliance.models import AuditEvent
from portal.accounts.models import Organization, User
from portal.billing import services as billing_services
from portal.billing.models import BillingAccount, InvoiceCredit
from portal.endpoints.models import Endpoint, MetricSnapshot
from portal.sla import selectors, services
from portal.sla.models import EdgeCoverage, EdgeRequest, SLAAgreement, SLAPeriod
from tests.conftest import PASSWORD
from tests.portal.billing import FakeStripe, subscribe
from tests.portal.sla import TIERS, make_endpoint

pytestmark = pytest.mark.django_db

INGEST_TOKEN = "edge-token-for-tests"


@pytest.fixture
def provider(db: Any) -> User:
    return User.objects.create_user(
        email="provider@tailguard.test", password=PASSWORD, is_staff=True, staff_role="platform_admin"
    )


@pytest.fixture
def provider_client(provider: User) -> Client:
    client = Client()
    client.force_login(provider)
    return client


@pytest.fixture
def endpoint(alice: User, alice_org: Organization) -> Endpoint:
    return make_endpoint(alice_org, alice)


def _provider_terms(**overrides: Any) -> dict[str, str]:
    terms = {
        "ttft_p50_ms": "600",
        "ttft_p95_ms": "1500",
        "availability_pct": "99.9",
        "peak_rps": "4",
        "interval_s": "300",
        "credit_tiers": json.dumps(TIERS),
        "monthly_fee_cents": "200000",
        "currency": "usd",
        "min_coverage_pct": "0",
    }
    return {**terms, **overrides}


def _state(endpoint: Endpoint) -> list[tuple[int, str, Any]]:
    return list(
        SLAAgreement.objects.filter(endpoint=endpoint)
        .order_by("version")
        .values_list("version", "status", "credit_tiers")
    )


def test_provider_proposes_from_the_job_customer_signs_and_changes_are_versions(
    endpoint: Endpoint, provider: User, provider_client: Client, alice_client: Client
) -> None:
    derived = services.sla_terms_derive(endpoint=endpoint)
    assert (derived["ttft_p50_ms"], derived["ttft_p95_ms"], derived["peak_rps"]) == (600.0, 1500.0, 4.0)
    page = provider_client.get(reverse("sla:endpoint", args=[endpoint.pk]))
    assert page.status_code == 200 and b'name="ttft_p50_ms" value="600.0"' in page.content
    response = provider_client.post(reverse("sla:propose", args=[endpoint.pk]), _provider_terms())
    assert response.status_code == 302
    v1 = SLAAgreement.objects.get(endpoint=endpoint)
    assert v1.status == "proposed" and v1.provider_signed_by == provider and v1.customer_signed_at is None
    assert v1.credit_tiers == TIERS and v1.peak_rps == 4.0
    # The customer sees the proposal and signs it.
    assert b"Sign version 1" in alice_client.get(reverse("sla:endpoint", args=[endpoint.pk])).content
    assert alice_client.post(reverse("sla:sign", args=[v1.pk])).status_code == 302
    v1.refresh_from_db()
    assert v1.status == "in_force" and v1.customer_signed_by.email == "alice@acme.test" and v1.in_force_from
    # The provider changes a target: version 2, in force once Alice signs; version 1 superseded.
    provider_client.post(reverse("sla:propose", args=[endpoint.pk]), _provider_terms(ttft_p50_ms="500"))
    v2 = SLAAgreement.objects.get(endpoint=endpoint, version=2)
    alice_client.post(reverse("sla:sign", args=[v2.pk]))
    assert [(v, s) for v, s, _ in _state(endpoint)] == [(1, "superseded"), (2, "in_force")]
    v1.refresh_from_db()
    assert v1.in_force_until is not None
    # The provider's console lists it; to a customer the console does not exist.
    console = provider_client.get(reverse("sla:console")).content.decode()
    assert "voice agent" in console and "v2 since" in console
    assert alice_client.get(reverse("sla:console")).status_code == 404
    actions = list(
        AuditEvent.objects.filter(action__startswith="sla.agreement.")
        .order_by("id")
        .values_list("action", "data")
    )
    assert [(a, d["version"], d["side"]) for a, d in actions] == [
        ("sla.agreement.propose", 1, "provider"),
        ("sla.agreement.sign", 1, "customer"),
        ("sla.agreement.propose", 2, "provider"),
        ("sla.agreement.sign", 2, "customer"),
    ]


def test_customer_cannot_edit_credit_terms_or_countersign_its_own_proposal(
    endpoint: Endpoint,
    provider: User,
    alice: User,
    alice_client: Client,
    bob_client: Client,
    charlie_client: Client,
) -> None:
    v1 = services.sla_agreement_propose(
        actor=provider,
        endpoint=endpoint,
        terms=services.sla_terms_derive(endpoint=endpoint) | {"credit_tiers": TIERS},
    )
    services.sla_agreement_sign(actor=alice, agreement=v1)
    before = _state(endpoint)
    # Alice tries to give herself better credits: 403, audited, nothing changed.
    response = alice_client.post(
        reverse("sla:propose", args=[endpoint.pk]),
        _provider_terms(credit_tiers=json.dumps([{"below_pct": 99.99, "credit_pct": 100}])),
    )
    assert response.status_code == 403
    assert _state(endpoint) == before
    refused = AuditEvent.objects.get(action="sla.refused.credit_terms")
    assert refused.actor_id == alice.pk and "credit_tiers" in refused.data["reason"]
    # Alice may propose other targets; the provider's credit terms are carried over.
    alice_client.post(
        reverse("sla:propose", args=[endpoint.pk]),
        {"ttft_p50_ms": "450", "peak_rps": "4", "interval_s": "300"},
    )
    v2 = SLAAgreement.objects.get(endpoint=endpoint, version=2)
    assert (v2.proposed_by_side, v2.customer_signed_by, v2.credit_tiers) == (
        "customer",
        alice,
        v1.credit_tiers,
    )
    # ...but not countersign her own proposal.
    assert alice_client.post(reverse("sla:sign", args=[v2.pk])).status_code == 403
    assert AuditEvent.objects.filter(action="sla.refused.countersign", actor_id=alice.pk).count() == 1
    # Bob (viewer) cannot sign; Charlie (another organization) does not see it at all.
    assert bob_client.post(reverse("sla:sign", args=[v2.pk])).status_code == 403
    assert charlie_client.post(reverse("sla:sign", args=[v2.pk])).status_code == 404
    assert charlie_client.get(reverse("sla:endpoint", args=[endpoint.pk])).status_code == 404
    v2.refresh_from_db()
    assert v2.status == "proposed" and v2.provider_signed_at is None
    services.sla_agreement_sign(actor=provider, agreement=v2)
    assert [s for _, s, _ in _state(endpoint)] == ["superseded", "in_force"]


def _batch(start: datetime, seconds: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"covered_from": start.timestamp(), "covered_to": start.timestamp() + seconds, "requests": rows}


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (lambda b: b["requests"][1].update(ttft_ms=-5), "requests[1].ttft_ms"),
        (lambda b: b["requests"][2].update(status=700), "requests[2].status"),
        (
            lambda b: b["requests"][0].update(arrived_at=b["covered_to"] + 1),
            "requests[0].arrived_at is outside",
        ),
        (
            lambda b: b["requests"][0].update(arrived_at="yesterday"),
            "requests[0].arrived_at must be Unix seconds",
        ),
        (lambda b: b["requests"][0].pop("id"), "requests[0].id"),
        (lambda b: b.update(covered_to=b["covered_from"] + 7200), "at most an hour"),
        (lambda b: b.update(covered_from=1e300), "covered_from is not a time"),
        (lambda b: b.update(requests="all of them"), "requests must be a list"),
        (lambda b: b.update(endpoint="not-an-id"), '"endpoint" must be its id'),
    ],
)
def test_a_bad_edge_batch_is_a_400_naming_the_row_and_stores_nothing(
    settings: Any, endpoint: Endpoint, mutate: Any, says: str
) -> None:
    settings.SLA_EDGE_INGEST_TOKEN = INGEST_TOKEN
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    batch = _batch(
        start,
        600,
        [
            {"id": f"r{i}", "arrived_at": start.timestamp() + i, "ttft_ms": 100.0, "status": 200}
            for i in range(3)
        ],
    )
    batch["endpoint"] = str(endpoint.pk)
    mutate(batch)
    response = Client().post(
        reverse("sla:edge_ingest"),
        json.dumps(batch),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {INGEST_TOKEN}",
    )
    assert response.status_code == 400 and says in response.json()["error"]
    assert not EdgeRequest.objects.exists() and not EdgeCoverage.objects.exists()


def test_edge_ingest_needs_the_token_and_a_batch_sent_twice_is_stored_once(
    settings: Any, endpoint: Endpoint
) -> None:
    url = reverse("sla:edge_ingest")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    body = json.dumps(
        _batch(start, 60, [{"id": "a", "arrived_at": start.timestamp(), "ttft_ms": 80.5, "status": 200}])
        | {"endpoint": str(endpoint.pk)}
    )
    assert Client().post(url, body, content_type="application/json").status_code == 404  # ingest off
    settings.SLA_EDGE_INGEST_TOKEN = INGEST_TOKEN
    assert (
        Client()
        .post(url, body, content_type="application/json", HTTP_AUTHORIZATION="Bearer nope")
        .status_code
        == 401
    )
    for expected in (1, 0):
        response = Client().post(
            url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {INGEST_TOKEN}"
        )
        assert response.json() == {"received": 1, "stored": expected}
    assert EdgeRequest.objects.get().ttft_ms == 80.5
    missing = json.loads(body) | {"endpoint": "00000000-0000-0000-0000-000000000000"}
    response = Client().post(
        url, json.dumps(missing), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {INGEST_TOKEN}"
    )
    assert response.status_code == 404 and "No endpoint" in response.json()["error"]


def test_a_closed_month_is_judged_exactly_at_the_edge_and_credited_once_on_the_invoice(
    settings: Any,
    endpoint: Endpoint,
    provider: User,
    alice: User,
    alice_org: Organization,
    alice_client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    stripe = FakeStripe()
    try:
        from tests.portal.billing import enable_billing

        enable_billing(settings, stripe.url)
        subscribe(alice_org)
        v1 = services.sla_agreement_propose(
            actor=provider,
            endpoint=endpoint,
            terms={k: v for k, v in _provider_terms().items()} | {"credit_tiers": TIERS},
        )
        services.sla_agreement_sign(actor=alice, agreement=v1)
        SLAAgreement.objects.filter(pk=v1.pk).update(in_force_from=datetime(2026, 10, 1, tzinfo=UTC))
        # Two covered hours of October at 1 req/s; in 6 of the 24 intervals p50 is slow.
        rng = np.random.default_rng(7)
        day = datetime(2026, 10, 14, 9, tzinfo=UTC)
        log: list[tuple[float, float]] = []
        for hour in range(2):
            base = day + timedelta(hours=hour)
            rows = []
            for i in range(3600):
                at = base.timestamp() + i * 1.0
                slow = hour == 0 and i < 1800  # the first half hour
                ttft = float(rng.uniform(650, 900) if slow else rng.uniform(100, 400))
                rows.append({"id": f"{hour}-{i}", "arrived_at": at, "ttft_ms": ttft, "status": 200})
                log.append((at, ttft))
            services.edge_batch_record(
                endpoint=endpoint, payload=_batch(base, 3600, rows), now=day + timedelta(days=1)
            )
        # The engine's histogram view of the same time, for comparison on the page.
        for minute in range(0, 120, 1):
            MetricSnapshot.objects.create(
                organization=alice_org,
                endpoint=endpoint,
                taken_at=day + timedelta(minutes=minute),
                ttft_p50_ms=550.0,
            )
        # Every interval's percentile equals numpy's over the request log.
        for interval in selectors.edge_intervals(agreement=v1, start=day, end=day + timedelta(hours=2)):
            inside = [t for at, t in log if interval.start.timestamp() <= at < interval.end.timestamp()]
            assert interval.ttft_p50_ms == float(np.percentile(inside, 50))
            assert interval.ttft_p95_ms == float(np.percentile(inside, 95))
        now = datetime(2026, 11, 2, tzinfo=UTC)
        with django_capture_on_commit_callbacks(execute=True):
            assert services.sla_periods_close(now=now) == 1
            assert services.sla_periods_close(now=now) == 0
        period = SLAPeriod.objects.get(endpoint=endpoint)
        p50 = period.result["edge"]["criteria"]["ttft_p50_ms"]
        assert p50["breached_s"] == 6 * 300 and p50["compliant_s"] == 18 * 300
        assert period.result["edge"]["compliance_pct"] == pytest.approx(75.0)
        assert period.credit_pct == 25.0 and period.credit_cents == 50_000
        assert (
            period.result["engine"]["metric"] == "ttft_p50_ms" and period.result["engine"]["status"] == "met"
        )
        credit = InvoiceCredit.objects.get()
        assert (credit.key, credit.status, credit.amount_cents) == (
            f"sla:{endpoint.pk}:2026-10",
            "sent",
            50_000,
        )
        (call,) = stripe.calls("/v1/invoiceitems")
        assert call["params"]["amount"] == "-50000" and call["params"]["customer"] == "cus_test_acme-voice"
        assert call["headers"]["idempotency-key"] == f"tg:credit:sla:{endpoint.pk}:2026-10"
        # The scheduled billing run does not send it again.
        billing_services.usage_report_run(now=now)
        assert len(stripe.calls("/v1/invoiceitems")) == 1
        assert AuditEvent.objects.filter(action="billing.credit.sent").count() == 1
        assert AuditEvent.objects.get(action="sla.period.close").data["credit_cents"] == 50_000
        # The customer sees the credit on the billing page and both figures on the SLA page.
        billing_page = alice_client.get(reverse("billing:overview")).content.decode()
        assert "SLA credit 25% for voice agent, 2026-10" in billing_page and "500.00 USD" in billing_page
        sla_page = alice_client.get(
            reverse("sla:endpoint", args=[endpoint.pk]) + "?month=2026-10"
        ).content.decode()
        assert "Edge: ttft_p50_ms" in sla_page and "Engine histogram" in sla_page
        assert BillingAccount.objects.get(organization=alice_org).stripe_customer_id == "cus_test_acme-voice"
        # Long after the month closed its request records go; the frozen period stays.
        settings.SLA_EDGE_RETENTION_DAYS = 62
        assert services.edge_records_purge(now=datetime(2026, 12, 20, tzinfo=UTC)) == 7200 + 2
        assert not EdgeRequest.objects.exists() and SLAPeriod.objects.filter(endpoint=endpoint).exists()
    finally:
        stripe.close()


def test_the_api_lists_signs_refuses_credit_edits_reports_and_packs(
    endpoint: Endpoint, provider: User, alice: User, bob: User, charlie: User
) -> None:
    from rest_framework.test import APIClient

    def api(user: User) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client

    v1 = services.sla_agreement_propose(
        actor=provider,
        endpoint=endpoint,
        terms=services.sla_terms_derive(endpoint=endpoint) | {"credit_tiers": TIERS},
    )
    listed = api(alice).get("/api/v1/sla/agreements/").json()["results"]
    assert [(a["version"], a["status"], a["provider_signed_by"]) for a in listed] == [
        (1, "proposed", "provider@tailguard.test")
    ]
    assert api(charlie).get("/api/v1/sla/agreements/").json()["results"] == []
    sign = f"/api/v1/sla/agreements/{v1.pk}/sign/"
    assert api(bob).post(sign).status_code == 403
    assert api(charlie).post(sign).status_code == 404
    signed = api(alice).post(sign)
    assert signed.status_code == 200 and signed.json()["customer_signed_by"] == "alice@acme.test"
    proposals = f"/api/v1/sla/endpoints/{endpoint.pk}/proposals/"
    refused = api(alice).post(
        proposals, {"peak_rps": 4, "credit_tiers": [{"below_pct": 99.9, "credit_pct": 100}]}, format="json"
    )
    assert refused.status_code == 403 and "provider's terms" in refused.json()["detail"]
    assert AuditEvent.objects.filter(action="sla.refused.credit_terms").count() == 1
    created = api(alice).post(proposals, {"ttft_p50_ms": 450, "peak_rps": 4}, format="json")
    assert created.status_code == 201 and created.json()["credit_tiers"] == TIERS
    report = api(bob).get(f"/api/v1/sla/endpoints/{endpoint.pk}/report/").json()
    assert report["agreement"]["version"] == 1 and set(report["report"]["edge"]["criteria"]) == {
        "ttft_p50_ms",
        "ttft_p95_ms",
        "availability_pct",
    }
    assert api(charlie).get(f"/api/v1/sla/endpoints/{endpoint.pk}/report/").status_code == 404
    pack = api(alice).get("/api/v1/compliance/evidence-pack/", {"month": "2026-10"})
    assert pack.status_code == 200 and pack["Content-Type"] == "application/zip"
    assert api(bob).get("/api/v1/compliance/evidence-pack/").status_code == 403


def test_settled_summaries_give_the_same_report_and_a_late_batch_is_judged_again(
    endpoint: Endpoint, provider: User, alice: User
) -> None:
    v1 = services.sla_agreement_propose(
        actor=provider,
        endpoint=endpoint,
        terms=services.sla_terms_derive(endpoint=endpoint) | {"credit_tiers": TIERS, "interval_s": 3600},
    )
    services.sla_agreement_sign(actor=alice, agreement=v1)
    SLAAgreement.objects.filter(pk=v1.pk).update(in_force_from=datetime(2026, 10, 1, tzinfo=UTC))
    v1.refresh_from_db()
    base = datetime(2026, 10, 20, 12, tzinfo=UTC)
    rows = [
        {
            "id": f"a{i}",
            "arrived_at": base.timestamp() + i * 2,
            "ttft_ms": 300.0 + (i % 50) * 10,
            "status": 200,
        }
        for i in range(1800)
    ]
    services.edge_batch_record(
        endpoint=endpoint, payload=_batch(base, 3600, rows), now=base + timedelta(hours=2)
    )
    start, end = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    now = datetime(2026, 11, 1, 0, 30, tzinfo=UTC)
    from_records = selectors.sla_window(agreement=v1, window_start=start, window_end=end, now=now)
    # October's 744 hours (November's first hour has not ended).
    assert services.edge_intervals_settle(now=now) == 744
    assert services.edge_intervals_settle(now=now) == 0
    assert selectors.sla_window(agreement=v1, window_start=start, window_end=end, now=now) == from_records
    # A late batch for an hour already summarised (the measuring point was cut off): judged again.
    late = base + timedelta(hours=1)
    slow = [
        {"id": f"b{i}", "arrived_at": late.timestamp() + i * 2, "ttft_ms": 5000.0, "status": 200}
        for i in range(1800)
    ]
    services.edge_batch_record(endpoint=endpoint, payload=_batch(late, 3600, slow), now=now)
    after = selectors.sla_window(agreement=v1, window_start=start, window_end=end, now=now)
    assert after["edge"]["criteria"]["ttft_p50_ms"]["breached_s"] == 3600
    assert after["edge"]["criteria"]["ttft_p50_ms"]["compliant_s"] == 3600
    # The summary the batch overlaps was dropped and is stored again.
    assert services.edge_intervals_settle(now=now) == 1
    assert selectors.sla_window(agreement=v1, window_start=start, window_end=end, now=now) == after
