"""The isolation sweep's machinery: Alice's world (one object of every tenant kind), the mapping
of every route to the arguments and payloads that are valid for Alice, the coverage check against
the URL resolver and the OpenAPI schema, digests of Alice's and the platform's rows, and the sweep
itself (`run_sweep`). The tests are in `test_isolation_sweep`; `test_safe_methods` and
`test_api_fuzz` reuse the world and the mapping.
"""

from __future__ import annotations

import json
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.contrib import admin
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from compliance import services as compliance_services
from compliance.middleware import TWO_FACTOR_KEY
from portal.accounts import rls
from portal.accounts import services as account_services
from portal.accounts.models import Membership, Organization, User
from portal.accounts.reauth import SESSION_KEY as REAUTH_KEY
from portal.accounts.tenancy import SESSION_KEY
from portal.alerts import services as alert_services
from portal.alerts import watch as alert_watch
from portal.alerts.models import AlertDelivery
from portal.benchmarks import services as benchmark_services
from portal.billing.models import WebhookEvent
from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot, SLAWindowReport
from portal.jobs.models import TuningJob
from portal.sla import services as sla_services
from portal.sla.models import EdgeIntervalSummary, SLAAgreement
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.portal.benchmarks import finished_report
from tests.portal.billing import reported_usage
from tests.portal.job_rows import TRIALS, report_job_with

# Every method is tried on every route; the ones a route does not serve must refuse (405) or
# answer like the ones it does, never act.
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
API_PREFIX = "api/v1/"
ADMIN_PREFIX = "admin/"
LOGIN = "login"  # expectation: a redirect to the sign-in page (HTML) or 401/403 (API)
ANY = None  # expectation: anything but a server error (what it does is checked elsewhere)
OWNER = "owner"  # expectation: not refused (the arguments and payload are real); a 400 may say why
REFUSED = frozenset({403, 404, 405})
OUTSIDERS = ("charlie", "charlie_token", "anon")  # whose responses must show nothing of Alice's
# Below these the sweep has lost routes or checks (it measured 1,945 checks over 93 routes).
MIN_CHECKS = 1700
MIN_ROUTES = 85

TRACE = b"".join(
    json.dumps({"timestamp": 1000 * i, "input_length": 40 + 7 * i, "output_length": 3 + i % 4}).encode()
    + b"\n"
    for i in range(24)
)
PDF = b"%PDF-1.4 signed business associate agreement"


# --- Alice's world ------------------------------------------------------------------------------


@dataclass
class World:
    """Alice's organization with real rows of every kind, and the people who try them."""

    alice: User
    bob: User
    charlie: User
    sam: User  # a sales engineer (staff): the control for the staff-only benchmark pages
    org: Organization
    charlie_org: Organization
    objects: dict[str, Any] = field(default_factory=dict)
    charlie_token: str = ""

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["objects"][name]
        except KeyError:
            raise AttributeError(name) from None


def _upload(name: str = "sweep trace") -> dict[str, Any]:
    return {"name": name, "file": SimpleUploadedFile("trace.jsonl", TRACE)}


