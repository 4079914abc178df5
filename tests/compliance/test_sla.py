"""SLA computation on hand-made metric series with known answers, then terms, API and closing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from compliance import sla
from portal.sla import services as sla_services

T0 = datetime(2026, 11, 1, tzinfo=UTC)
TIERS = [sla.CreditTier(99.0, 10.0), sla.CreditTier(95.0, 25.0)]


def _series(start: datetime, values: list[float | None], step_s: int = 60, gaps: set[int] = frozenset()):  # type: ignore[no-untyped-def,assignment]
    """A snapshot at `start`, then one per step measuring the step before it."""
    out = [sla.Measurement(start, None, True)]
    for i, value in enumerate(values, start=1):
        out.append(sla.Measurement(start + timedelta(seconds=i * step_s), value, i in gaps))
    return out


def test_compliant_breached_and_idle_time_with_credit() -> None:
    values = [500.0] * 30 + [850.0] * 10 + [900.0] * 5 + [None] * 15
    report = sla.evaluate(
        _series(T0, values),
        target_ms=800,
        window_start=T0,
        window_end=datetime(2026, 12, 1, tzinfo=UTC),
        now=T0 + timedelta(hours=1),
        tiers=TIERS,
    )
    assert (report.compliant_s, report.breached_s, report.idle_s, report.gap_s) == (1800, 900, 900, 0)
    assert report.compliance_pct == pytest.approx(100 * 1800 / 2700)
    assert report.coverage_pct == 100
    assert report.credit_pct == 25 and report.credit_basis == "measured"
    assert report.status == "breached"
    (breach,) = report.breaches
    assert (breach.start, breach.end, breach.worst_ms) == (
        T0 + timedelta(minutes=30),
        T0 + timedelta(minutes=45),
        900,
    )
    assert report.judged_until == T0 + timedelta(hours=1)


def test_gaps_are_gaps_not_compliance() -> None:
    # 60 one-minute intervals; minutes 11-20 are gap snapshots; minutes 41-50 have no snapshot
    # at all (a 11-minute hole, longer than the 2-minute limit).
    values: list[float | None] = [100.0] * 60
    series = [m for i, m in enumerate(_series(T0, values, gaps=set(range(11, 21)))) if not 41 <= i <= 50]
    report = sla.evaluate(
        series,
        target_ms=800,
        window_start=T0,
        window_end=T0 + timedelta(hours=2),
        now=T0 + timedelta(hours=2),
        tiers=TIERS,
        max_interval_s=120,
    )
    # Measured: 60 min - 10 (gap snapshots) - 11 (hole) = 39 min; the second hour has no data.
    assert report.compliant_s == 39 * 60 and report.breached_s == 0
    assert report.gap_s == (10 + 11 + 60) * 60
    assert report.compliance_pct == 100  # of measured time ...
    assert report.coverage_pct == pytest.approx(100 * 39 / 120)
    # ... but coverage is under 90 %, so gaps count against the provider for the credit.
    assert report.compliance_pct_gaps_as_breach == pytest.approx(100 * 39 / 120)
    assert report.credit_pct == 25 and report.credit_basis.startswith("gaps counted")
    assert [(g.start - T0, g.end - T0) for g in report.gaps] == [
        (timedelta(minutes=10), timedelta(minutes=20)),
        (timedelta(minutes=40), timedelta(minutes=51)),
        (timedelta(minutes=60), timedelta(minutes=120)),
    ]


def test_month_boundary_in_utc_splits_intervals() -> None:
    oct_start, nov_start = datetime(2026, 10, 1, tzinfo=UTC), T0
    # Snapshots every 60 s from 23:59:30 on Oct 31 (UTC): the first interval straddles midnight.
    series = _series(nov_start - timedelta(seconds=30), [900.0] + [100.0] * 9)
    october = sla.evaluate(
        series, target_ms=800, window_start=oct_start, window_end=nov_start, now=nov_start + timedelta(days=1)
    )
    assert october.judged_until == nov_start
    assert october.breached_s == 30 and october.compliant_s == 0
    assert october.gap_s == (nov_start - oct_start).total_seconds() - 30
    november = sla.evaluate(
        series,
        target_ms=800,
        window_start=nov_start,
        window_end=datetime(2026, 12, 1, tzinfo=UTC),
        now=nov_start + timedelta(minutes=10),
    )
    assert november.breached_s == 30 and november.compliant_s == 9 * 60
    # 00:09:30 to 00:10 is the interval still running: not judged yet, so not a gap either.
    assert november.gap_s == 0 and november.judged_until == nov_start + timedelta(minutes=9, seconds=30)
    # Month windows are UTC calendar months whatever the caller's time zone.
    eastern = timezone(timedelta(hours=-5))
    assert sla.month_window(datetime(2026, 11, 30, 22, 0, tzinfo=eastern)) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert sla.month_window(datetime(2026, 12, 31, 23, 59, tzinfo=UTC))[1] == datetime(2027, 1, 1, tzinfo=UTC)


def test_no_data_is_no_data_and_credit_thresholds_are_strict() -> None:
    report = sla.evaluate(
        [],
        target_ms=800,
        window_start=T0,
        window_end=T0 + timedelta(days=1),
        now=T0 + timedelta(days=2),
        tiers=TIERS,
    )
    assert report.status == "no data" and report.compliance_pct is None
    assert report.gap_s == 86400 and report.coverage_pct == 0
    assert sla.credit_for(99.0, TIERS) == 0  # exactly at the threshold owes nothing
    assert sla.credit_for(98.999, TIERS) == 10
    assert sla.credit_for(50.0, TIERS) == 25
    assert sla.credit_for(None, TIERS) == 0


def _random_series(seed: int, count: int) -> list[sla.Measurement]:
    """Irregular snapshots (5 s to 4 min apart), some gaps, some idle, values around the target."""
    import random

    rng = random.Random(seed)
    moment = T0 - timedelta(seconds=rng.randint(0, 200))
    out = []
    for _ in range(count):
        moment += timedelta(seconds=rng.choice([5, 15, 15, 15, 60, 130, 240]))
        kind = rng.random()
        value = None if kind < 0.1 else rng.uniform(600, 1000)
        out.append(sla.Measurement(moment, value, kind > 0.95))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_settled_beginning_gives_the_same_report(seed: int) -> None:
    """Judging [start, cut) once and then only what follows is the one-pass report exactly,
    for any cut, given only the snapshots each part can see (the selector reads them so)."""
    import random

    rng = random.Random(1000 + seed)
    series = _random_series(seed, rng.randint(2, 400))
    max_interval_s = 120.0
    margin = sla.lookaround(max_interval_s)
    end = T0 + timedelta(days=1)
    now = series[-1].taken_at + timedelta(seconds=rng.choice([0, 10, 100, 500]))
    common = {"target_ms": 800.0, "window_start": T0, "window_end": end, "max_interval_s": max_interval_s}
    whole = sla.evaluate(series, now=now, tiers=TIERS, **common)  # type: ignore[arg-type]
    for _ in range(5):
        cut = T0 + (now - 2 * margin - T0) * rng.random()
        if cut <= T0:
            continue
        head = [m for m in series if T0 - margin <= m.taken_at < cut + margin]
        tail = [m for m in series if cut - margin <= m.taken_at < end + margin]
        settled = sla.settle(head, target_ms=800.0, window_start=T0, until=cut, max_interval_s=max_interval_s)
        assert sla.evaluate(tail, now=now, tiers=TIERS, settled=settled, **common) == whole  # type: ignore[arg-type]


# --- Terms, stored snapshots, API, closing windows, the console -------------------------------


def _endpoint(org, name: str = "voice", port: int = 41001):  # type: ignore[no-untyped-def]
    from portal.endpoints.models import Endpoint
    from portal.jobs.models import ServedModel

    model = ServedModel.objects.create(organization=org, name=f"m-{name}", path="/models/x")
    return Endpoint.objects.create(
        organization=org,
        name=name,
        served_model=model,
        config={},
        port=port,
        api_key_prefix="x",
        api_key_hash="y",
        status="healthy",
    )


def _snapshots(endpoint, start: datetime, values: list[float | None]) -> None:  # type: ignore[no-untyped-def]
    from portal.endpoints.models import MetricSnapshot

    MetricSnapshot.objects.create(
        organization=endpoint.organization, endpoint=endpoint, taken_at=start, gap=True
    )
    for i, value in enumerate(values, start=1):
        MetricSnapshot.objects.create(
            organization=endpoint.organization,
            endpoint=endpoint,
            taken_at=start + timedelta(minutes=i),
            gap=False,
            ttft_p50_ms=value,
            ttft_p95_ms=None if value is None else value * 2,
        )


def _api(user):  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


TERMS = {"metric": "ttft_p50_ms", "target_ms": 800}
TIER_BODY = [{"below_pct": 95, "credit_pct": 25}, {"below_pct": 99, "credit_pct": 10}]


@pytest.mark.django_db
def test_terms_and_report_through_the_api(alice, alice_org, bob, charlie) -> None:  # type: ignore[no-untyped-def]
    from compliance.models import AuditEvent
    from portal.endpoints.models import SLATerms

    endpoint = _endpoint(alice_org)
    start = datetime(2026, 10, 31, 23, 0, tzinfo=UTC)
    # October's last hour: 50 min at target, 10 min breached.
    _snapshots(endpoint, start, [500.0] * 50 + [1000.0] * 10 + [500.0] * 30)
    url = f"/api/v1/compliance/endpoints/{endpoint.id}/sla/"
    assert _api(alice).get(url).json() == {"terms": None, "report": None, "frozen": False}

    # Bob (viewer) cannot set terms; Charlie cannot see the endpoint at all.
    assert _api(bob).put(url, TERMS, format="json").status_code == 403
    assert _api(charlie).get(url).status_code == 404
    assert _api(charlie).put(url, TERMS, format="json").status_code == 404
    assert not SLATerms.objects.exists()

    # Credits are the provider's terms (the signed agreement): the customer's admin cannot set them
    # on its own monitoring targets; the attempt is refused and audited, and nothing is stored.
    response = _api(alice).put(url, TERMS | {"credit_tiers": TIER_BODY}, format="json")
    assert response.status_code == 403 and "provider's terms" in response.json()["detail"]
    refused = AuditEvent.objects.get(action="sla.refused.credit_tiers", organization=alice_org)
    assert refused.actor_id == alice.id and refused.data["endpoint"] == str(endpoint.id)
    assert not SLATerms.objects.exists()

    response = _api(alice).put(url, TERMS, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["terms"]["credit_tiers"] == []
    assert AuditEvent.objects.filter(action="sla.terms_set", organization=alice_org).count() == 1
    report = _api(alice).get(url, {"month": "2026-10"}).json()["report"]
    assert report["window_start"] == "2026-10-01T00:00:00+00:00"
    assert (report["compliant_s"], report["breached_s"]) == (3000, 600)
    assert report["source"] == "engine"
    assert report["credit_basis"].startswith("gaps counted")  # one hour of a month is measured
    assert len(report["breaches"]) == 1 and report["breaches"][0]["worst_ms"] == 1000
    november = _api(alice).get(url, {"month": "2026-11"}).json()["report"]
    assert november["compliant_s"] == 30 * 60 and november["breached_s"] == 0
    assert _api(alice).get(url, {"month": "11/2026"}).status_code == 400


@pytest.mark.django_db
def test_closed_windows_are_frozen_once(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    from compliance.models import AuditEvent
    from portal.endpoints.models import Endpoint, MetricSnapshot, SLAWindowReport
    from portal.sla import services as sla_services

    endpoint = _endpoint(alice_org)
    Endpoint.objects.filter(id=endpoint.id).update(created_at=datetime(2026, 10, 1, tzinfo=UTC))
    _snapshots(endpoint, datetime(2026, 10, 31, 23, 0, tzinfo=UTC), [500.0] * 60)
    sla_services.sla_terms_set(actor=alice, endpoint=endpoint, **TERMS)
    now = datetime(2026, 11, 1, 1, 0, tzinfo=UTC)
    assert sla_services.sla_windows_close(now=now) == 1
    assert sla_services.sla_windows_close(now=now) == 0
    stored = SLAWindowReport.objects.get()
    assert stored.window_start == datetime(2026, 10, 1, tzinfo=UTC)
    assert stored.result["compliant_s"] == 3600
    # Snapshots expire later; the frozen result stays what the API returns.
    MetricSnapshot.objects.all().delete()
    body = _api(alice).get(f"/api/v1/compliance/endpoints/{endpoint.id}/sla/", {"month": "2026-10"}).json()
    assert body["frozen"] is True and body["report"]["compliant_s"] == 3600
    assert AuditEvent.objects.filter(action="sla.window_close").count() == 1


@pytest.mark.django_db
def test_client_observed_terms_without_client_data_show_gaps(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    from portal.endpoints import selectors

    endpoint = _endpoint(alice_org)
    _snapshots(endpoint, datetime(2026, 11, 1, tzinfo=UTC), [500.0] * 60)
    terms = sla_services.sla_terms_set(actor=alice, endpoint=endpoint, source="client", **TERMS)
    report = selectors.sla_report(terms=terms, now=datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    assert report.status == "no data" and report.gap_s == 3600 and report.compliance_pct is None


@pytest.mark.django_db
def test_the_compliance_pages_terms_form(alice, alice_org, alice_client, bob_client, charlie_client) -> None:  # type: ignore[no-untyped-def]
    """The compliance page lists each endpoint with its terms and this month's result; its form
    (handled by portal.sla, at `compliance:sla_terms`) sets them for an admin, is refused to a
    lesser role, answers 404 for another tenant's endpoint, and shows the page again on bad input."""
    from django.urls import reverse

    from compliance.models import AuditEvent
    from portal.endpoints.models import SLATerms

    endpoint = _endpoint(alice_org, name="voice-agent")
    _snapshots(endpoint, datetime.now(UTC) - timedelta(minutes=30), [500.0] * 20)
    url = reverse("compliance:sla_terms")
    assert url == "/compliance/sla/"
    body = {"endpoint": str(endpoint.id), "metric": "ttft_p50_ms", "target_ms": "800"}

    assert charlie_client.post(url, body).status_code == 404
    assert bob_client.post(url, body).status_code == 403
    assert not SLATerms.objects.exists()
    bad = alice_client.post(url, body | {"target_ms": "0"})
    assert bad.status_code == 400 and "SLAs (this month, UTC)" in bad.content.decode()
    assert not SLATerms.objects.exists()

    response = alice_client.post(url, body)
    assert response.status_code == 302 and response["Location"] == reverse("compliance:overview")
    terms = SLATerms.objects.get(endpoint=endpoint)
    assert (terms.metric, terms.target_ms) == ("ttft_p50_ms", 800.0)
    assert AuditEvent.objects.filter(action="sla.terms_set", organization=alice_org).count() == 1
    page = alice_client.get(reverse("compliance:overview")).content.decode()
    assert "voice-agent" in page and "TTFT p50 &le; 800 ms" in page


