"""Alerts that reach someone: email through a real SMTP server on loopback (aiosmtpd), signed
webhooks to a loopback receiver that checks the signature and fails on purpose (retries with
back-off observed, every attempt in the delivery log), nothing lost when the dispatch never
went out, bad webhook URLs refused, and each condition alerted once per episode."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance.models import AuditEvent
from portal.accounts.models import Organization, User
from portal.alerts import services, signing, watch
from portal.alerts.models import Alert, AlertAttempt, AlertChannel, AlertDelivery, AlertKind
from portal.billing.models import BillingAccount, SubscriptionStatus
from portal.endpoints.models import Endpoint, LoopIteration
from portal.jobs.models import TuningJob
from portal.sla import services as sla_services
from portal.sla.models import SLAAgreement
from tests.portal.sla import TIERS, make_endpoint

pytestmark = pytest.mark.django_db


# --- Real receivers on loopback ------------------------------------------------------------------


class Mailbox:
    """An SMTP server (aiosmtpd) that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        mailbox = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                mailbox.messages.append(envelope)
                return "250 Message accepted for delivery"

        # aiosmtpd checks the server is up by connecting to the port it was given: name one.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, ready_timeout=10)
        self.controller.start()


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    box = Mailbox()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", box.port
    settings.EMAIL_USE_TLS, settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = False, "", ""
    yield box
    box.controller.stop()


class Receiver:
    """A webhook receiver that checks each delivery's signature and answers the statuses queued
    in `answers` (then 200)."""

    def __init__(self) -> None:
        self.secret = ""
        self.answers: list[int] = []
        self.received: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                valid = signing.verify(
                    secret=receiver.secret,
                    body=body,
                    header=self.headers.get(signing.HEADER, ""),
                    now=int(time.time()),
                )
                receiver.received.append(
                    {"valid": valid, "body": json.loads(body), "headers": dict(self.headers)}
                )
                status = 401 if not valid else (receiver.answers.pop(0) if receiver.answers else 200)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/tailguard"


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.ALERT_RETRY_BASE_S = 30
    settings.ALERT_MAX_ATTEMPTS = 4
    found = Receiver()
    yield found
    found.server.shutdown()
    found.server.server_close()


def _webhook(
    receiver: Receiver, alice: User, org: Organization, kinds: list[str] | None = None
) -> AlertChannel:
    channel = services.alert_channel_create(
        actor=alice,
        organization=org,
        kind="webhook",
        name="pager",
        target=receiver.url,
        kinds=kinds or list(AlertKind.values),
    )
    receiver.secret = channel.secret
    return channel


def _finished_job(org: Organization, user: User, status: str = TuningJob.Status.SUCCEEDED) -> TuningJob:
    job = make_endpoint(org, user).job
    assert job is not None
    TuningJob.objects.filter(pk=job.pk).update(
        status=status, finished_at=timezone.now(), error="out of memory"
    )
    job.refresh_from_db()
    return job


# --- Tests -----------------------------------------------------------------------------------------