@pytest.fixture
def world(  # type: ignore[no-untyped-def]
    settings,
    alice,
    alice_org,
    bob,
    charlie,
    billing,
    django_capture_on_commit_callbacks,
) -> World:
    settings.COMPLIANCE_REGIONS = ["us", "eu"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["us"]
    settings.COMPLIANCE_STORAGE_BACKEND = "local"
    # The PDF download is a read like the others; printing it needs Chromium, which this sweep
    # does not start (test_job_report prints one): without it the view redirects with a message.
    settings.REPORT_CHROMIUM = "tailguard-sweep-no-chromium"
    sam = User.objects.create_user(
        email="sam@tailguard.test", password="x", is_staff=True, staff_role=User.StaffRole.SALES_ENGINEER
    )
    w = World(
        alice=alice,
        bob=bob,
        charlie=charlie,
        sam=sam,
        org=alice_org,
        charlie_org=charlie.memberships.get().organization,
    )
    o = w.objects
    with django_capture_on_commit_callbacks(execute=True):
        o["sample"] = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="acme-calls-week-12",
            upload=SimpleUploadedFile("t.jsonl", TRACE),
        )
    o["sample"].refresh_from_db()
    assert o["sample"].status == TrafficSample.Status.READY, o["sample"].error
    # A finished job with trials, a selection and a winner (the report's data), and a running one.
    o["job"] = report_job_with(alice_org, alice, TRIALS)
    o["model"] = o["job"].served_model
    o["running_job"] = TuningJob.objects.create(
        organization=alice_org,
        name="acme-running-tuning",
        traffic_sample=o["sample"],
        served_model=o["model"],
        spec=o["job"].spec,
        status=TuningJob.Status.RUNNING,
        created_by=alice,
    )
    endpoint = Endpoint.objects.create(
        organization=alice_org,
        name="acme-voice-endpoint",
        served_model=o["model"],
        job=o["job"],
        config={"dtype": "float32", "max_num_seqs": 8},
        port=59871,
        api_key_prefix="acmekey1",
        api_key_hash="0" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=alice,
    )
    o["endpoint"] = endpoint
    # A second endpoint nobody stops: the API's "start again" is tried on it (a running endpoint
    # refuses, 400), so no sweep ever starts an engine, whatever stopped the first one before.
    o["running_endpoint"] = Endpoint.objects.create(
        organization=alice_org,
        name="acme-running-endpoint",
        served_model=o["model"],
        job=o["job"],
        config=endpoint.config,
        port=59873,
        api_key_prefix="acmekey2",
        api_key_hash="2" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=alice,
    )
    # Alice's organization's own hardware pool (issue 20).
    from compliance.selectors import allowed_regions
    from portal.pools import services as pool_services

    o["pool"] = pool_services.pool_create(
        actor=alice,
        owned_by=alice_org,
        name="acme-pool",
        region=allowed_regions(organization=alice_org)[0],
        accelerator="local-cpu",
    )
    EndpointRevision.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        generation=1,
        config=endpoint.config,
        reason="deployed the winner of tuning job 'voice agent tuning'",
        job=o["job"],
        trial_number=o["job"].winner_trial,
        measured_ttft_p50_ms=400.0,
        measured_ttft_p95_ms=900.0,
        measured_tokens_per_s=315.0,
    )
    now = timezone.now()
    for minutes in range(1, 6):
        MetricSnapshot.objects.create(
            organization=alice_org,
            endpoint=endpoint,
            taken_at=now - timedelta(minutes=minutes),
            ttft_p50_ms=300.0 + minutes,
            ttft_p95_ms=800.0,
            requests_per_s=2.0,
            prompt_tokens_per_s=1600.0,
            generation_tokens_per_s=240.0,
            prefix_cache_hit_rate=0.4,
        )
    MetricSnapshot.objects.create(
        organization=alice_org, endpoint=endpoint, taken_at=now, gap=True, gap_reason="metrics unavailable"
    )
    LoopIteration.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        number=1,
        status=LoopIteration.Status.KEPT,
        trigger="prompt lengths drifted",
        job=o["job"],
        verdict="the running configuration stayed faster",
        finished_at=now,
    )
    terms = sla_services.sla_terms_set(actor=alice, endpoint=endpoint, target_ms=800)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    previous = (month - timedelta(days=1)).replace(day=1)
    o["sla_month"] = f"{previous:%Y-%m}"
    SLAWindowReport.objects.create(
        organization=alice_org,
        terms=terms,
        window_start=previous,
        window_end=month,
        result={"status": "met", "compliance_pct": 100.0},
    )
    o["invitation"] = account_services.invitation_create(
        actor=alice, organization=alice_org, email="new.hire@acme.test", role="member"
    )
    o["token"] = account_services.api_token_create(
        actor=alice, organization=alice_org, name="acme-ci-token"
    ).token
    # A third member of Alice's organization: the object of the member-removal routes.
    dana = User.objects.create_user(email="dana@acme.test", password="x", full_name="Dana")
    o["member"] = Membership.objects.create(organization=alice_org, user=dana, role="member")
    erin = User.objects.create_user(email="erin@acme.test", password="x", full_name="Erin")
    o["api_member"] = Membership.objects.create(organization=alice_org, user=erin, role="member")
    compliance_services.residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["us"])
    compliance_services.retention_policy_set(actor=alice, organization=alice_org, sample_retention_days=90)
    today = timezone.now().date()
    o["baa"] = compliance_services.baa_record_create(
        actor=alice,
        organization=alice_org,
        counterparty="Acme Health Partners LLC",
        version="2026-01",
        signed_on=today - timedelta(days=10),
        effective_on=today - timedelta(days=5),
        document=SimpleUploadedFile("baa.pdf", PDF),
    )
    o["usage_report"] = reported_usage(alice_org)
    o["bench_report"] = finished_report(sam, o["sample"])
    # The benchmark API is tenant-scoped: the sales engineer works on Alice's organization's
    # reports as a member of it (the staff pages reach every organization without).
    o["sam_membership"] = Membership.objects.create(organization=alice_org, user=sam, role="member")
    o["share_link"], _secret = benchmark_services.benchmark_share_create(
        actor=sam, report=o["bench_report"], days=7
    )
    # Charlie's own endpoint: the target of his attempts to pull Alice's job onto it.
    o["charlie_endpoint"] = Endpoint.objects.create(
        organization=w.charlie_org,
        name="other-endpoint",
        served_model=w.charlie_org.served_models.create(name="other-model", path="/models/other"),
        config={},
        port=59872,
        api_key_prefix="othrkey1",
        api_key_hash="1" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=charlie,
    )
    # An SLA agreement in force (proposed by the provider, signed by Alice), a newer proposal
    # awaiting her signature, an alert channel and a delivery of an alert to it.
    provider = User.objects.create_user(
        email="provider@tailguard.test", password="x", is_staff=True, staff_role=User.StaffRole.PLATFORM_ADMIN
    )
    sla_terms = sla_services.sla_terms_derive(endpoint=endpoint) | {
        "peak_rps": 2.0,
        "credit_tiers": [{"below_pct": 99.0, "credit_pct": 10.0}],
        "monthly_fee_cents": 100000,
    }
    agreement = sla_services.sla_agreement_propose(actor=provider, endpoint=endpoint, terms=sla_terms)
    o["sla_agreement"] = sla_services.sla_agreement_sign(actor=alice, agreement=agreement)
    o["sla_proposal"] = sla_services.sla_agreement_propose(
        actor=provider, endpoint=endpoint, terms=sla_terms | {"ttft_p50_ms": 700.0}
    )
    o["alert_channel"] = alert_services.alert_channel_create(
        actor=alice,
        organization=alice_org,
        kind="email",
        name="acme-oncall-channel",
        target="oncall@acme.test",
        kinds=["job.failed"],
    )
    # A second channel holds the delivery (the sweep's owner writes delete the first).
    pager = alert_services.alert_channel_create(
        actor=alice,
        organization=alice_org,
        kind="email",
        name="acme-pager-channel",
        target="pager@acme.test",
        kinds=["job.failed"],
    )
    alert = alert_services.alert_raise(
        organization=alice_org, kind="job.failed", subject="sweep:job", summary="acme-job-failed", data={}
    )
    o["alert_delivery"] = AlertDelivery.objects.get(alert=alert, channel=pager)
    # The API's channel (the HTML routes' owner writes delete the first one).
    o["api_channel"] = alert_services.alert_channel_create(
        actor=alice,
        organization=alice_org,
        kind="email",
        name="acme-api-channel",
        target="api-alerts@acme.test",
        kinds=["job.failed"],
    )
    alert_services.alert_delivery_send(delivery_id=o["alert_delivery"].pk)
    # Edge records, and last month closed with its credit (the agreement in force since then).
    sla_services.edge_batch_record(
        endpoint=endpoint,
        payload={
            "covered_from": (now - timedelta(minutes=10)).timestamp(),
            "covered_to": now.timestamp(),
            "requests": [
                {
                    "id": f"acme-{i}",
                    "arrived_at": (now - timedelta(minutes=9)).timestamp() + i,
                    "ttft_ms": 300.0,
                    "status": 200,
                }
                for i in range(5)
            ],
        },
        now=now,
    )
    SLAAgreement.objects.filter(pk=o["sla_agreement"].pk).update(in_force_from=previous)
    sla_services.sla_periods_close(now=now)
    # One settled interval's summary (the settle task writes them; made directly here, cheaply).
    EdgeIntervalSummary.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        interval_s=300,
        peak_rps=2.0,
        start=previous,
        covered=True,
        admitted=1,
        excluded=0,
        failed=0,
        ttft_p50_ms=300.0,
        ttft_p95_ms=300.0,
    )
    alert_watch.alerts_scan(now=now)
    WebhookEvent.objects.create(
        stripe_event_id="evt_acme_subscription",
        event_type="customer.subscription.updated",
        organization=alice_org,
        outcome="applied",
    )
    w.charlie_token = account_services.api_token_create(
        actor=charlie, organization=w.charlie_org, name="other-token"
    ).secret
    return w


# --- The mapping: how to sweep each route -------------------------------------------------------

Kwargs = Callable[[World], list[dict[str, Any]]]
Payload = Callable[[World], dict[str, Any]]