@pytest.mark.django_db
def test_console_is_for_platform_admins_and_audited(alice, alice_org, alice_client, charlie) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client
    from django.urls import reverse

    from compliance.models import AuditEvent
    from portal.accounts.models import User
    from tests.conftest import PASSWORD

    endpoint = _endpoint(alice_org, name="voice-agent")
    sla_services.sla_terms_set(actor=alice, endpoint=endpoint, **TERMS)
    url = reverse("compliance:console")
    assert alice_client.get(url).status_code == 404
    admin = User.objects.create_user(
        email="admin@tailguard.test", password=PASSWORD, staff_role="platform_admin"
    )
    client = Client()
    client.force_login(admin)
    page = client.get(url).content.decode()
    assert "Acme Voice" in page and "Other Corp" in page and "voice-agent" in page
    filtered = client.get(url, {"q": "other"}).content.decode()
    assert "Other Corp" in filtered and "Acme Voice" not in filtered
    assert "Acme Voice" not in client.get(url, {"baa": "yes"}).content.decode()
    event = (
        AuditEvent.objects.filter(action="staff.access", actor_label="admin@tailguard.test")
        .order_by("seq")
        .last()
    )
    assert event.data == {"what": "compliance console", "baa": "yes"}


@pytest.mark.django_db
def test_month_to_date_report_reuses_its_settled_beginning_until_snapshots_change(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    from django.conf import settings as django_settings

    from portal.endpoints import selectors
    from portal.endpoints.models import MetricSnapshot

    selectors.settled_clear()
    endpoint = _endpoint(alice_org)
    # Three hours of November at one snapshot a minute: 500 ms except a breach in hour two.
    _snapshots(endpoint, T0, [500.0] * 70 + [1000.0] * 20 + [500.0] * 90)
    terms = sla_services.sla_terms_set(actor=alice, endpoint=endpoint, **TERMS)
    now = T0 + timedelta(hours=3)

    def one_pass():  # type: ignore[no-untyped-def]
        start, end = sla.month_window(now)
        return sla.evaluate(
            selectors._terms_measurements(terms, start, end),
            target_ms=terms.target_ms,
            window_start=start,
            window_end=end,
            now=now,
            tiers=[sla.CreditTier(float(t["below_pct"]), float(t["credit_pct"])) for t in terms.credit_tiers],
            max_interval_s=django_settings.COMPLIANCE_SLA_MAX_INTERVAL_S,
            min_coverage_pct=terms.min_coverage_pct,
        )

    first = selectors.sla_report(terms=terms, now=now)
    assert first == one_pass()
    assert len(selectors._settled) == 1  # the beginning was judged and kept
    assert first.breached_s == 20 * 60 and first.compliant_s == 160 * 60
    assert selectors.sla_report(terms=terms, now=now) == first
    assert len(selectors._settled) == 1  # ... and reused

    # A snapshot written into the settled hours (a backfill) is seen: the beginning is judged again.
    MetricSnapshot.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        taken_at=T0 + timedelta(minutes=10, seconds=30),
        ttft_p50_ms=5000.0,
    )
    backfilled = selectors.sla_report(terms=terms, now=now)
    assert backfilled == one_pass() and backfilled.breached_s > first.breached_s
    assert len(selectors._settled) == 2
