"""Billing: usage arithmetic, Stripe calls through the real SDK against a loopback server,
idempotent usage reports, the past-due gate, billing off without keys, and tenant isolation."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts.models import Organization, User
from portal.billing import selectors, services
from portal.billing.models import (
    BillingAccount,
    Meter,
    SubscriptionStatus,
    UsageRecord,
    UsageReport,
    WebhookEvent,
)
from portal.billing.usage import (
    billable_minutes,
    hour_floor,
    idempotency_key,
    parse_month,
    split_by_hour,
)
from portal.jobs import services as job_services
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic.models import TrafficSample
from tests.portal.billing import (
    WEBHOOK_SECRET,
    FakeStripe,
    post_webhook,
    reported_usage,
    sign,
    subscribe,
    subscription_event,
    utc,
)

# The Stripe stand-in and helpers live in tests/portal/billing.py (shared by other modules).


# --- Pure usage arithmetic -----------------------------------------------------------------------


def test_split_by_hour_cuts_at_hour_day_and_month_boundaries() -> None:
    slices = split_by_hour(utc(2026, 1, 31, 22, 30), utc(2026, 2, 1, 1, 15))
    assert [(s.hour, s.duration_ms // 60_000) for s in slices] == [
        (utc(2026, 1, 31, 22), 30),
        (utc(2026, 1, 31, 23), 60),
        (utc(2026, 2, 1, 0), 60),
        (utc(2026, 2, 1, 1), 15),
    ]
    # Other time zones are converted, never misread: 10:50 at +02:00 is 08:50 UTC.
    from datetime import timezone as tz

    plus2 = tz(timedelta(hours=2))
    (first, second) = split_by_hour(
        datetime(2026, 3, 1, 10, 50, tzinfo=plus2), datetime(2026, 3, 1, 11, 5, tzinfo=plus2)
    )
    assert (first.hour, first.duration_ms, second.hour, second.duration_ms) == (
        utc(2026, 3, 1, 8),
        600_000,
        utc(2026, 3, 1, 9),
        300_000,
    )
    assert split_by_hour(utc(2026, 1, 1, 5), utc(2026, 1, 1, 5)) == []
    with pytest.raises(ValueError, match="naive"):
        split_by_hour(datetime(2026, 1, 1, 5), datetime(2026, 1, 1, 6))  # noqa: DTZ001
    with pytest.raises(ValueError, match="ends before"):
        split_by_hour(utc(2026, 1, 1, 6), utc(2026, 1, 1, 5))


def test_billable_minutes_round_per_bucket_halves_up() -> None:
    assert [billable_minutes(ms) for ms in (0, 29_999, 30_000, 89_999, 90_000, 3_600_000)] == [
        0,
        0,
        1,
        1,
        2,
        60,
    ]


def test_idempotency_key_is_derived_from_the_business_event() -> None:
    org = "3f2b0c1e-9a8d-4c7b-b6a5-0123456789ab"
    key = idempotency_key(
        organization_id=org,
        meter="endpoint_hours",
        dimension="h200",
        hour=utc(2026, 2, 1, 0, 42),
        sequence=0,
    )
    assert key == "tg:3f2b0c1e9a8d4c7bb6a50123456789ab:endpoint_hours:h200:20260201T00"
    assert key == idempotency_key(
        organization_id=org, meter="endpoint_hours", dimension="h200", hour=utc(2026, 2, 1), sequence=0
    )
    late = idempotency_key(
        organization_id=org, meter="endpoint_hours", dimension="h200", hour=utc(2026, 2, 1), sequence=1
    )
    assert late == key + ":1"
    longest = idempotency_key(
        organization_id=org, meter="endpoint_hours", dimension="x" * 32, hour=utc(2026, 2, 1), sequence=999
    )
    assert len(longest) <= 100
    assert parse_month("2026-02") == utc(2026, 2, 1)
    for bad in ("2026-13", "26-02", "feb"):
        with pytest.raises(ValueError):
            parse_month(bad)


# --- Recording and aggregation ------------------------------------------------------------------


@pytest.mark.django_db
def test_usage_aggregates_across_hour_and_month_boundaries_with_known_answers(
    alice_org: Organization,
) -> None:
    subscribe(alice_org, billed_from=utc(2026, 1, 1))
    # An H200 endpoint running 22:30 on 31 January to 01:15 on 1 February (UTC).
    stored = services.usage_record(
        organization=alice_org,
        meter=Meter.ENDPOINT_HOURS,
        dimension="H200",
        started_at=utc(2026, 1, 31, 22, 30),
        ended_at=utc(2026, 2, 1, 1, 15),
        source="endpoint:e1:20260131T2230",
    )
    assert stored == 4
    # Recording the same segment again stores nothing.
    assert (
        services.usage_record(
            organization=alice_org,
            meter=Meter.ENDPOINT_HOURS,
            dimension="h200",
            started_at=utc(2026, 1, 31, 22, 30),
            ended_at=utc(2026, 2, 1, 1, 15),
            source="endpoint:e1:20260131T2230",
        )
        == 0
    )
    # Two 40-second trials in one hour bill 1 minute (80 s rounded once), not 2.
    for n, minute in enumerate((0, 10)):
        services.usage_record(
            organization=alice_org,
            meter=Meter.TUNING_MINUTES,
            started_at=utc(2026, 1, 31, 23, minute),
            ended_at=utc(2026, 1, 31, 23, minute, 40),
            source=f"trial:t{n}",
        )
    # A trial across midnight at the month's end: 15 minutes in each month.
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=utc(2026, 1, 31, 23, 45),
        ended_at=utc(2026, 2, 1, 0, 15),
        source="trial:t2",
    )
    january = {
        (line.meter, line.dimension): line
        for line in selectors.usage_month(organization=alice_org, month=utc(2026, 1, 15))
    }
    february = {
        (line.meter, line.dimension): line
        for line in selectors.usage_month(organization=alice_org, month=utc(2026, 2, 1))
    }
    assert january["endpoint_hours", "h200"].billable_minutes == 90
    assert january["endpoint_hours", "h200"].display == "1.50 endpoint-hours"
    assert february["endpoint_hours", "h200"].billable_minutes == 75
    assert february["endpoint_hours", "h200"].display == "1.25 endpoint-hours"
    # January 23:00 bucket: 40 s + 40 s + 15 min = 16 min 20 s -> 16 minutes.
    assert january["tuning_minutes", ""].billable_minutes == 16
    assert january["tuning_minutes", ""].duration_ms == 80_000 + 15 * 60_000
    assert february["tuning_minutes", ""].billable_minutes == 15
    assert selectors.usage_month(organization=alice_org, month=utc(2026, 3, 1)) == []
    with pytest.raises(ValidationError):
        services.usage_record(
            organization=alice_org,
            meter=Meter.ENDPOINT_HOURS,
            dimension="bad hardware!",
            started_at=utc(2026, 1, 1),
            ended_at=utc(2026, 1, 1, 1),
            source="endpoint:x",
        )
    with pytest.raises(ValidationError):
        services.usage_record(
            organization=alice_org,
            meter="gpu_seconds",
            started_at=utc(2026, 1, 1),
            ended_at=utc(2026, 1, 1, 1),
            source="x",
        )


def _job(org: Organization, user: User) -> TuningJob:
    sample = TrafficSample.objects.create(organization=org, name="calls", status=TrafficSample.Status.READY)
    model = ServedModel.objects.create(organization=org, name="tiny", path="/models/tiny")
    return TuningJob.objects.create(
        organization=org, name="job", traffic_sample=sample, served_model=model, spec={}, created_by=user
    )


def _trial(job: TuningJob, number: int, start: datetime, end: datetime | None) -> Trial:
    trial = Trial.objects.create(
        organization=job.organization, job=job, number=number, assignment={}, label="t"
    )
    status = Trial.Status.DONE if end else Trial.Status.RUNNING
    Trial.objects.filter(pk=trial.pk).update(started_at=start, finished_at=end, status=status)
    return trial


@pytest.mark.django_db
def test_trial_minutes_are_recorded_from_finished_trials_once(alice: User, alice_org: Organization) -> None:
    job = _job(alice_org, alice)
    now = utc(2026, 3, 2, 12)
    done = _trial(job, 0, utc(2026, 3, 2, 10, 50), utc(2026, 3, 2, 11, 10))
    _trial(job, 1, utc(2026, 3, 2, 11, 20), None)  # still running: not billed yet
    assert services.usage_collect_trials(now=now) == 1
    assert services.usage_collect_trials(now=now) == 0
    rows = list(UsageRecord.objects.filter(source=f"trial:{done.pk}").order_by("hour"))
    assert [(r.hour, r.duration_ms) for r in rows] == [
        (utc(2026, 3, 2, 10), 600_000),
        (utc(2026, 3, 2, 11), 600_000),
    ]
    assert all(r.organization_id == alice_org.id and r.meter == Meter.TUNING_MINUTES for r in rows)


@pytest.mark.django_db
def test_endpoint_hours_are_recorded_per_finished_hour_by_hardware(
    alice: User, alice_org: Organization
) -> None:
    from portal.endpoints.models import Endpoint

    job = _job(alice_org, alice)
    TuningJob.objects.filter(pk=job.pk).update(spec={"hardware": "H200"})

    def endpoint(port: int, status: str, created: datetime, stopped: datetime | None) -> Endpoint:
        row = Endpoint.objects.create(
            organization=alice_org,
            name=f"ep{port}",
            served_model=job.served_model,
            job=job,
            config={},
            port=port,
            api_key_prefix="p",
            api_key_hash="h",
            status=status,
        )
        Endpoint.objects.filter(pk=row.pk).update(created_at=created, stopped_at=stopped)
        return row

    running = endpoint(41001, Endpoint.Status.HEALTHY, utc(2026, 4, 30, 22, 40), None)
    stopped = endpoint(41002, Endpoint.Status.STOPPED, utc(2026, 4, 30, 23, 0), utc(2026, 5, 1, 0, 30))
    endpoint(41003, Endpoint.Status.FAILED, utc(2026, 4, 30, 23, 0), None)
    now = utc(2026, 5, 1, 1, 20)
    # Running: 22:40-23:00, 23:00-00:00, 00:00-01:00 (the hour in progress waits); stopped: 23:00-00:30.
    assert services.usage_collect_endpoints(now=now) == 5
    assert services.usage_collect_endpoints(now=now + timedelta(minutes=30)) == 0
    assert services.usage_collect_endpoints(now=now + timedelta(hours=1)) == 1
    by_source = {
        source: sorted(
            UsageRecord.objects.filter(source=f"endpoint:{e.id}").values_list("hour", "duration_ms")
        )
        for source, e in (("running", running), ("stopped", stopped))
    }
    assert by_source["stopped"] == [(utc(2026, 4, 30, 23), 3_600_000), (utc(2026, 5, 1, 0), 1_800_000)]
    assert [ms for _, ms in by_source["running"]] == [1_200_000, 3_600_000, 3_600_000, 3_600_000]
    assert set(UsageRecord.objects.values_list("dimension", flat=True)) == {"h200"}
    april = selectors.usage_month(organization=alice_org, month=utc(2026, 4, 1))
    may = selectors.usage_month(organization=alice_org, month=utc(2026, 5, 1))
    assert [(line.dimension, line.unbilled_minutes) for line in april] == [("h200", 20 + 60 + 60)]
    assert [(line.dimension, line.unbilled_minutes) for line in may] == [("h200", 60 + 60 + 30)]


# --- Checkout, portal and reporting against the loopback Stripe ---------------------------------


@pytest.mark.django_db
def test_subscribe_through_checkout_then_webhook_activates(
    alice_client: Client, alice_org: Organization, billing: FakeStripe
) -> None:
    response = alice_client.post(reverse("billing:checkout"), {"plan": "starter"})
    assert response.status_code == 302
    assert response["Location"].startswith("https://checkout.stripe.test/c/pay/cs_test_")
    (customer,) = billing.calls("/v1/customers")
    assert customer["headers"]["idempotency-key"] == f"tg:customer:{alice_org.id}"
    assert customer["headers"]["authorization"] == "Bearer sk_test_tailguard_fake"
    assert customer["params"]["metadata[organization_id]"] == str(alice_org.id)
    (session,) = billing.calls("/v1/checkout/sessions")
    sent = session["params"]
    assert sent["mode"] == "subscription"
    assert sent["customer"] == "cus_test_acme"
    assert sent["client_reference_id"] == str(alice_org.id)
    assert (sent["line_items[0][price]"], sent["line_items[0][quantity]"]) == ("price_starter", "1")
    assert sent["line_items[1][price]"] == "price_tuning_minutes"
    assert sent["line_items[2][price]"] == "price_endpoint_h200"
    assert "line_items[1][quantity]" not in sent
    assert sent["success_url"] == "https://portal.test/billing/?checkout=success"
    account = BillingAccount.objects.get(organization=alice_org)
    assert (account.stripe_customer_id, account.status) == ("cus_test_acme", SubscriptionStatus.NONE)
    # A second checkout reuses the customer.
    alice_client.post(reverse("billing:checkout"), {"plan": "scale"})
    assert len(billing.calls("/v1/customers")) == 1
    assert billing.calls("/v1/checkout/sessions")[-1]["params"]["line_items[0][price]"] == "price_scale"

    payload = subscription_event("evt_1", "active", event_type="customer.subscription.created")
    assert post_webhook(payload, sign(payload)).status_code == 200
    account.refresh_from_db()
    assert (account.status, account.plan, account.stripe_subscription_id) == (
        "active",
        "starter",
        "sub_test_1",
    )
    assert account.usage_billed_from is not None and account.usage_billed_from.minute == 0
    assert account.current_period_end is not None
    actions = list(AuditEvent.objects.filter(organization=alice_org).values_list("action", flat=True))
    for action in ("billing.customer.create", "billing.checkout.start", "billing.subscription.active"):
        assert action in actions
    page = alice_client.get(reverse("billing:overview"))
    assert b"Active" in page.content and b"Manage subscription" in page.content
    # Subscribed: checkout is refused, the portal opens.
    again = alice_client.post(reverse("billing:checkout"), {"plan": "starter"})
    assert again["Location"] == reverse("billing:overview")
    assert len(billing.calls("/v1/checkout/sessions")) == 2
    response = alice_client.post(reverse("billing:portal"))
    assert response.status_code == 302 and response["Location"].startswith(
        "https://billing.stripe.test/p/session/"
    )
    (portal,) = billing.calls("/v1/billing_portal/sessions")
    assert portal["params"] == {"customer": "cus_test_acme", "return_url": "https://portal.test/billing/"}
    assert AuditEvent.objects.filter(organization=alice_org, action="billing.portal.open").count() == 1


@pytest.mark.django_db
def test_checkout_refuses_unknown_plan_and_reports_stripe_failure(
    alice_client: Client, alice_org: Organization, billing: FakeStripe
) -> None:
    response = alice_client.post(reverse("billing:checkout"), {"plan": "platinum"}, follow=True)
    assert b"Choose one of: scale, starter" in response.content
    assert billing.requests == []
    billing.inject("/v1/customers", "error")
    response = alice_client.post(reverse("billing:checkout"), {"plan": "starter"}, follow=True)
    assert b"Could not reach Stripe" in response.content
    assert not BillingAccount.objects.filter(
        organization=alice_org, stripe_customer_id__isnull=False
    ).exists()
    assert not AuditEvent.objects.filter(organization=alice_org, action__startswith="billing.").exists()


def _recent_hour() -> datetime:
    # Stripe takes meter events from the past 35 days only.
    return hour_floor(datetime.now(UTC)) - timedelta(days=2)


def _report_calls(fake: FakeStripe) -> list[dict[str, Any]]:
    return fake.calls("/v1/billing/meter_events")


@pytest.mark.django_db
def test_usage_is_reported_once_with_derived_idempotency_keys(
    alice_org: Organization, billing: FakeStripe
) -> None:
    now = datetime.now(UTC)
    this_hour = hour_floor(now)
    subscribe(alice_org, billed_from=this_hour - timedelta(hours=6))
    account = BillingAccount.objects.get(organization=alice_org)
    two_ago = this_hour - timedelta(hours=2)
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=two_ago + timedelta(minutes=50),
        ended_at=two_ago + timedelta(minutes=70),
        source="trial:a",
    )
    services.usage_record(
        organization=alice_org,
        meter=Meter.ENDPOINT_HOURS,
        dimension="h200",
        started_at=two_ago,
        ended_at=two_ago + timedelta(minutes=90),
        source="endpoint:e1:a",
    )
    # Usage in the current hour is not settled yet, and usage before the subscription is never billed.
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=this_hour,
        ended_at=this_hour + timedelta(minutes=5),
        source="trial:now",
    )
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=this_hour - timedelta(hours=10),
        ended_at=this_hour - timedelta(hours=9, minutes=30),
        source="trial:before",
    )
    # The settle window: half an hour after the hour before last ended, only it is reportable.
    outcome = services.usage_report_run(now=this_hour - timedelta(hours=1) + timedelta(minutes=20))
    assert outcome["sent"] == 2
    org_hex = str(alice_org.id).replace("-", "")
    stamp = f"{two_ago:%Y%m%dT%H}"
    calls = {c["headers"]["idempotency-key"]: c["params"] for c in _report_calls(billing)}
    assert set(calls) == {
        f"tg:{org_hex}:tuning_minutes:-:{stamp}",
        f"tg:{org_hex}:endpoint_hours:h200:{stamp}",
    }
    tuning = calls[f"tg:{org_hex}:tuning_minutes:-:{stamp}"]
    assert tuning == {
        "event_name": "tailguard_tuning_minutes",
        "identifier": f"tg:{org_hex}:tuning_minutes:-:{stamp}",
        "timestamp": str(int(two_ago.timestamp())),
        "payload[stripe_customer_id]": account.stripe_customer_id,
        "payload[value]": "10",
    }
    endpoint = calls[f"tg:{org_hex}:endpoint_hours:h200:{stamp}"]
    assert (endpoint["event_name"], endpoint["payload[value]"], endpoint["payload[hardware]"]) == (
        "tailguard_endpoint_minutes_h200",
        "60",
        "h200",
    )
    # A later run reports the next hour only, and never the same hour again.
    services.usage_report_run(now=now + timedelta(hours=2))
    keys = [c["headers"]["idempotency-key"] for c in _report_calls(billing)]
    assert len(keys) == len(set(keys)) == 5  # 2 + (tuning 10 min, endpoint 30 min, current-hour tuning)
    services.usage_report_run(now=now + timedelta(hours=3))
    assert len(_report_calls(billing)) == 5
    assert len(billing.billed) == 5
    assert not UsageRecord.objects.filter(source="trial:before", report__isnull=False).exists()
    assert AuditEvent.objects.filter(organization=alice_org, action="billing.usage_report.sent").count() == 5
    months = {two_ago.replace(day=1, hour=0), (two_ago + timedelta(hours=1)).replace(day=1, hour=0)}
    lines = [line for m in months for line in selectors.usage_month(organization=alice_org, month=m)]
    assert sum(line.billable_minutes for line in lines if line.meter == Meter.ENDPOINT_HOURS) == 90
    assert sum(line.reported_minutes for line in lines if line.meter == Meter.ENDPOINT_HOURS) == 90


@pytest.mark.django_db
def test_a_lost_response_is_retried_with_the_same_key_and_billed_once(
    alice_org: Organization, billing: FakeStripe
) -> None:
    hour = _recent_hour()
    subscribe(alice_org, billed_from=hour - timedelta(days=1))
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=7),
        source="trial:x",
    )
    # Stripe accepts the event but the answer never arrives.
    billing.inject("/v1/billing/meter_events", "lost")
    first = services.usage_report_run(now=hour + timedelta(hours=2))
    assert first["retry"] == 1
    report = UsageReport.objects.get(organization=alice_org)
    assert (report.status, report.attempts) == (UsageReport.Status.PENDING, 1)
    assert "Could not reach Stripe" in report.error
    # A duplicated task while nobody holds the report, then the next scheduled run.
    second = services.usage_report_run(now=hour + timedelta(hours=2, minutes=5))
    assert second["sent"] == 1
    assert services.usage_report_send(report_id=report.id) == "busy-or-done"
    report.refresh_from_db()
    assert (report.status, report.attempts, report.error) == (UsageReport.Status.SENT, 2, "")
    keys = [c["headers"]["idempotency-key"] for c in _report_calls(billing)]
    assert keys == [report.idempotency_key, report.idempotency_key]
    assert list(billing.billed) == [report.idempotency_key]
    assert billing.billed[report.idempotency_key]["payload[value]"] == "7"


@pytest.mark.django_db
def test_a_claimed_report_is_not_sent_twice_and_a_dead_senders_claim_runs_out(
    alice_org: Organization, billing: FakeStripe
) -> None:
    hour = _recent_hour()
    subscribe(alice_org, billed_from=hour - timedelta(days=1))
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=3),
        source="trial:y",
    )
    now = hour + timedelta(hours=2)
    assert services.usage_reports_prepare(now=now) == 1
    assert services.usage_reports_prepare(now=now) == 0
    report = UsageReport.objects.get()
    # A sender took the report and died before calling Stripe.
    UsageReport.objects.filter(pk=report.pk).update(claimed_until=now + timedelta(minutes=5))
    assert services.usage_report_send(report_id=report.id, now=now) == "busy-or-done"
    assert _report_calls(billing) == []
    assert services.usage_report_send(report_id=report.id, now=now + timedelta(minutes=6)) == "sent"
    assert len(_report_calls(billing)) == 1


@pytest.mark.django_db
def test_late_usage_goes_out_as_a_correction_of_the_difference(
    alice_org: Organization, billing: FakeStripe
) -> None:
    hour = _recent_hour()
    subscribe(alice_org, billed_from=hour - timedelta(days=1))
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=10, seconds=20),
        source="trial:1",
    )
    services.usage_report_run(now=hour + timedelta(hours=2))
    # A record for the same hour arrives after it was reported: 10:20 + 0:20 = 10:40 -> 11 minutes.
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour + timedelta(minutes=30),
        ended_at=hour + timedelta(minutes=30, seconds=20),
        source="trial:2",
    )
    services.usage_report_run(now=hour + timedelta(hours=3))
    first, second = UsageReport.objects.order_by("sequence")
    assert (first.sequence, first.quantity, second.sequence, second.quantity) == (0, 10, 1, 1)
    assert second.idempotency_key == first.idempotency_key + ":1"
    assert [c["params"]["payload[value]"] for c in _report_calls(billing)] == ["10", "1"]
    # A record that changes no whole minute still gets a (zero, unsent) report so it is settled.
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour + timedelta(minutes=40),
        ended_at=hour + timedelta(minutes=40, seconds=5),
        source="trial:3",
    )
    services.usage_report_run(now=hour + timedelta(hours=4))
    assert UsageReport.objects.get(sequence=2).status == UsageReport.Status.EMPTY
    assert len(_report_calls(billing)) == 2


@pytest.mark.django_db
def test_stripe_refusal_marks_the_report_failed_and_audits_it(
    alice_org: Organization, billing: FakeStripe
) -> None:
    hour = hour_floor(datetime.now(UTC)) - timedelta(days=40)
    subscribe(alice_org, billed_from=hour - timedelta(days=1))
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=5),
        source="trial:old",
    )
    outcome = services.usage_report_run()
    assert outcome["failed"] == 1
    report = UsageReport.objects.get()
    assert report.status == UsageReport.Status.FAILED
    assert "35 calendar days" in report.error
    assert (
        AuditEvent.objects.filter(organization=alice_org, action="billing.usage_report.failed").count() == 1
    )
    services.usage_report_run()
    assert len(_report_calls(billing)) == 1


@pytest.mark.django_db
def test_the_scheduled_task_reports_and_is_registered(
    settings: Any, alice_org: Organization, billing: FakeStripe
) -> None:
    from portal.billing.tasks import usage_report

    assert (
        settings.CELERY_BEAT_SCHEDULE["billing-usage-report"]["task"] == "portal.billing.tasks.usage_report"
    )
    subscribe(alice_org)
    hour = hour_floor(datetime.now(UTC)) - timedelta(hours=3)
    services.usage_record(
        organization=alice_org,
        meter=Meter.TUNING_MINUTES,
        started_at=hour,
        ended_at=hour + timedelta(minutes=2),
        source="trial:t",
    )
    assert usage_report.delay().get()["sent"] == 1
    assert usage_report.delay().get().get("sent", 0) == 0


# --- Past due: no new tuning jobs, running work untouched, admins told -----------------------------


@pytest.mark.django_db
def test_past_due_blocks_new_tuning_jobs_only(
    alice: User, alice_org: Organization, billing: FakeStripe, django_capture_on_commit_callbacks: Any
) -> None:
    account = subscribe(alice_org)
    account.stripe_customer_id = "cus_test_acme"
    account.save()
    running = _job(alice_org, alice)
    TuningJob.objects.filter(pk=running.pk).update(status=TuningJob.Status.RUNNING)
    payload = subscription_event("evt_pd", "past_due")
    with django_capture_on_commit_callbacks(execute=True):
        assert post_webhook(payload, sign(payload)).status_code == 200
    account.refresh_from_db()
    assert account.status == SubscriptionStatus.PAST_DUE
    assert TuningJob.objects.get(pk=running.pk).status == TuningJob.Status.RUNNING
    (notice,) = mail.outbox
    assert notice.to == ["alice@acme.test"]
    assert "keep running" in notice.body and "https://portal.test/billing/" in notice.body
    jobs_before = TuningJob.objects.count()
    with pytest.raises(ValidationError, match="past due"):
        job_services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="new",
            traffic_sample=running.traffic_sample,
            served_model=running.served_model,
            slo="ttft_p50_ms<=600",
            peak_rps=1.0,
        )
    assert TuningJob.objects.count() == jobs_before
    page = Client()
    page.force_login(alice)
    assert b"past due" in page.get(reverse("billing:overview")).content
    # Paid again: the gate opens.
    payload = subscription_event("evt_ok", "active", created=int(time.time()) + 1)
    assert post_webhook(payload, sign(payload)).status_code == 200
    services.billing_assert_can_start_jobs(organization=alice_org)


# --- Billing off: nothing breaks, pages explain ---------------------------------------------------


@pytest.mark.django_db
def test_without_keys_billing_is_off_and_explains_itself(
    alice: User, alice_client: Client, alice_org: Organization, settings: Any
) -> None:
    assert not settings.STRIPE_SECRET_KEY
    # A customer reads a plain sentence: the server's environment is not theirs to see or set.
    for name in ("billing:overview", "billing:usage"):
        page = alice_client.get(reverse(name))
        assert page.status_code == 200
        assert b"Billing is off on this installation" in page.content
        assert b"STRIPE" not in page.content and b"billing-config-hint" not in page.content
    response = alice_client.post(reverse("billing:checkout"), {"plan": "starter"}, follow=True)
    assert b"Billing is off" in response.content and b"STRIPE" not in response.content
    api = APIClient()
    api.force_login(alice)
    data = api.get("/api/v1/billing/").json()
    assert data["enabled"] is False and "Billing is off" in data["how_to_enable"]
    assert "STRIPE" not in data["how_to_enable"]
    # The operator (staff) gets the settings to set, on the page and from the API.
    User.objects.filter(pk=alice.pk).update(is_staff=True)
    page = alice_client.get(reverse("billing:overview"))
    assert b"STRIPE_SECRET_KEY" in page.content and b"STRIPE_WEBHOOK_SECRET" in page.content
    assert "STRIPE_SECRET_KEY" in api.get("/api/v1/billing/").json()["how_to_enable"]
    User.objects.filter(pk=alice.pk).update(is_staff=False)
    assert api.post("/api/v1/billing/checkout/", {"plan": "starter"}, format="json").status_code == 400
    assert post_webhook("{}", "t=1,v1=00").status_code == 404
    assert services.usage_report_run() == {"enabled": 0}
    # Even a past-due row left from an earlier configuration does not block work while billing is off.
    subscribe(alice_org, status=SubscriptionStatus.PAST_DUE)
    services.billing_assert_can_start_jobs(organization=alice_org)
    assert not BillingAccount.objects.exclude(organization=alice_org).exists()


def test_half_configured_billing_refuses_to_start() -> None:
    from tests.portal.settings_env import run_manage

    result = run_manage(["check"], {"STRIPE_SECRET_KEY": "sk_test_tailguard_fake"})
    assert result.returncode != 0
    assert "STRIPE_WEBHOOK_SECRET" in result.stderr and "STRIPE_PRICE_PLANS" in result.stderr
    result = run_manage(
        ["check"],
        {
            "STRIPE_SECRET_KEY": "sk_test_tailguard_fake",
            "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "STRIPE_PRICE_PLANS": "starter",
        },
    )
    assert result.returncode != 0 and "name=price_id" in result.stderr
    result = run_manage(
        ["check"],
        {
            "STRIPE_SECRET_KEY": "sk_test_tailguard_fake",
            "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "STRIPE_PRICE_PLANS": "starter=price_starter",
        },
    )
    assert result.returncode == 0, result.stderr


# --- Pages and API: roles and tenants -------------------------------------------------------------


@pytest.mark.django_db
def test_usage_page_shows_what_will_be_billed(
    alice_client: Client, alice_org: Organization, billing: FakeStripe
) -> None:
    report = reported_usage(alice_org)
    page = alice_client.get(reverse("billing:usage"), {"month": "2026-03"})
    assert page.status_code == 200
    assert b"March 2026" in page.content and b"4 trial-minutes" in page.content
    assert b"Waiting to be sent" in page.content
    fragment = alice_client.get(reverse("billing:usage"), {"month": "2026-03"}, HTTP_HX_REQUEST="true")
    assert b"<html" not in fragment.content and b'id="usage-lines"' in fragment.content
    assert alice_client.get(reverse("billing:usage"), {"month": "March"}).status_code == 400
    detail = alice_client.get(reverse("billing:report_detail", args=[report.id]))
    assert report.idempotency_key.encode() in detail.content and b"trial:r" in detail.content
    api = APIClient()
    api.force_login(User.objects.get(email="alice@acme.test"))
    usage = api.get("/api/v1/billing/usage/", {"month": "2026-03"}).json()
    assert usage["lines"] == [
        {
            "meter": "tuning_minutes",
            "dimension": "",
            "duration_ms": 240_000,
            "billable_minutes": 4,
            "reported_minutes": 0,
            "pending_minutes": 4,
            "unbilled_minutes": 0,
        }
    ]
    reports = api.get("/api/v1/billing/usage-reports/").json()["results"]
    assert [r["idempotency_key"] for r in reports] == [report.idempotency_key]
    assert api.get(f"/api/v1/billing/usage-reports/{report.id}/").json()["quantity"] == 4
    assert api.get("/api/v1/billing/usage/", {"month": "2026-3x"}).status_code == 400


def _snapshot() -> tuple[Any, ...]:
    return (
        list(BillingAccount.objects.order_by("id").values()),
        list(UsageReport.objects.order_by("id").values()),
        AuditEvent.objects.count(),
        WebhookEvent.objects.count(),
    )


@pytest.mark.django_db
def test_bob_viewer_gets_403_on_every_billing_page_and_route(
    bob: User, bob_client: Client, alice_org: Organization, billing: FakeStripe
) -> None:
    report = reported_usage(alice_org)
    before = _snapshot()
    for method, url in [
        ("get", reverse("billing:overview")),
        ("get", reverse("billing:usage")),
        ("get", reverse("billing:report_detail", args=[report.id])),
        ("post", reverse("billing:checkout")),
        ("post", reverse("billing:portal")),
    ]:
        response = getattr(bob_client, method)(url, {"plan": "starter"} if url.endswith("checkout/") else {})
        assert response.status_code == 403, url
    api = APIClient()
    api.force_login(bob)
    for method, url in [
        ("get", "/api/v1/billing/"),
        ("get", "/api/v1/billing/usage/"),
        ("get", "/api/v1/billing/usage-reports/"),
        ("get", f"/api/v1/billing/usage-reports/{report.id}/"),
        ("post", "/api/v1/billing/checkout/"),
        ("post", "/api/v1/billing/portal/"),
    ]:
        response = (
            getattr(api, method)(url, {"plan": "starter"}, format="json")
            if method == "post"
            else api.get(url)
        )
        assert response.status_code == 403, url
    assert _snapshot() == before
    assert billing.requests == []
    # The nav link is not shown to him either.
    assert b"/billing/" not in bob_client.get(reverse("accounts:dashboard")).content


@pytest.mark.django_db
def test_charlie_gets_404_for_alices_billing_and_sees_only_his_own(
    charlie: User, charlie_client: Client, alice_org: Organization, billing: FakeStripe
) -> None:
    report = reported_usage(alice_org)
    before = _snapshot()
    assert charlie_client.get(reverse("billing:report_detail", args=[report.id])).status_code == 404
    api = APIClient()
    api.force_login(charlie)
    assert api.get(f"/api/v1/billing/usage-reports/{report.id}/").status_code == 404
    assert api.get("/api/v1/billing/usage-reports/").json()["results"] == []
    assert api.get("/api/v1/billing/usage/", {"month": "2026-03"}).json()["lines"] == []
    assert api.get("/api/v1/billing/").json()["status"] == "none"
    for url in (reverse("billing:overview"), reverse("billing:usage") + "?month=2026-03"):
        page = charlie_client.get(url)
        assert page.status_code == 200
        assert report.idempotency_key.encode() not in page.content and b"trial-minutes (" not in page.content
    assert _snapshot() == before
    assert billing.requests == []