@dataclass(frozen=True)
class Route:
    """How to sweep one named route.

    `objects` builds the URL arguments from Alice's objects (one dict per variant); a route
    without it is object-free (a list, a form, a create), swept for what it shows Charlie.
    `writes` holds a payload, valid for Alice, per write method the route serves; API routes
    take the methods they serve from the schema, HTML routes from `reads` and `writes`.
    """

    objects: Kwargs | None = None
    # Arguments naming what every tenant shares (a catalog entry): swept like an object-free route.
    shared: Kwargs | None = None
    reads: tuple[str, ...] = ("GET",)
    writes: Mapping[str, Payload] = field(default_factory=dict)
    # Query-string variants tried on every read, besides none.
    queries: Callable[[World], list[dict[str, str]]] | None = None
    bob_read: int = 200
    bob_write: int = 403
    # Alice's (or, for staff tools, a sales engineer's) read of her object: the control.
    owner_read: int = 200
    # Object-free writes: what Charlie gets (ANY where it is his own business, e.g. his uploads).
    charlie_write: int | frozenset[int] | None = ANY
    # Charlie's own objects for the URL, with Alice's referenced in the payload (writes only).
    charlie_objects: Kwargs | None = None
    # Staff tools (benchmark reports, the SLA console, catalog prices): 404 to everyone else.
    staff_only: bool = False

    @property
    def takes_arguments(self) -> bool:
        return self.objects is not None or self.shared is not None


def _obj(name: str, kwarg: str, attr: str = "") -> Kwargs:
    return lambda w: [{kwarg: getattr(w, attr or name).pk}]


def _jobs(kwarg: str) -> Kwargs:
    return lambda w: [{kwarg: w.job.pk}, {kwarg: w.running_job.pk}]


def _no_body(w: World) -> dict[str, Any]:
    return {}


def _tuning_job_form(w: World) -> dict[str, Any]:
    return {
        "name": "sweep job",
        "traffic_sample": w.sample.pk,
        "served_model": w.model.pk,
        "ttft_p50_ms": 600,
        "ttft_p95_ms": 1500,
        "peak_rps": 2,
        "headroom": 1.25,
        "hardware": "local-cpu",
        "budget_trials": 2,
        "strategy": "tpe",
    }


def _model_form(w: World) -> dict[str, Any]:
    return {"name": "sweep-model", "path": str(django_settings.TUNING_MODEL_ROOTS[0] / "sweep")}


def _baa_form(w: World) -> dict[str, Any]:
    today = timezone.now().date()
    return {
        "counterparty": "Sweep Counterparty",
        "version": "sweep",
        "signed_on": str(today - timedelta(days=2)),
        "effective_on": str(today - timedelta(days=1)),
    }


def _sla_form(w: World) -> dict[str, Any]:
    return {"endpoint": w.endpoint.pk, "metric": "ttft_p95_ms", "target_ms": 900}