def test_a_finished_job_is_emailed_through_a_real_smtp_server_once(
    mailbox: Mailbox,
    alice: User,
    alice_org: Organization,
    alice_client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    response = alice_client.post(
        reverse("alerts:channel_create"),
        {
            "kind": "email",
            "name": "on-call",
            "target": "oncall@acme.test",
            "kinds": ["job.finished", "job.failed"],
        },
    )
    assert response.status_code == 302
    job = _finished_job(alice_org, alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert watch.alerts_scan()["jobs"] == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert watch.alerts_scan()["jobs"] == 0
    (message,) = mailbox.messages
    assert message.rcpt_tos == ["oncall@acme.test"]
    text = message.content.decode()
    assert "Subject: [Tailguard] Tuning job voice tuning finished" in text and str(job.id) in text
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    assert AlertAttempt.objects.get().ok
    page = alice_client.get(reverse("alerts:overview")).content.decode()
    assert "Tuning job voice tuning finished" in page and "Delivered, 1 attempt" in page


def test_a_lost_dispatch_is_sent_by_the_redispatch(
    mailbox: Mailbox, alice: User, alice_org: Organization
) -> None:
    services.alert_channel_create(
        actor=alice,
        organization=alice_org,
        kind="email",
        name="ops",
        target="ops@acme.test",
        kinds=["job.failed"],
    )
    # No commit callbacks run here: the request to a worker never went out (as with the broker
    # down), but the delivery row was written with the alert.
    _finished_job(alice_org, alice, TuningJob.Status.FAILED)
    watch.alerts_scan()
    assert AlertDelivery.objects.get().status == "pending" and not mailbox.messages
    assert services.alert_deliveries_due() == {"delivered": 1}
    assert services.alert_deliveries_due() == {}
    (message,) = mailbox.messages
    assert "Tuning job voice tuning failed" in message.content.decode()


def test_signed_webhook_retries_with_back_off_until_the_receiver_accepts(
    receiver: Receiver, alice: User, alice_org: Organization, django_capture_on_commit_callbacks: Any
) -> None:
    _webhook(receiver, alice, alice_org)
    receiver.answers = [503, 500]
    start = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        services.alert_raise(
            organization=alice_org,
            kind=AlertKind.ENDPOINT_DOWN,
            subject="endpoint:x:1",
            summary="Endpoint voice agent is failed",
            data={"endpoint": "x"},
        )
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 503)
    assert (delivery.next_attempt_at - start).total_seconds() >= 30
    # Not due yet: nothing is sent before the back-off ends.
    first_wait_end = delivery.next_attempt_at
    assert services.alert_deliveries_due(now=first_wait_end - timedelta(seconds=5)) == {}
    assert services.alert_deliveries_due(now=first_wait_end + timedelta(seconds=1)) == {"retry": 1}
    delivery.refresh_from_db()
    # The second wait doubles (60 s after the second attempt).
    assert delivery.next_attempt_at == first_wait_end + timedelta(seconds=1 + 60)
    assert services.alert_deliveries_due(now=delivery.next_attempt_at - timedelta(seconds=5)) == {}
    assert services.alert_deliveries_due(now=delivery.next_attempt_at) == {"delivered": 1}
    assert [r["valid"] for r in receiver.received] == [True, True, True]
    bodies = [r["body"] for r in receiver.received]
    assert {b["delivery"] for b in bodies} == {str(delivery.id)} and bodies[0]["type"] == "endpoint.down"
    assert receiver.received[0]["headers"]["Tailguard-Event"] == "endpoint.down"
    log = list(AlertAttempt.objects.order_by("at").values_list("ok", "status_code"))
    assert log == [(False, 503), (False, 500), (True, 200)]


def test_a_delivery_gives_up_after_the_last_attempt_and_can_be_sent_again(
    settings: Any,
    receiver: Receiver,
    alice: User,
    alice_org: Organization,
    alice_client: Client,
    bob_client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.ALERT_MAX_ATTEMPTS = 2
    _webhook(receiver, alice, alice_org)
    receiver.answers = [500, 500]
    with django_capture_on_commit_callbacks(execute=True):
        services.alert_raise(
            organization=alice_org,
            kind=AlertKind.PAYMENT_FAILED,
            subject="b:1",
            summary="Payment failed",
            data={},
        )
    assert services.alert_deliveries_due(now=timezone.now() + timedelta(minutes=5)) == {"abandoned": 1}
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "abandoned" and "HTTP 500" in delivery.last_error
    assert AuditEvent.objects.filter(action="alerts.delivery.abandoned").count() == 1
    # A viewer cannot resend; the admin can, once the receiver is fixed.
    assert bob_client.post(reverse("alerts:delivery_retry", args=[delivery.pk])).status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        alice_client.post(reverse("alerts:delivery_retry", args=[delivery.pk]))
    delivery.refresh_from_db()
    assert delivery.status == "delivered" and len(receiver.received) == 3


def test_a_forged_or_stale_signature_does_not_verify() -> None:
    body = b'{"type": "sla.breached"}'
    now = int(time.time())
    header = signing.sign(secret="whsec_a", body=body, timestamp=now)
    assert signing.verify(secret="whsec_a", body=body, header=header, now=now)
    assert not signing.verify(secret="whsec_b", body=body, header=header, now=now)
    assert not signing.verify(secret="whsec_a", body=body + b" ", header=header, now=now)
    assert not signing.verify(secret="whsec_a", body=body, header=header, now=now + 301)
    assert not signing.verify(secret="whsec_a", body=body, header="t=99999999999999999999,v1=x", now=now)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://hooks.example.com/x", "Use an http:// or https:// URL"),
        ("javascript:alert(1)", "Use an http:// or https:// URL"),
        ("http://127.0.0.1:8000/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://10.1.2.3/hook", "private"),
        ("http://0x7f000001/hook", "loopback"),
        ("https://user:pw@hooks.example.com/x", "no user name or password"),
        ("https://hooks.example.com:99999/x", "port"),
    ],
)
def test_bad_webhook_urls_are_refused_with_a_clear_message(alice_client: Client, url: str, says: str) -> None:
    response = alice_client.post(
        reverse("alerts:channel_create"),
        {"kind": "webhook", "name": "hook", "target": url, "kinds": ["sla.breached"]},
    )
    assert response.status_code == 400 and says in response.content.decode()
    assert not AlertChannel.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="alerts.").exists()