ROUTES: dict[str, Route] = {
    # Accounts.
    "accounts:dashboard": Route(),
    # Creating an organization of one's own leaves Alice's untouched: allowed to Bob too.
    "accounts:organization_create": Route(writes={"POST": lambda w: {"name": "sweep org"}}, bob_write=302),
    # Switching into Alice's organization: Bob belongs to it, Charlie does not.
    "accounts:organization_switch": Route(
        reads=(), writes={"POST": lambda w: {"organization": w.org.pk}}, bob_write=302, charlie_write=404
    ),
    "accounts:members": Route(writes={"POST": lambda w: {"email": "sweep@example.test", "role": "member"}}),
    "accounts:invitation_revoke": Route(
        objects=_obj("invitation", "invitation_id"), reads=(), writes={"POST": _no_body}
    ),
    "accounts:member_remove": Route(
        objects=_obj("member", "membership_id"), reads=(), writes={"POST": _no_body}
    ),
    "accounts:api_tokens": Route(writes={"POST": lambda w: {"name": "sweep token"}}),
    "accounts:api_token_revoke": Route(
        objects=_obj("token", "token_id"), reads=(), writes={"POST": _no_body}
    ),
    # Traffic samples.
    "traffic:list": Route(writes={"POST": lambda w: _upload()}),
    "traffic:detail": Route(objects=_obj("sample", "sample_id")),
    "traffic:status": Route(objects=_obj("sample", "sample_id")),
    "traffic:delete": Route(objects=_obj("sample", "sample_id"), reads=(), writes={"POST": _no_body}),
    # Tuning jobs, their trials and reports (the downloads included).
    "jobs:list": Route(writes={"POST": _tuning_job_form}, charlie_write=400),
    "jobs:model_register": Route(reads=(), writes={"POST": _model_form}),
    # A GET form: Charlie naming Alice's sample and model gets the form back with errors.
    "jobs:what_if": Route(
        queries=lambda w: [
            {
                "traffic_sample": str(w.sample.pk),
                "served_model": str(w.model.pk),
                "ttft_p50_ms": "600",
                "ttft_p95_ms": "1500",
            }
        ]
    ),
    "jobs:detail": Route(objects=_jobs("job_id")),
    "jobs:trials": Route(objects=_jobs("job_id")),
    "jobs:cancel": Route(objects=_jobs("job_id"), reads=(), writes={"POST": _no_body}),
    "jobs:report": Route(objects=_obj("job", "job_id")),
    "jobs:report_html": Route(objects=_obj("job", "job_id")),
    "jobs:report_pdf": Route(objects=_obj("job", "job_id"), bob_read=302, owner_read=302),
    # Endpoints.
    "endpoints:list": Route(),
    "endpoints:deploy": Route(objects=_obj("job", "job_id"), reads=(), writes={"POST": _no_body}),
    "endpoints:detail": Route(objects=_obj("endpoint", "endpoint_id"), queries=lambda w: [{"range": "7d"}]),
    "endpoints:deployed": Route(objects=_obj("endpoint", "endpoint_id")),
    "endpoints:policy": Route(
        objects=_obj("endpoint", "endpoint_id"),
        reads=(),
        writes={
            "POST": lambda w: {
                "auto_retune": "on",
                "retune_cooldown_s": 600,
                "retune_max_per_day": 2,
                "retune_budget_trials": 3,
                "detect_window_s": 120,
            }
        },
    ),
    "endpoints:promote": Route(
        objects=_obj("endpoint", "endpoint_id"),
        reads=(),
        writes={"POST": lambda w: {"job": w.running_job.pk}},
        charlie_objects=lambda w: [{"endpoint_id": w.charlie_endpoint.pk}],
        charlie_write=404,
    ),
    "endpoints:stop": Route(objects=_obj("endpoint", "endpoint_id"), reads=(), writes={"POST": _no_body}),
    # Billing: owners and admins only, reads included.
    "billing:overview": Route(bob_read=403),
    "billing:checkout": Route(reads=(), writes={"POST": lambda w: {"plan": "starter"}}),
    "billing:portal": Route(reads=(), writes={"POST": _no_body}),
    "billing:usage": Route(bob_read=403, queries=lambda w: [{"month": f"{w.usage_report.hour:%Y-%m}"}]),
    "billing:report_detail": Route(objects=_obj("usage_report", "report_id"), bob_read=403),
    # Benchmark reports: a staff tool (Alice owns the prospect's data, yet sees 404 too).
    "benchmarks:list": Route(staff_only=True),
    "benchmarks:create": Route(
        writes={"POST": lambda w: {"traffic_sample": w.sample.pk, "targets-TOTAL_FORMS": "0"}},
        staff_only=True,
    ),
    "benchmarks:detail": Route(objects=_obj("bench_report", "report_id"), staff_only=True),
    "benchmarks:status": Route(objects=_obj("bench_report", "report_id"), staff_only=True),
    "benchmarks:share": Route(
        objects=_obj("bench_report", "report_id"),
        reads=(),
        writes={"POST": lambda w: {"days": "7"}},
        staff_only=True,
    ),
    "benchmarks:share_revoke": Route(
        objects=lambda w: [{"report_id": w.bench_report.pk, "link_id": w.share_link.pk}],
        reads=(),
        writes={"POST": _no_body},
        staff_only=True,
    ),
    # Compliance.
    "compliance:overview": Route(),
    "compliance:residency": Route(reads=(), writes={"POST": lambda w: {"allowed_regions": ["eu"]}}),
    "compliance:retention": Route(reads=(), writes={"POST": lambda w: {"sample_retention_days": 30}}),
    "compliance:baa_create": Route(reads=(), writes={"POST": _baa_form}),
    "compliance:baa_document": Route(objects=_obj("baa", "baa_id"), bob_read=403),
    "compliance:audit_export": Route(bob_read=403, queries=lambda w: [{"export_format": "csv"}]),
    # Naming Alice's organization in the confirmation does not make it Charlie's to delete.
    "compliance:organization_delete": Route(
        reads=(), writes={"POST": lambda w: {"confirm": w.org.slug}}, charlie_write=400
    ),
    # The endpoint is named in the body, not the URL.
    "compliance:sla_terms": Route(reads=(), writes={"POST": _sla_form}, charlie_write=404),
    "compliance:console": Route(staff_only=True),
    # The provider's countersignature: a platform admin's form; Bob and Charlie get 404 (Alice,
    # an owner trying to countersign her own BAA, gets 403 and is audited: test_baa).
    "compliance:baa_countersign": Route(
        staff_only=True,
        reads=(),
        writes={"POST": lambda w: {"baa": str(w.baa.pk), "effective_on": f"{w.baa.effective_on:%Y-%m-%d}"}},
    ),
    "sla:overview": Route(),
    "sla:console": Route(staff_only=True),
    "sla:endpoint": Route(
        objects=_obj("endpoint", "endpoint_id"), queries=lambda w: [{"month": w.sla_month}]
    ),
    "sla:propose": Route(
        objects=_obj("endpoint", "endpoint_id"),
        reads=(),
        writes={"POST": lambda w: {"ttft_p50_ms": "650", "peak_rps": "2", "interval_s": "300"}},
    ),
    "sla:sign": Route(objects=_obj("sla_proposal", "agreement_id"), reads=(), writes={"POST": _no_body}),
    "sla:decline": Route(objects=_obj("sla_proposal", "agreement_id"), reads=(), writes={"POST": _no_body}),
    "sla:evidence_pack": Route(bob_read=403, queries=lambda w: [{"month": w.sla_month}]),
    "alerts:overview": Route(),
    "alerts:channel_create": Route(
        reads=(),
        writes={
            "POST": lambda w: {
                "kind": "email",
                "name": "ops",
                "target": "ops@acme.test",
                "kinds": ["job.failed"],
            }
        },
    ),
    "alerts:channel_update": Route(
        objects=_obj("alert_channel", "channel_id"),
        reads=(),
        writes={"POST": lambda w: {"kinds": ["job.finished"], "enabled": "on"}},
    ),
    "alerts:channel_delete": Route(
        objects=_obj("alert_channel", "channel_id"), reads=(), writes={"POST": _no_body}
    ),
    "alerts:delivery_retry": Route(
        objects=_obj("alert_delivery", "delivery_id"), reads=(), writes={"POST": _no_body}
    ),
    # The hardware and model catalogs: the same for every signed-in user; prices are set by
    # platform admins only.
    "catalog:hardware_list": Route(),
    "catalog:model_list": Route(),
    "catalog:hardware_detail": Route(shared=lambda w: [{"name": "h200"}]),
    "catalog:price_set": Route(
        reads=(),
        writes={"POST": lambda w: {"hardware_name": "h200", "price_per_hour_usd": "0.01"}},
        staff_only=True,
    ),
    "catalog:price_clear": Route(
        reads=(), writes={"POST": lambda w: {"hardware_name": "h200"}}, staff_only=True
    ),
    # One's own authenticator: a wrong code is a 400 for whoever sends it.
    "compliance:two_factor": Route(
        writes={"POST": lambda w: {"code": "000000"}}, bob_write=400, charlie_write=400
    ),
    # The API (methods from the schema).
    "api:me": Route(),
    "api:active_organization": Route(
        writes={"PUT": lambda w: {"organization": str(w.org.pk)}},
        bob_write=200,
        # A session gets 404; a token cannot switch at all (400).
        charlie_write=frozenset({400, 404}),
    ),
    "api:organizations": Route(writes={"POST": lambda w: {"name": "sweep api org"}}, bob_write=201),
    "api:members": Route(),
    "api:member_detail": Route(objects=_obj("api_member", "pk"), writes={"DELETE": _no_body}),
    "api:invitations": Route(writes={"POST": lambda w: {"email": "sweep@example.test", "role": "member"}}),
    # A random secret: accepting needs the emailed one, whoever asks.
    "api:invitation_accept": Route(
        writes={"POST": lambda w: {"token": "not-the-emailed-secret"}}, bob_write=400, charlie_write=400
    ),
    "api:invitation_detail": Route(objects=_obj("invitation", "pk"), writes={"DELETE": _no_body}),
    "api:traffic_samples": Route(writes={"POST": lambda w: _upload()}),
    "api:traffic_sample_detail": Route(objects=_obj("sample", "pk"), writes={"DELETE": _no_body}),
    "api:models": Route(writes={"POST": _model_form}),
    "api:tuning_jobs": Route(
        writes={
            "POST": lambda w: {
                "traffic_sample": str(w.sample.pk),
                "served_model": str(w.model.pk),
                "slo": "ttft_p50_ms<=600,ttft_p95_ms<=1500",
                "peak_rps": 2.0,
            }
        },
        charlie_write=400,
    ),
    "api:tuning_job_detail": Route(objects=_jobs("pk")),
    "api:tuning_job_cancel": Route(objects=_jobs("pk"), writes={"POST": _no_body}),
    # Hardware pools: the organization's own (another's is a 404; creating one is Charlie's own business).
    "api:pools": Route(
        writes={"POST": lambda w: {"name": "sweep-pool", "region": w.pool.region, "accelerator": "local-cpu"}}
    ),
    "api:pool_detail": Route(
        objects=lambda w: [{"name": w.pool.name}], writes={"PATCH": lambda w: {"enabled": True}}
    ),
    "api:pool_hosts": Route(objects=lambda w: [{"name": w.pool.name}]),
    "api:tokens": Route(writes={"POST": lambda w: {"name": "sweep token"}}),
    "api:token_detail": Route(objects=_obj("token", "pk"), writes={"DELETE": _no_body}),
    "api:compliance_residency": Route(writes={"PUT": lambda w: {"allowed_regions": ["eu"]}}),
    "api:compliance_retention": Route(writes={"PUT": lambda w: {"sample_retention_days": 30}}),
    "api:compliance_baas": Route(writes={"POST": _baa_form}),
    "api:compliance_baa_detail": Route(objects=_obj("baa", "pk")),
    "api:compliance_audit_events": Route(),
    "api:compliance_audit_export": Route(bob_read=403, queries=lambda w: [{"export_format": "csv"}]),
    "api:compliance_organization_delete": Route(
        # Charlie's session: Alice's slug is not his organization's (400); his token may not
        # delete an organization at all (403, re-authentication).
        writes={"POST": lambda w: {"confirm": w.org.slug}},
        charlie_write=frozenset({400, 403}),
    ),
    "api:compliance_endpoint_sla": Route(
        objects=_obj("endpoint", "pk"),
        writes={"PUT": lambda w: {"target_ms": 900}},
        queries=lambda w: [{"month": w.sla_month}],
    ),
    "api:billing_account": Route(bob_read=403),
    "api:billing_usage": Route(bob_read=403, queries=lambda w: [{"month": f"{w.usage_report.hour:%Y-%m}"}]),
    "api:billing_usage_reports": Route(bob_read=403),
    "api:billing_usage_report": Route(objects=_obj("usage_report", "pk"), bob_read=403),
    "api:billing_checkout": Route(writes={"POST": lambda w: {"plan": "starter"}}),
    "api:billing_portal": Route(writes={"POST": _no_body}),
    "api:sla_agreements": Route(),
    "api:sla_agreement_sign": Route(objects=_obj("sla_proposal", "pk"), writes={"POST": _no_body}),
    "api:sla_proposals": Route(
        objects=_obj("endpoint", "pk"),
        writes={"POST": lambda w: {"ttft_p50_ms": 650, "peak_rps": 2, "interval_s": 300}},
    ),
    "api:sla_report": Route(objects=_obj("endpoint", "pk"), queries=lambda w: [{"month": w.sla_month}]),
    "api:compliance_evidence_pack": Route(bob_read=403, queries=lambda w: [{"month": w.sla_month}]),
    "api:alerts": Route(),
    "api:alert_channels": Route(
        writes={
            "POST": lambda w: {
                "kind": "email",
                "name": "ops",
                "target": "ops@acme.test",
                "kinds": ["job.failed"],
            }
        }
    ),
    "api:alert_channel_detail": Route(objects=_obj("api_channel", "pk"), writes={"DELETE": _no_body}),
    # Endpoints (issue 22). Deploying without an Idempotency-Key is a 400 even for Alice, so the
    # sweep never starts an engine; tests/portal/test_api_endpoints.py deploys with one.
    "api:endpoints": Route(),
    "api:endpoint_detail": Route(objects=_obj("endpoint", "pk")),
    "api:tuning_job_deploy": Route(
        objects=_jobs("pk"), writes={"POST": lambda w: {"name": "sweep endpoint"}}
    ),
    "api:endpoint_promote": Route(
        objects=_obj("endpoint", "pk"),
        writes={"POST": lambda w: {"job": str(w.running_job.pk)}},
        # His own endpoint with Alice's job in the body: no such job (400), nothing changes.
        charlie_objects=lambda w: [{"pk": w.charlie_endpoint.pk}],
        charlie_write=400,
    ),
    "api:endpoint_start": Route(objects=_obj("running_endpoint", "pk"), writes={"POST": _no_body}),
    "api:endpoint_stop": Route(objects=_obj("endpoint", "pk"), writes={"POST": _no_body}),
    "api:endpoint_metrics": Route(objects=_obj("endpoint", "pk"), queries=lambda w: [{"range": "7d"}]),
    "api:endpoint_policy": Route(
        objects=_obj("endpoint", "pk"),
        writes={
            "PUT": lambda w: {
                "auto_retune": False,
                "retune_cooldown_s": 600,
                "retune_max_per_day": 2,
                "retune_budget_trials": 3,
                "detect_window_s": 120,
            }
        },
    ),
    # Benchmark reports: staff only (404 to everyone else), tenant-scoped (Sam is a member of
    # Alice's organization). The create payload has no target (400): no run starts.
    "api:benchmark_reports": Route(
        writes={
            "POST": lambda w: {
                "traffic_sample": str(w.sample.pk),
                "load_multipliers": [1.0],
                "duration_s": 10,
                "targets": [],
            }
        },
        staff_only=True,
    ),
    "api:benchmark_report_detail": Route(objects=_obj("bench_report", "pk"), staff_only=True),
    "api:benchmark_report_result": Route(objects=_obj("bench_report", "pk"), staff_only=True),
    "api:benchmark_share_links": Route(
        objects=_obj("bench_report", "pk"), writes={"POST": lambda w: {"days": 7}}, staff_only=True
    ),
    "api:benchmark_share_link_detail": Route(
        objects=lambda w: [{"pk": w.bench_report.pk, "link_id": w.share_link.pk}],
        writes={"DELETE": _no_body},
        staff_only=True,
    ),
}

# Routes with no tenant object to protect, each with why; checked lightly below (no 5xx, nothing
# of Alice's shown or changed). Nothing else may be left out of ROUTES.
PUBLIC_ROUTES: dict[str, str] = {
    "healthz": "liveness probe",
    "accounts:home": "the public landing page (redirects a signed-in person to the dashboard)",
    "accounts:login": "sign-in form",
    "accounts:logout": "ends one's own session",
    # Re-authentication confirms one's own password for one's own session (tests/portal/test_reauth.py).
    "accounts:reauth": "confirms one's own password",
    "api:reauthenticate": "confirms one's own password through the API",
    "accounts:signup": "sign-up form",
    "api:signup": "sign-up through the API",
    "plotly-js": "plotly.js vendor file",
    "schema": "the OpenAPI schema",
    "api-docs": "Swagger UI over the schema",
    "api-redoc": "ReDoc over the schema",
    # Share and invitation links carry their own random secret; a random one is tried.
    "benchmarks:shared": "share-link page, by random token",
    "accounts:invitation_accept": "invitation link, by random secret",
    # Stripe's webhook: public, every body checked against the signing secret (tested in
    # test_billing_webhooks); an unsigned body is tried.
    "billing:webhook": "Stripe webhook, signature-checked",
    # The measuring point's ingest: a bearer token (SLA_EDGE_INGEST_TOKEN) authenticates it and
    # the body names the endpoint; off (404) unless the token is set (tested in test_sla_agreements).
    "sla:edge_ingest": "edge measurements, bearer-token checked",
    "metrics": "Prometheus scrape, bearer-token checked (404 unless METRICS_TOKEN is set)",
}