def test_roles_and_tenants_on_alert_channels(
    alice: User, alice_org: Organization, bob_client: Client, charlie_client: Client
) -> None:
    channel = services.alert_channel_create(
        actor=alice,
        organization=alice_org,
        kind="email",
        name="ops",
        target="ops@acme.test",
        kinds=["job.failed"],
    )
    # Bob (viewer) cannot send the organization's alerts elsewhere, nor touch Alice's channel.
    form = {"kind": "email", "name": "mine", "target": "elsewhere@acme.test", "kinds": ["job.failed"]}
    assert bob_client.post(reverse("alerts:channel_create"), form).status_code == 403
    assert bob_client.post(reverse("alerts:channel_delete", args=[channel.pk])).status_code == 403
    update = {"kinds": ["job.finished"], "enabled": "on"}
    assert bob_client.post(reverse("alerts:channel_update", args=[channel.pk]), update).status_code == 403
    assert charlie_client.post(reverse("alerts:channel_delete", args=[channel.pk])).status_code == 404
    assert (
        charlie_client.post(
            reverse("alerts:channel_update", args=[channel.pk]), {"kinds": ["job.finished"]}
        ).status_code
        == 404
    )
    assert list(AlertChannel.objects.values_list("name", "kinds")) == [("ops", ["job.failed"])]
    assert "ops@acme.test" not in charlie_client.get(reverse("alerts:overview")).content.decode()
    # ...but subscribes himself to what he wants, and changes or ends that subscription.
    assert 'id="subscribe-form"' in bob_client.get(reverse("alerts:overview")).content.decode()
    mine = {"kind": "email", "name": "bob", "target": "bob@acme.test", "kinds": ["sla.breached"]}
    assert bob_client.post(reverse("alerts:channel_create"), mine).status_code == 302
    own = AlertChannel.objects.get(target="bob@acme.test")
    assert bob_client.post(reverse("alerts:channel_update", args=[own.pk]), update).status_code == 302
    own.refresh_from_db()
    assert own.kinds == ["job.finished"]
    assert bob_client.post(reverse("alerts:channel_delete", args=[own.pk])).status_code == 302
    assert list(AlertChannel.objects.values_list("name", flat=True)) == ["ops"]


def test_endpoint_loop_and_payment_states_alert_once_per_episode(
    alice: User, alice_org: Organization
) -> None:
    endpoint = make_endpoint(alice_org, alice)
    watch.alerts_scan()
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.DEGRADED)
    assert watch.alerts_scan()["endpoints"] == 1
    assert watch.alerts_scan()["endpoints"] == 0
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.HEALTHY)
    watch.alerts_scan()
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.DEGRADED)
    assert watch.alerts_scan()["endpoints"] == 1
    LoopIteration.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        number=1,
        status=LoopIteration.Status.PROMOTED,
        trigger="prompt lengths doubled",
        promoted_at=timezone.now(),
    )
    assert watch.alerts_scan()["loop"] == 2  # drift detected, then promoted
    BillingAccount.objects.create(
        organization=alice_org, status=SubscriptionStatus.PAST_DUE, status_changed_at=timezone.now()
    )
    assert watch.alerts_scan()["billing"] == 1
    assert watch.alerts_scan() == {"jobs": 0, "loop": 0, "endpoints": 0, "billing": 0}
    kinds = sorted(Alert.objects.values_list("kind", flat=True))
    assert kinds == sorted(
        [
            "endpoint.degraded",
            "endpoint.degraded",
            "loop.drift_detected",
            "loop.promoted",
            "billing.payment_failed",
        ]
    )