# --- Enumeration --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    route: str  # the pattern as text, e.g. "jobs/<uuid:job_id>/cancel/"
    name: str  # namespaced, e.g. "jobs:cancel"; "" when the pattern has none
    kwargs: tuple[str, ...]


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[Found]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            names = tuple(pattern.pattern.regex.groupindex)
            yield Found(
                prefix + str(pattern.pattern), f"{namespace}{pattern.name}" if pattern.name else "", names
            )


def resolver_routes() -> list[Found]:
    return list(_walk(get_resolver().url_patterns))


def _shape(route: str) -> str:
    """A route with its arguments blanked: "/api/v1/tokens/{}/" for the resolver's and schema's."""
    out, depth = [], 0
    for char in "/" + route:
        if char in "<{":
            depth += 1
            if depth == 1:
                out.append("{}")
        elif char in ">}":
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


def schema_methods() -> dict[str, set[str]]:
    """Schema path shape -> the methods the OpenAPI schema documents for it."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {_shape(path.lstrip("/")): {m.upper() for m in ops} for path, ops in schema["paths"].items()}


def coverage_problems(found: list[Found], schema: dict[str, set[str]]) -> list[str]:
    """Why the sweep would not cover everything: routes without an entry (or whose entry
    disagrees about arguments), API methods without a payload, schema routes the resolver does
    not have. (An entry for a route that is gone is harmless and not reported.)"""
    problems = []
    named = {f.name: f for f in found if not f.route.startswith(ADMIN_PREFIX)}
    for f in found:
        if f.route.startswith(ADMIN_PREFIX):
            continue
        if not f.name:
            problems.append(f"route {f.route!r} has no name: name it and add it to ROUTES")
        elif f.name not in ROUTES and f.name not in PUBLIC_ROUTES:
            problems.append(
                f"route {f.name} ({f.route}) has no entry in ROUTES (how to build Alice's object for it) "
                "and is not in PUBLIC_ROUTES"
            )
        elif f.name in ROUTES and bool(f.kwargs) != ROUTES[f.name].takes_arguments:
            problems.append(f"route {f.name} takes {f.kwargs or 'no arguments'}: its ROUTES entry disagrees")
    shapes = {_shape(f.route): f for f in named.values()}
    for shape, methods in schema.items():
        f = shapes.get(shape)
        if f is None:
            problems.append(f"schema route {shape} matches no URL pattern")
            continue
        if f.name in PUBLIC_ROUTES:
            continue
        entry = ROUTES.get(f.name)
        if entry is None:
            continue  # reported above
        writes = methods - {"GET", "HEAD", "OPTIONS"}
        for method in sorted(writes - set(entry.writes)):
            problems.append(f"{method} {shape} ({f.name}) is in the schema but ROUTES has no payload for it")
        for method in sorted(set(entry.writes) - writes):
            problems.append(f"ROUTES has a {method} payload for {f.name}, which the schema does not document")
    return problems


# --- The sweep ----------------------------------------------------------------------------------


def _tenant_models() -> list[type[Model]]:
    return [
        model
        for model in apps.get_models()
        if any(f.name == "organization" and f.is_relation for f in model._meta.concrete_fields)
    ]


def alice_state(org: Organization) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of Alice's organization, every field (status, updated_at and the rest)."""
    # Platform-wide: through the application role too, the sweep sees what is really stored.
    with rls.platform_transaction():
        state = {
            model._meta.label: list(model.objects.filter(organization=org).order_by("pk").values_list())
            for model in _tenant_models()
        }
        state["accounts.Organization"] = list(Organization.objects.filter(pk=org.pk).values_list())
        state["accounts.User"] = list(
            User.objects.filter(memberships__organization=org).order_by("pk").values_list()
        )
    return state


# Tables of the project's own apps that hold no organization key, yet changes to which by
# Charlie or Bob would matter (platform settings such as catalog prices): compared whole. These
# are left out, each changing by design when anyone acts:
PLATFORM_CHANGES_BY_DESIGN = {
    "accounts.User": "people sign in (Alice's and Bob's rows are compared with her organization)",
    "accounts.Organization": "people create organizations (Alice's is compared)",
    "compliance.AuditChainHead": "every organization's chain advances (Alice's events are compared)",
    "compliance.LoginFailure": "failed sign-ins are recorded for throttling",
    "compliance.TOTPDevice": "opening the two-factor page enrols one's own authenticator",
    # Pools are not tenant rows (the platform's have no organization); Charlie creating his own
    # changes the table. Another organization's pool is not found (the routes' 404s here) and
    # never listed (tests/portal/test_pools.py).
    "pools.Pool": "organizations create their own pools",
    # The task outbox: every organization's background work passes through it on its way to the
    # broker (task names and ids only, no tenant's data); Alice's effects are compared above.
    "outbox.OutboxMessage": "everyone's actions record the background work they start",
}


def _platform_models() -> list[type[Model]]:
    return [
        model
        for model in apps.get_models()
        if model.__module__.startswith(("portal.", "compliance."))
        and model not in _tenant_models()
        and model._meta.label not in PLATFORM_CHANGES_BY_DESIGN
    ]


def alice_digest(org: Organization) -> dict[str, str]:
    """`alice_state` (and the platform tables) in one query: the md5 of each table's rows as
    text, in key order."""
    membership = Membership._meta.db_table
    tables = [
        (m._meta.label, m._meta.db_table, m._meta.pk.column, "organization_id = %s") for m in _tenant_models()
    ]
    tables.append(("accounts.Organization", Organization._meta.db_table, "id", "id = %s"))
    tables.append(
        (
            "accounts.User",
            User._meta.db_table,
            "id",
            f'id IN (SELECT user_id FROM "{membership}" WHERE organization_id = %s)',  # noqa: S608
        )
    )
    tables += [(m._meta.label, m._meta.db_table, m._meta.pk.column, "") for m in _platform_models()]
    parts, params = [], []
    # Table and column names come from the models' metadata; values are query parameters.
    for label, table, pk, where in tables:
        parts.append(
            f"SELECT %s, md5(coalesce(string_agg(t::text, ',' ORDER BY t.{pk}), '')) FROM \"{table}\" t"  # noqa: S608
            + (f" WHERE t.{where}" if where else "")
        )
        params += [label, org.pk] if where else [label]
    with rls.platform_transaction(), connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        return dict(cursor.fetchall())


def _markers(state: dict[str, list[tuple[Any, ...]]], w: World) -> set[str]:
    """What must never reach Charlie: every id in Alice's rows, and names that are hers alone."""
    found = {str(v) for rows in state.values() for row in rows for v in row if isinstance(v, uuid.UUID)}
    found |= {
        w.org.name,
        w.org.slug,
        w.alice.email,
        w.bob.email,
        w.sample.name,
        w.job.name,
        w.running_job.name,
        w.endpoint.name,
        w.endpoint.api_key_prefix,
        w.invitation.email,
        w.token.name,
        w.token.prefix,
        w.baa.counterparty,
        w.usage_report.idempotency_key,
        w.bench_report.name,
    }
    return found


@dataclass
class Sweep:
    w: World
    before: dict[str, str]  # alice_digest
    markers: set[str]
    clients: dict[str, Client]
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    done: set[tuple[str, str, str]] = field(default_factory=set)  # (persona, route name, method)
    outcomes: Counter[tuple[str, int]] = field(default_factory=Counter)  # (persona, status) -> count

    def request(
        self,
        persona: str,
        method: str,
        url: str,
        *,
        data: dict[str, Any] | None = None,
        api: bool = False,
        htmx: bool = False,
        query: dict[str, str] | None = None,
    ) -> Any:
        client = self.clients[persona]
        user = {"charlie": self.w.charlie, "bob": self.w.bob, "alice": self.w.alice, "sam": self.w.sam}.get(
            persona
        )
        if user is not None:
            # Each request acts in the persona's home organization (a previous request may have
            # switched it) with two-factor done (the charlie BAA payload makes it required).
            session = client.session
            home = self.w.charlie_org if persona == "charlie" else self.w.org
            session[SESSION_KEY] = str(home.pk)
            session[TWO_FACTOR_KEY] = str(user.pk)
            # And fresh from a password, so a sensitive action is swept, not re-confirmed.
            session[REAUTH_KEY] = {"user": str(user.pk), "at": time.time()}
            session.save()
        extra: dict[str, Any] = {"HTTP_HX_REQUEST": "true"} if htmx else {}
        if query:
            url = f"{url}?{urlencode(query)}"
        has_file = any(isinstance(v, SimpleUploadedFile) for v in (data or {}).values())
        if data is None:
            body: dict[str, Any] = {}
        elif api and not has_file:
            body = {"data": json.dumps(data, default=str), "content_type": "application/json"}
        elif method == "POST":
            body = {"data": data}
        else:
            body = {"data": json.dumps(data, default=str), "content_type": "application/json"}
        return getattr(client, method.lower())(url, **body, **extra)

    def check(
        self,
        persona: str,
        name: str,
        method: str,
        url: str,
        expected: int | frozenset[int] | str | None,
        *,
        data: dict[str, Any] | None = None,
        api: bool = False,
        htmx: bool = False,
        query: dict[str, str] | None = None,
        unchanged: bool = True,
        leaks: bool = True,
    ) -> Any:
        """One request and its assertions; a failure is recorded, and the sweep goes on."""
        self.checks += 1
        self.done.add((persona, name, method))
        label = f"{persona} {method}{' (htmx)' if htmx else ''} {url}{f' ?{query}' if query else ''} [{name}]"
        try:
            response = self.request(persona, method, url, data=data, api=api, htmx=htmx, query=query)
        except Exception as exc:  # a server error: the test client re-raises what the view raised
            frames = traceback.format_exception(exc)[-3:]
            self.failures.append(f"{label}: server error {type(exc).__name__}: {exc}\n{''.join(frames)}")
            self._rebaseline()
            return None
        status = response.status_code
        self.outcomes[persona, status] += 1
        if status >= 500:
            self.failures.append(f"{label}: server error {status}")
        elif expected == LOGIN:
            if api:
                if status not in (401, 403):
                    self.failures.append(f"{label}: {status}, expected 401/403 for an anonymous API call")
            elif status != 302 or not response["Location"].startswith(reverse(django_settings.LOGIN_URL)):
                self.failures.append(
                    f"{label}: {status} {response.get('Location', '')}, expected a redirect to sign in"
                )
        elif expected == OWNER and status in (401, 403, 404, 405):
            self.failures.append(f"{label}: {status}: the owner's request was refused")
        elif isinstance(expected, int) and status != expected:
            self.failures.append(f"{label}: {status}, expected {expected}")
        elif isinstance(expected, frozenset) and status not in expected:
            self.failures.append(f"{label}: {status}, expected one of {sorted(expected)}")
        if leaks and persona in OUTSIDERS:
            self._leaks(label, response, url, data, query)
        if unchanged:
            after = alice_digest(self.w.org)
            changed = sorted(k for k in after if after[k] != self.before.get(k))
            if changed:
                self.failures.append(f"{label}: changed Alice's {', '.join(changed)} (status {status})")
                self.before = after
        return response

    def _leaks(
        self, label: str, response: Any, url: str, data: dict[str, Any] | None, query: dict[str, str] | None
    ) -> None:
        if getattr(response, "streaming", False):
            body = b"".join(response.streaming_content).decode(errors="replace")
        else:
            body = response.content.decode(errors="replace")
        # What the request itself carried coming back (an echo) tells its sender nothing new.
        sent = f"{url} {json.dumps(data or {}, default=str)} {query or ''}"
        seen = sorted(m for m in self.markers if m in body and m not in sent)
        if seen:
            self.failures.append(f"{label}: shows Alice's {seen[:5]} (status {response.status_code})")

    def control(
        self, persona: str, name: str, url: str, expected: Any, *, method: str = "GET", **request: Any
    ) -> None:
        """Alice (or staff) acting on her own objects: proves the URL and payload are real, so
        the others' refusals are refusals. She may change things, so the baseline follows."""
        self.check(persona, name, method, url, expected, unchanged=False, leaks=False, **request)
        self._rebaseline()

    def _rebaseline(self) -> None:
        self.before = alice_digest(self.w.org)


def _expectation(route: Route, persona: str, method: str, is_write: bool, has_object: bool) -> Any:
    """What `persona` gets for a method the route serves."""
    if persona == "anon":
        return LOGIN
    if route.staff_only:
        return 404
    if persona == "bob":
        return route.bob_write if is_write else route.bob_read
    # Charlie (session or token).
    if has_object:
        return 404
    if is_write:
        return route.charlie_write
    return 200