def test_a_breach_at_the_edge_raises_breached_and_at_risk_once_an_hour(
    settings: Any, alice: User, alice_org: Organization
) -> None:
    provider = User.objects.create_user(
        email="p@tailguard.test", password="x" * 12, staff_role="platform_admin"
    )
    endpoint = make_endpoint(alice_org, alice)
    terms = sla_services.sla_terms_derive(endpoint=endpoint) | {"credit_tiers": TIERS, "interval_s": 300}
    agreement = sla_services.sla_agreement_propose(actor=provider, endpoint=endpoint, terms=terms)
    sla_services.sla_agreement_sign(actor=alice, agreement=agreement)
    SLAAgreement.objects.filter(pk=agreement.pk).update(in_force_from=datetime(2026, 1, 1, tzinfo=UTC))
    agreement.refresh_from_db()
    now = timezone.now().replace(second=0, microsecond=0)
    # The last 20 minutes, covered, 1 req/s, every first token at 2 s (target p50 600 ms).
    begin = now - timedelta(minutes=20)
    rows = [
        {"id": f"r{i}", "arrived_at": begin.timestamp() + i, "ttft_ms": 2000.0, "status": 200}
        for i in range(1200)
    ]
    sla_services.edge_batch_record(
        endpoint=endpoint,
        payload={"covered_from": begin.timestamp(), "covered_to": now.timestamp(), "requests": rows},
        now=now,
    )
    assert sla_services.sla_alerts_check(now=now) == 2
    assert sla_services.sla_alerts_check(now=now) == 0
    breached = Alert.objects.get(kind="sla.breached")
    assert breached.data["ttft_p50_ms"] == 2000.0
    assert Alert.objects.get(kind="sla.at_risk").data["burn_rate"] == pytest.approx(200.0)


def test_the_api_manages_channels_and_lists_alerts(
    settings: Any, alice: User, alice_org: Organization, bob: User, charlie: User
) -> None:
    from rest_framework.test import APIClient

    def api(user: User) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client

    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []
    body = {"kind": "webhook", "name": "pager", "target": "http://10.0.0.8/hook", "kinds": ["sla.breached"]}
    refused = api(alice).post("/api/v1/alerts/channels/", body, format="json")
    assert refused.status_code == 400 and "private" in json.dumps(refused.json())
    body["target"] = "https://hooks.example.com/tailguard"
    assert api(bob).post("/api/v1/alerts/channels/", body, format="json").status_code == 403
    created = api(alice).post("/api/v1/alerts/channels/", body, format="json")
    assert created.status_code == 201 and created.json()["secret"].startswith("whsec_")
    listed = api(bob).get("/api/v1/alerts/channels/").json()["results"]
    assert [c["name"] for c in listed] == ["pager"] and "secret" not in listed[0]
    detail = f"/api/v1/alerts/channels/{created.json()['id']}/"
    assert api(charlie).delete(detail).status_code == 404
    assert api(bob).delete(detail).status_code == 403
    services.alert_raise(
        organization=alice_org,
        kind=AlertKind.SLA_BREACHED,
        subject="s:1",
        summary="SLA breached on x",
        data={},
    )
    (alert,) = api(bob).get("/api/v1/alerts/").json()["results"]
    assert alert["kind"] == "sla.breached" and alert["deliveries"][0]["status"] == "pending"
    assert api(charlie).get("/api/v1/alerts/").json()["results"] == []
    assert api(alice).delete(detail).status_code == 204
    assert not AlertChannel.objects.exists()