def _undeclared(route: Route, persona: str, method: str, declared: set[str], has_object: bool) -> Any:
    """What `persona` gets for a method the route does not serve: refused, or (a view that does
    not look at the method) what a served one gets. OPTIONS describes an API view, not rows."""
    if persona == "anon":
        return LOGIN
    if method == "OPTIONS":
        return ANY
    allowed = set(REFUSED)
    for served in declared:
        expected = _expectation(route, persona, served, served in route.writes, has_object)
        if expected is ANY:
            return ANY
        allowed |= {expected} if isinstance(expected, int) else set(expected)
    return frozenset(allowed)


def _clients(w: World) -> dict[str, Client]:
    clients = {}
    for persona, user in (("charlie", w.charlie), ("bob", w.bob), ("alice", w.alice), ("sam", w.sam)):
        clients[persona] = Client()
        clients[persona].force_login(user)
    clients["charlie_token"] = Client(HTTP_AUTHORIZATION=f"Bearer {w.charlie_token}")
    clients["anon"] = Client()
    return clients


def _sweep_route(s: Sweep, found: Found, route: Route, schema: dict[str, set[str]]) -> None:
    w = s.w
    api = found.route.startswith(API_PREFIX)
    if api:
        served = schema.get(_shape(found.route), set())
        reads = tuple(m for m in ("GET",) if m in served)
    else:
        reads = route.reads
    writes = dict(route.writes)
    declared = {*reads, *writes}
    variants = route.objects(w) if route.objects else route.shared(w) if route.shared else [{}]
    queries = [None, *(route.queries(w) if route.queries else [])]
    personas = ["anon", "bob", "charlie"] + (["charlie_token"] if api else [])
    for kwargs in variants:
        url = reverse(found.name, kwargs=kwargs)
        if route.objects is not None and "GET" in reads:
            s.control("sam" if route.staff_only else "alice", found.name, url, route.owner_read)
        for persona in personas:
            for method in METHODS:
                is_write = method in writes
                has_object = route.objects is not None
                expected = (
                    _expectation(route, persona, method, is_write, has_object)
                    if method in declared
                    else _undeclared(route, persona, method, declared, has_object)
                )
                data = writes[method](w) if is_write else None
                if method in reads:
                    for query in queries:
                        s.check(persona, found.name, method, url, expected, api=api, query=query)
                    if not api and persona != "anon":
                        s.check(persona, found.name, method, url, expected, htmx=True)
                else:
                    s.check(persona, found.name, method, url, expected, data=data, api=api)
    if route.charlie_objects is not None:
        for kwargs in route.charlie_objects(w):
            url = reverse(found.name, kwargs=kwargs)
            for method, payload in writes.items():
                s.check("charlie", found.name, method, url, route.charlie_write, data=payload(w), api=api)


def _sweep_public(s: Sweep, found: Found) -> None:
    """Public routes: no server error, nothing of Alice's shown or changed, for each persona."""
    kwargs = {k: "sweep-random-secret-0123456789" for k in found.kwargs}
    url = reverse(found.name, kwargs=kwargs)
    api = found.route.startswith(API_PREFIX)
    methods = ("GET", "POST")
    for persona in ("anon", "charlie"):
        for method in methods:
            if found.name == "accounts:logout" and persona != "anon":
                continue  # it would end the session the rest of the sweep uses
            data = {"email": "not-an-email"} if method == "POST" else None
            s.check(
                persona, found.name, method, url, ANY, data=data, api=api, leaks=found.name != "plotly-js"
            )


def _sweep_admin(s: Sweep) -> None:
    """Django's admin is for staff: Charlie and Bob (not staff) are sent to its sign-in page."""
    w = s.w
    urls = [reverse("admin:index")]
    for model, _model_admin in admin.site._registry.items():
        if model in _tenant_models():
            with rls.platform_transaction():
                row = model.objects.filter(organization=w.org).first()
            if row is not None:
                info = (model._meta.app_label, model._meta.model_name)
                urls.append(reverse("admin:{}_{}_changelist".format(*info)))
                urls.append(reverse("admin:{}_{}_change".format(*info), args=[row.pk]))
    login = reverse("admin:login")
    for url in urls:
        for persona in ("charlie", "bob"):
            response = s.check(persona, "admin", "GET", url, 302)
            if response is not None and not response["Location"].startswith(login):
                s.failures.append(
                    f"{persona} GET {url}: sent to {response['Location']}, not the admin sign-in"
                )


def owner_writes(s: Sweep, found: Found, route: Route) -> None:
    """Last, the owner makes every write of an object route herself: never a server error."""
    if route.objects is None:
        return
    for kwargs in route.objects(s.w):
        url = reverse(found.name, kwargs=kwargs)
        for method, payload in route.writes.items():
            owner = "sam" if route.staff_only else "alice"
            api = found.route.startswith(API_PREFIX)
            s.control(owner, found.name, url, OWNER, method=method, data=payload(s.w), api=api)


def run_sweep(w: World, only: set[str] | None = None) -> tuple[Sweep, int]:
    """Sweeps every route (or the named ones); returns the sweep and the number of routes."""
    found = resolver_routes()
    schema = schema_methods()
    problems = coverage_problems(found, schema)
    assert not problems, "\n".join(problems)
    state = alice_state(w.org)
    empty = sorted(label for label, rows in state.items() if not rows)
    assert not empty, f"Alice has no {empty}: build one in the world fixture so the sweep tries it"
    clients = _clients(w)  # signing in touches the users' rows: before the baseline
    sweep = Sweep(w=w, before=alice_digest(w.org), markers=_markers(state, w), clients=clients)
    routes = 0
    for f in found:
        if f.route.startswith(ADMIN_PREFIX) or (only is not None and f.name not in only):
            continue
        routes += 1
        if f.name in PUBLIC_ROUTES:
            _sweep_public(sweep, f)
        else:
            _sweep_route(sweep, f, ROUTES[f.name], schema)
    for f in found:
        if f.name in ROUTES and not f.route.startswith(ADMIN_PREFIX) and (only is None or f.name in only):
            owner_writes(sweep, f, ROUTES[f.name])
    if only is None:
        _sweep_admin(sweep)
        # Every method the schema documents was tried by Charlie and Bob.
        by_shape = {_shape(f.route): f.name for f in found}
        for shape, methods in schema.items():
            if by_shape[shape] in PUBLIC_ROUTES:
                continue
            for persona in ("charlie", "charlie_token", "bob"):
                missing = [m for m in methods if (persona, by_shape[shape], m) not in sweep.done]
                assert not missing, f"{persona} never tried {missing} on {shape}"
    return sweep, routes
