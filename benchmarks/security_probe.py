"""Security probe: the attacks of issue 27, tried over HTTP against a running portal.

Signs up two fresh people through the portal's own API (an owner and an outsider, each with an
organization of their own), signs them in through the sign-in page (a session, CSRF cookie
included) and makes API tokens for them, then tries, as an attacker would:

- sign-in lock-out: failed sign-ins for many unknown addresses, then the owner's correct password;
- unbounded work: tuning jobs at absurd rates, budgets and token counts;
- foreign model folders: another organization's folder under the host's model roots, and
  whether the errors reveal which server paths exist;
- token scope: a token minting tokens, deleting its organization, re-authenticating;
- cross-tenant access: the owner's token, membership and organization through the outsider's
  token and session;
- CSRF and state changes on GET; the Content-Security-Policy of the pages;
- out-of-range months and webhook timestamps (the former 500s);
- two-factor enrolment: loading the page (GET, HEAD) makes no key, a cross-site POST without the
  CSRF token is refused;
- audit-event ids: integers guessed as another tenant's events, and whether the API and the
  exports name events by anything but a UUID;
- SSRF: alert webhooks and benchmark targets at loopback, private, link-local and metadata
  addresses (literal, encoded, IPv6-wrapped) and at names that resolve to loopback (a name that
  answers differently when connected to, DNS rebinding, needs a resolver the probe does not
  control: tests/portal/test_sec_outbound_pinning.py tries that one);
- the endpoints and benchmark-report API: another tenant's endpoint, job and report (read,
  promote, stop, start, metrics, policy, deploy, share links), a viewer-capped token's writes,
  oversized and negative numbers, and a deploy replayed with its Idempotency-Key.

Each attack is a case: its category, what was sent, the status, whether it was refused (the
portal said no, or did nothing harmful), whether anything of the owner's reached the outsider
(leak), and whether the portal answered 5xx. The summary: `attacks`, `leaks`, `server_errors`,
`unrefused`, and per category the same counts.

    .venv/bin/python benchmarks/security_probe.py --base-url http://127.0.0.1:8000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tg_probe .venv/bin/python benchmarks/security_probe.py --serve

The second starts the portal itself, as production runs it: a fresh PostgreSQL database of that
name (dropped and made again, migrated, dropped at the end), gunicorn on `portal.wsgi` with
DEBUG off, the web processes connecting as the application role that row-level security binds;
TLS would end at a proxy, so it speaks HTTP on loopback with secure cookies off. Either way it
writes benchmarks/results/security_probe.json (--results names another file). Run it against a
portal you own: it creates two accounts and a few rows there. The test suite runs it against its
test server (tests/portal/test_security_probe.py), writing to a temporary file.

Some attacks need rows no public route makes (a finished job with a winner, a running endpoint, a
benchmark report, a sales engineer, a token capped below its user's role) and some are judged by
what the database holds afterwards (no two-factor key made, one endpoint per Idempotency-Key).
For those the probe opens the portal's own database through its settings (DATABASE_URL, as the
portal reads it): run it on the portal's host. `--no-database` leaves them out (HTTP only).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts  # noqa: E402
from benchmarks._machine import versions as common_versions  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "security_probe.json"
# Every request of the probe is bounded; a portal that hangs is a finding, not a stuck probe.
TIMEOUT_S = 30.0
# Failed sign-ins for unknown addresses before the owner's own (issue 27 finding 1 used 20).
LOCKOUT_ATTEMPTS = 20
# The longest a correct password may be held back by other people's wrong guesses.
MAX_ACCEPTABLE_WAIT_S = 60


@dataclass
class Case:
    category: str
    attack: str
    status: int
    refused: bool
    leaked: bool = False
    detail: str = ""

    @property
    def server_error(self) -> bool:
        return self.status >= 500


@dataclass
class Person:
    email: str
    password: str
    session: requests.Session
    organization: dict[str, Any] = field(default_factory=dict)
    token: str = ""
    token_id: str = ""


# Customer-supplied URLs that must never be fetched: (what, URL). Literal, encoded and wrapped
# forms of loopback, private, link-local (cloud metadata) and other non-public addresses, and names
# that resolve to loopback (localhost; `loopback_names` adds this machine's own name where it does).
INTERNAL_URLS = (
    ("loopback", "http://127.0.0.1:8000/v1"),
    ("loopback, another address of 127/8", "http://127.0.0.2/v1"),
    ("loopback IPv6", "http://[::1]:8000/v1"),
    ("loopback as IPv4-mapped IPv6", "http://[::ffff:127.0.0.1]/v1"),
    ("loopback as one decimal number", "http://2130706433/v1"),
    ("loopback in hex", "http://0x7f000001/v1"),
    ("loopback in octal", "http://0177.0.0.1/v1"),
    ("unspecified 0.0.0.0", "http://0.0.0.0:8000/v1"),
    ("private 10/8", "http://10.0.0.1/v1"),
    ("private 172.16/12", "https://172.16.0.1/v1"),
    ("private 192.168/16", "http://192.168.1.1/v1"),
    ("carrier-grade NAT 100.64/10", "http://100.64.0.1/v1"),
    ("link-local metadata 169.254.169.254", "http://169.254.169.254/latest/meta-data"),
    ("metadata IPv6 fd00:ec2::254", "http://[fd00:ec2::254]/latest"),
    ("link-local IPv6", "http://[fe80::1]/v1"),
    ("name resolving to loopback: localhost", "http://localhost:8000/v1"),
)
# A public address (example.com's), the control: the same form accepts it, so a refusal above is
# about the address and not about the form.
PUBLIC_URL = "https://93.184.216.34/v1"
# Integers tried as audit-event ids: the sequential key counts every tenant's events.
GUESSED_AUDIT_IDS = (1, 2, 3, 10, 100, 1000)


def loopback_names() -> list[tuple[str, str]]:
    """This machine's own name, where it resolves to loopback (/etc/hosts on many hosts): a name,
    not an address, that the portal must look up and refuse."""
    name = socket.gethostname()
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    except OSError:
        return []
    if not found or not all(str(a).startswith("127.") or a == "::1" for a in found):
        return []
    return [(f"name resolving to loopback: this machine's name {name!r}", f"http://{name}:8000/v1")]


def _error_fields(response: requests.Response) -> set[str]:
    """The fields a 400's body names (DRF: field -> messages)."""
    try:
        body = response.json()
    except ValueError:
        return set()
    return set(body) if isinstance(body, dict) else set()


def _is_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


class Rows:
    """The portal's own database, through its models (the probe's set-up and its judge): rows
    no public route makes, and what the attacks left behind. Django is configured from the
    portal's settings unless the caller (the test suite) already did."""

    def __init__(self) -> None:
        from django.apps import apps

        if not apps.ready:
            import django

            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
            django.setup()

    @staticmethod
    def user(email: str) -> Any:
        from portal.accounts.models import User

        return User.objects.get(email=email)

    @staticmethod
    def organization(person: Person) -> Any:
        from portal.accounts.models import Organization

        return Organization.objects.get(id=person.organization["id"])

    def two_factor_keys(self, person: Person) -> int:
        from compliance.models import TOTPDevice

        return TOTPDevice.objects.filter(user=self.user(person.email)).count()

    def make_sales_engineer(self, person: Person) -> None:
        from portal.accounts.models import User

        User.objects.filter(email=person.email).update(
            is_staff=True, staff_role=User.StaffRole.SALES_ENGINEER
        )

    @staticmethod
    def cap_token(token_id: str, role: str) -> None:
        from portal.accounts.models import ApiToken

        ApiToken.objects.filter(id=token_id).update(role=role)

    def finished_job(self, person: Person, name: str) -> str:
        """A succeeded job with a measured winner (trial 0), as the tuning pipeline leaves it."""
        from portal.jobs.models import ServedModel, Trial, TuningJob
        from portal.traffic.models import TrafficSample
        from serving.engine import EngineConfig

        org, user = self.organization(person), self.user(person.email)
        sample = TrafficSample.objects.create(
            organization=org,
            name="probe calls",
            status=TrafficSample.Status.READY,
            profile={"num_requests": 100},
        )
        model, _ = ServedModel.objects.get_or_create(
            organization=org, name="probe-model", defaults={"path": "/models/probe-model"}
        )
        job = TuningJob.objects.create(
            organization=org,
            name=name,
            traffic_sample=sample,
            served_model=model,
            spec={"slo": "ttft_p50_ms<=600,ttft_p95_ms<=1500"},
            created_by=user,
            status=TuningJob.Status.SUCCEEDED,
            winner_trial=0,
        )
        config = EngineConfig.cpu_default(max_model_len=1024, cpu_kv_cache_space_gib=1).to_mapping()
        Trial.objects.create(
            organization=org,
            job=job,
            number=0,
            assignment={"dtype": "float32"},
            label="dtype=float32",
            status=Trial.Status.DONE,
            result={"config": config, "ttft_p50_ms": 40.0, "ttft_p95_ms": 80.0},
        )
        return str(job.id)

    def running_endpoint(self, person: Person, job_id: str) -> str:
        """A healthy endpoint row serving the job's winner (no engine runs behind it)."""
        from portal.endpoints.models import Endpoint
        from portal.jobs.models import TuningJob

        job = TuningJob.objects.get(id=job_id)
        endpoint = Endpoint.objects.create(
            organization=job.organization,
            served_model=job.served_model,
            job=job,
            name="probe endpoint",
            config={"dtype": "float32", "max_num_seqs": 128},
            status=Endpoint.Status.HEALTHY,
            port=59101,
            api_key_prefix=secrets.token_hex(4),
            api_key_hash=secrets.token_hex(32),
            created_by=self.user(person.email),
        )
        return str(endpoint.id)

    @staticmethod
    def endpoint_state(endpoint_id: str) -> dict[str, Any]:
        from portal.endpoints import policy
        from portal.endpoints.models import Endpoint

        endpoint = Endpoint.objects.get(id=endpoint_id)
        return {
            "status": endpoint.status,
            "api_key_hash": endpoint.api_key_hash,
            "revisions": endpoint.revisions.count(),
            **policy.policy_values(endpoint),
        }

    @staticmethod
    def mark_stopped(endpoint_id: str) -> None:
        from portal.endpoints.models import Endpoint

        Endpoint.objects.filter(id=endpoint_id).update(status=Endpoint.Status.STOPPED)

    @staticmethod
    def share_link(report_id: str) -> str:
        from portal.benchmarks.models import BenchmarkShareLink

        return str(BenchmarkShareLink.objects.filter(report_id=report_id).values_list("id", flat=True).get())

    @staticmethod
    def endpoints_of_job(job_id: str) -> int:
        from portal.endpoints.models import Endpoint

        return Endpoint.objects.filter(job_id=job_id).count()

    def ready_sample(self, person: Person) -> str:
        from portal.traffic.models import TrafficSample

        sample = TrafficSample.objects.create(
            organization=self.organization(person),
            name="probe prospect",
            status=TrafficSample.Status.READY,
            profile={"num_requests": 100, "peak_rps": 2.0},
        )
        return str(sample.id)

    def report(self, person: Person) -> str:
        """A finished benchmark report in the person's organization, with a live share link."""
        from datetime import timedelta

        from django.utils import timezone

        from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink

        org, user = self.organization(person), self.user(person.email)
        report = BenchmarkReport.objects.create(
            organization=org,
            name="probe report",
            sample_name="probe prospect",
            peak_rps=2.0,
            load_multipliers=[1.0],
            duration_s=10.0,
            status=BenchmarkReport.Status.SUCCEEDED,
            created_by=user,
        )
        BenchmarkShareLink.objects.create(
            organization=org,
            report=report,
            token_hash=secrets.token_hex(32),
            created_by=user,
            expires_at=timezone.now() + timedelta(days=7),
        )
        return str(report.id)

    @staticmethod
    def report_state(report_id: str) -> dict[str, Any]:
        from portal.benchmarks.models import BenchmarkReport

        report = BenchmarkReport.objects.get(id=report_id)
        return {
            "status": report.status,
            "links": report.share_links.count(),
            "revoked": report.share_links.filter(revoked_at__isnull=False).count(),
        }

    def audit_keys(self, person: Person) -> set[str]:
        """The sequential keys of the organization's audit events, as text."""
        from compliance.models import AuditEvent

        return {
            str(pk)
            for pk in AuditEvent.objects.filter(organization=self.organization(person)).values_list(
                "pk", flat=True
            )
        }


class Probe:
    def __init__(
        self, base_url: str, *, lockout_attempts: int = LOCKOUT_ATTEMPTS, database: bool = True
    ) -> None:
        self.base = base_url.rstrip("/")
        self.lockout_attempts = lockout_attempts
        self.cases: list[Case] = []
        self.rows: Rows | None = Rows() if database else None

    # --- plumbing -------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return self.base + path

    def record(
        self, category: str, attack: str, response: requests.Response, refused: bool, **kw: Any
    ) -> None:
        self.cases.append(
            Case(category, attack, response.status_code, refused and response.status_code < 500, **kw)
        )

    @staticmethod
    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    @staticmethod
    def csrf(session: requests.Session) -> dict[str, str]:
        return {"X-CSRFToken": session.cookies.get("csrftoken", "")}

    def sign_in(self, session: requests.Session, email: str, password: str) -> requests.Response:
        if "csrftoken" not in session.cookies:
            session.get(self.url("/login/"), timeout=TIMEOUT_S)
        return session.post(
            self.url("/login/"),
            data={
                "username": email,
                "password": password,
                "csrfmiddlewaretoken": session.cookies.get("csrftoken", ""),
            },
            headers={"Referer": self.url("/login/")},
            allow_redirects=False,
            timeout=TIMEOUT_S,
        )

    def person(self, label: str) -> Person:
        email = f"probe-{label}-{secrets.token_hex(4)}@probe.test"
        password = secrets.token_urlsafe(18)
        signup = requests.post(
            self.url("/api/v1/auth/signup/"), json={"email": email, "password": password}, timeout=TIMEOUT_S
        )
        signup.raise_for_status()
        person = Person(email, password, requests.Session())
        signed_in = self.sign_in(person.session, email, password)
        if signed_in.status_code != 302:
            raise RuntimeError(f"{label} could not sign in: {signed_in.status_code}")
        created = person.session.post(
            self.url("/api/v1/organizations/"),
            json={"name": f"Probe {label} {secrets.token_hex(2)}"},
            headers={**self.csrf(person.session), "Referer": self.url("/")},
            timeout=TIMEOUT_S,
        )
        created.raise_for_status()
        person.organization = created.json()
        token = person.session.post(
            self.url("/api/v1/tokens/"),
            json={"name": "probe"},
            headers={**self.csrf(person.session), "Referer": self.url("/")},
            timeout=TIMEOUT_S,
        )
        token.raise_for_status()
        person.token, person.token_id = token.json()["token"], token.json()["id"]
        return person

    def leaks(self, response: requests.Response, owner: Person) -> bool:
        body = response.text
        return any(
            marker and marker in body
            for marker in (owner.email, owner.organization.get("name"), owner.token_id)
        )

    # --- the attacks ----------------------------------------------------------------------

    def lockout(self, owner: Person) -> None:
        session = requests.Session()
        for _ in range(self.lockout_attempts):
            self.sign_in(session, f"nobody-{secrets.token_hex(4)}@probe.test", "wrong-password")
        response = self.sign_in(requests.Session(), owner.email, owner.password)
        wait = re.search(r"Try again in (\d+) seconds", response.text)
        refused = response.status_code == 302 or (
            wait is not None and int(wait.group(1)) <= MAX_ACCEPTABLE_WAIT_S
        )
        detail = (
            "signed in" if response.status_code == 302 else f"held back {wait.group(1) if wait else '?'} s"
        )
        self.record(
            "lockout",
            f"{self.lockout_attempts} failed sign-ins for others, then the owner's password",
            response,
            refused,
            detail=detail,
        )

    def unbounded_jobs(self, owner: Person) -> None:
        base = {
            "name": "probe",
            "traffic_sample": "00000000-0000-0000-0000-000000000000",
            "served_model": "00000000-0000-0000-0000-000000000000",
            "slo": "ttft_p95_ms<=1000",
            "peak_rps": 1.0,
        }
        for name, change in (
            ("peak_rps 1e7", {"peak_rps": 1e7}),
            ("peak_rps 1e300", {"peak_rps": 1e300}),
            ("budget_trials 1e9", {"budget_trials": 10**9}),
            ("max_output_tokens 1e12", {"max_output_tokens": 10**12}),
            ("max_prompt_tokens 2^63", {"max_prompt_tokens": 2**63}),
            ("repeats 1e6", {"repeats": 10**6}),
        ):
            response = requests.post(
                self.url("/api/v1/tuning-jobs/"),
                json={**base, **change},
                headers=self.bearer(owner.token),
                timeout=TIMEOUT_S,
            )
            self.record("unbounded_work", name, response, response.status_code in (400, 404))

    def model_folders(self, owner: Person, outsider: Person) -> None:
        outside = requests.post(
            self.url("/api/v1/models/"),
            json={"name": "probe", "path": "/etc"},
            headers=self.bearer(outsider.token),
            timeout=TIMEOUT_S,
        )
        self.record("model_folders", "a folder outside the model roots", outside, outside.status_code == 400)
        roots = (
            re.findall(r"(/[^\s,\"]+)", outside.json().get("path", [""])[0])
            if outside.status_code == 400
            else []
        )
        slug = owner.organization.get("slug", "")
        for root in roots[:2]:
            for path, what in (
                (f"{root}/orgs/{slug}/model", "the owner's organization folder"),
                (f"{root}/orgs/{slug}/../{slug}/model", "the owner's folder through .."),
                (f"{root}/probe-missing-{secrets.token_hex(3)}", "a folder that does not exist"),
            ):
                response = requests.post(
                    self.url("/api/v1/models/"),
                    json={"name": "probe", "path": path},
                    headers=self.bearer(outsider.token),
                    timeout=TIMEOUT_S,
                )
                text = response.text
                reveals = "does not exist" in text or "no config.json" in text or slug in text
                self.record("model_folders", what, response, response.status_code == 400, leaked=reveals)

    def token_scope(self, owner: Person) -> None:
        headers = self.bearer(owner.token)
        for attack, method, path, body in (
            ("a token mints a token", "post", "/api/v1/tokens/", {"name": "more"}),
            (
                "a token deletes its organization",
                "post",
                "/api/v1/compliance/delete-organization/",
                {"confirm": owner.organization.get("slug")},
            ),
            ("a token re-authenticates", "post", "/api/v1/me/reauthenticate/", {"password": owner.password}),
            (
                "a token switches organization",
                "put",
                "/api/v1/me/active-organization/",
                {"organization": owner.organization.get("id")},
            ),
        ):
            response = getattr(requests, method)(
                self.url(path), json=body, headers=headers, timeout=TIMEOUT_S
            )
            self.record("token_scope", attack, response, response.status_code in (400, 403))

    def cross_tenant(self, owner: Person, outsider: Person) -> None:
        members = requests.get(
            self.url("/api/v1/members/"), headers=self.bearer(owner.token), timeout=TIMEOUT_S
        )
        member_id = members.json()["results"][0]["id"] if members.ok and members.json().get("results") else 1
        attempts: list[tuple[str, Callable[[], requests.Response]]] = []
        for who, auth in (
            ("token", {"headers": self.bearer(outsider.token)}),
            ("session", {"session": outsider.session}),
        ):
            client = auth.get("session") or requests
            headers = auth.get("headers", {}) | (
                {**self.csrf(outsider.session), "Referer": self.url("/")} if who == "session" else {}
            )
            attempts += [
                (
                    f"{who}: read the owner's token",
                    lambda c=client, h=headers: c.get(
                        self.url(f"/api/v1/tokens/{owner.token_id}/"), headers=h, timeout=TIMEOUT_S
                    ),
                ),
                (
                    f"{who}: revoke the owner's token",
                    lambda c=client, h=headers: c.delete(
                        self.url(f"/api/v1/tokens/{owner.token_id}/"), headers=h, timeout=TIMEOUT_S
                    ),
                ),
                (
                    f"{who}: read the owner's membership",
                    lambda c=client, h=headers: c.get(
                        self.url(f"/api/v1/members/{member_id}/"), headers=h, timeout=TIMEOUT_S
                    ),
                ),
                (
                    f"{who}: remove the owner",
                    lambda c=client, h=headers: c.delete(
                        self.url(f"/api/v1/members/{member_id}/"), headers=h, timeout=TIMEOUT_S
                    ),
                ),
                (
                    f"{who}: list tokens",
                    lambda c=client, h=headers: c.get(
                        self.url("/api/v1/tokens/"), headers=h, timeout=TIMEOUT_S
                    ),
                ),
                (
                    f"{who}: switch into the owner's organization",
                    lambda c=client, h=headers: c.put(
                        self.url("/api/v1/me/active-organization/"),
                        json={"organization": owner.organization.get("id")},
                        headers=h,
                        timeout=TIMEOUT_S,
                    ),
                ),
            ]
        for attack, send in attempts:
            response = send()
            harmless = response.status_code in (400, 403, 404) or (
                response.status_code == 200 and "list" in attack
            )
            self.record("cross_tenant", attack, response, harmless, leaked=self.leaks(response, owner))
        still = requests.get(self.url("/api/v1/me/"), headers=self.bearer(owner.token), timeout=TIMEOUT_S)
        self.record(
            "cross_tenant", "the owner's token still works afterwards", still, still.status_code == 200
        )

    def csrf_and_get(self, owner: Person) -> None:
        response = owner.session.post(
            self.url("/tokens/"), data={"name": "csrf"}, allow_redirects=False, timeout=TIMEOUT_S
        )
        self.record("csrf", "create a token without the CSRF token", response, response.status_code == 403)
        api = owner.session.post(self.url("/api/v1/tokens/"), json={"name": "csrf"}, timeout=TIMEOUT_S)
        self.record(
            "csrf",
            "create a token through the API session without the CSRF header",
            api,
            api.status_code == 403,
        )
        for path in (
            "/logout/",
            "/members/1/remove/",
            "/tokens/00000000-0000-0000-0000-000000000000/revoke/",
        ):
            got = owner.session.get(self.url(path), allow_redirects=False, timeout=TIMEOUT_S)
            self.record("state_on_get", f"GET {path}", got, got.status_code in (404, 405))
        alive = owner.session.get(self.url("/dashboard/"), allow_redirects=False, timeout=TIMEOUT_S)
        self.record("state_on_get", "the session survives those GETs", alive, alive.status_code == 200)

    def headers(self, owner: Person) -> None:
        for path in ("/login/", "/dashboard/", "/api/docs/"):
            response = owner.session.get(self.url(path), timeout=TIMEOUT_S)
            policy = response.headers.get("Content-Security-Policy", "")
            scripts = re.search(r"script-src ([^;]*)", policy)
            strict = (
                scripts is not None
                and "'unsafe-inline'" not in scripts.group(1)
                and "frame-ancestors 'none'" in policy
            )
            self.record("headers", f"CSP on {path}", response, strict, detail=policy[:200])

    def bad_input(self, owner: Person) -> None:
        for month in ("0001-01", "9999-12", "2026-13", "x" * 200):
            for path in ("/api/v1/billing/usage/", "/billing/usage/"):
                response = owner.session.get(
                    self.url(path), params={"month": month}, allow_redirects=False, timeout=TIMEOUT_S
                )
                self.record(
                    "bad_input", f"GET {path}?month={month[:12]}", response, response.status_code < 500
                )
        for stamp in ("99999999999999999999", "-1", "nan"):
            response = requests.post(
                self.url("/billing/webhook/"),
                data=b"{}",
                headers={"Stripe-Signature": f"t={stamp},v1={'0' * 64}", "Content-Type": "application/json"},
                timeout=TIMEOUT_S,
            )
            self.record(
                "bad_input",
                f"webhook signed at t={stamp[:12]}",
                response,
                response.status_code in (400, 403, 404),
            )

    def two_factor(self, owner: Person) -> None:
        before = self.rows.two_factor_keys(owner) if self.rows else 0
        for method in ("get", "head", "get"):
            response = getattr(owner.session, method)(
                self.url("/compliance/2fa/"), allow_redirects=False, timeout=TIMEOUT_S
            )
            made = (self.rows.two_factor_keys(owner) if self.rows else 0) - before
            shown = "otpauth://" in response.text
            self.record(
                "two_factor",
                f"{method.upper()} /compliance/2fa/ makes no key",
                response,
                made == 0 and not shown,
                detail=f"keys made: {made}" if self.rows else "database not checked",
            )
        # A page on another site posting with the victim's cookies: no CSRF token, a foreign Origin.
        forged = requests.Session()
        forged.cookies.update(owner.session.cookies)
        for name, data, headers in (
            ("cross-site POST new_key without the CSRF token", {"action": "new_key"}, {}),
            (
                # As if the token had leaked: the foreign Origin alone must refuse it.
                "cross-site POST new_key with a valid CSRF token from a foreign Origin",
                {"action": "new_key", "csrfmiddlewaretoken": owner.session.cookies.get("csrftoken", "")},
                {"Origin": "https://attacker.example", "Referer": "https://attacker.example/"},
            ),
            (
                "cross-site POST verify without the CSRF token",
                {"action": "verify", "code": "000000"},
                {"Origin": "https://attacker.example"},
            ),
        ):
            response = forged.post(
                self.url("/compliance/2fa/"),
                data=data,
                headers=headers,
                allow_redirects=False,
                timeout=TIMEOUT_S,
            )
            made = (self.rows.two_factor_keys(owner) if self.rows else 0) - before
            self.record(
                "two_factor",
                name,
                response,
                response.status_code == 403 and made == 0,
                detail=f"keys made: {made}" if self.rows else "database not checked",
            )

    def _audit_ids(self, response: requests.Response) -> list[str]:
        if "csv" in response.headers.get("Content-Type", ""):
            return [row.get("id", "") for row in csv.DictReader(io.StringIO(response.text))]
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                if "action" in value and "id" in value:
                    found.append(str(value["id"]))
                for inner in value.values():
                    walk(inner)
            elif isinstance(value, list):
                for inner in value:
                    walk(inner)

        with contextlib.suppress(ValueError):
            walk(response.json())
        return found

    def audit_ids(self, owner: Person, outsider: Person) -> None:
        owner_keys = self.rows.audit_keys(owner) if self.rows else set()
        listed = requests.get(
            self.url("/api/v1/compliance/audit-events/"), headers=self.bearer(owner.token), timeout=TIMEOUT_S
        )
        owner_ids = set(self._audit_ids(listed)) if listed.ok else set()
        # Small integers, and the owner's own events' keys: what a guesser would hit first.
        for number in sorted({*GUESSED_AUDIT_IDS, *(int(k) for k in sorted(owner_keys, key=int)[:3])}):
            for path in (
                f"/api/v1/compliance/audit-events/{number}/",
                f"/api/v1/compliance/audit-events/?id={number}",
                f"/api/v1/compliance/audit-events/?seq={number}&organization={owner.organization.get('id')}",
            ):
                response = requests.get(
                    self.url(path), headers=self.bearer(outsider.token), timeout=TIMEOUT_S
                )
                ids = set(self._audit_ids(response)) if response.ok else set()
                leaked = bool(ids & owner_ids) or self.leaks(response, owner)
                self.record(
                    "audit_ids",
                    f"outsider GET {path.replace(str(owner.organization.get('id')), '<owner org>')}",
                    response,
                    response.status_code in (400, 403, 404) or (response.ok and not ids & owner_ids),
                    leaked=leaked,
                )
        for who, person, path in (
            ("owner", owner, "/api/v1/compliance/audit-events/"),
            ("outsider", outsider, "/api/v1/compliance/audit-events/"),
            ("owner", owner, "/api/v1/compliance/audit-export/?export_format=json"),
            ("owner", owner, "/api/v1/compliance/audit-export/?export_format=csv"),
        ):
            response = requests.get(self.url(path), headers=self.bearer(person.token), timeout=TIMEOUT_S)
            ids = self._audit_ids(response) if response.ok else []
            sequential = [i for i in ids if not _is_uuid(i) or i in owner_keys]
            self.record(
                "audit_ids",
                f"{who}: {path} names events only by UUID",
                response,
                response.ok and bool(ids) and not sequential,
                leaked=who == "outsider" and bool(set(ids) & owner_ids),
                detail=f"{len(ids)} ids, {len(sequential)} not UUIDs: {sequential[:3]}",
            )
        # `seq` is shown: it must count the organization's own chain, not every tenant's events.
        mine = requests.get(
            self.url("/api/v1/compliance/audit-events/?limit=500"),
            headers=self.bearer(outsider.token),
            timeout=TIMEOUT_S,
        )
        seqs = sorted(int(e["seq"]) for e in mine.json().get("results", [])) if mine.ok else []
        self.record(
            "audit_ids",
            "outsider: the seq shown counts only the outsider's own events (1, 2, ...)",
            mine,
            bool(seqs) and seqs == list(range(1, len(seqs) + 1)),
            detail=f"seq {seqs[:3]}...{seqs[-1:]} of {len(seqs)} events" if seqs else "no events",
        )
        for fmt in ("json", "csv"):
            # The page's download (a session; answered only where the page is open to the owner).
            page = owner.session.get(
                self.url("/compliance/audit/export/"),
                params={"export_format": fmt},
                allow_redirects=False,
                timeout=TIMEOUT_S,
            )
            ids = self._audit_ids(page) if page.status_code == 200 else []
            sequential = [i for i in ids if not _is_uuid(i) or i in owner_keys]
            self.record(
                "audit_ids",
                f"owner: the audit page's {fmt} download names events only by UUID",
                page,
                page.status_code in (302, 403) or (bool(ids) and not sequential),
                detail=f"{len(ids)} ids, {len(sequential)} not UUIDs"
                if page.status_code == 200
                else f"not downloaded ({page.status_code} {page.headers.get('Location', '')})",
            )

    def ssrf(self, owner: Person, staff: Person | None, sample_id: str) -> None:
        def webhook(url: str) -> requests.Response:
            return requests.post(
                self.url("/api/v1/alerts/channels/"),
                json={
                    "kind": "webhook",
                    "name": f"probe {secrets.token_hex(3)}",
                    "target": url,
                    "kinds": ["endpoint.down"],
                },
                headers=self.bearer(owner.token),
                timeout=TIMEOUT_S,
            )

        def target(url: str) -> requests.Response:
            assert staff is not None
            return requests.post(
                self.url("/api/v1/benchmark-reports/"),
                json={
                    "traffic_sample": sample_id,
                    "load_multipliers": [1.0],
                    "duration_s": 10,
                    "targets": [
                        {
                            "name": "t",
                            "base_url": url,
                            "model": "m",
                            "pricing": "per_token",
                            "price_input_per_mtok_usd": "1",
                            "price_output_per_mtok_usd": "1",
                        }
                    ],
                },
                headers=self.bearer(staff.token),
                timeout=TIMEOUT_S,
            )

        def target_refused(response: requests.Response) -> bool:
            if response.status_code != 400:
                return False
            try:
                problems = response.json().get("targets", [])
            except ValueError:
                return False
            return any("base_url" in str(problem) for problem in problems)

        control = webhook(PUBLIC_URL)
        self.record(
            "ssrf",
            f"control: a webhook at a public address is accepted ({PUBLIC_URL})",
            control,
            control.status_code == 201,
            detail=control.text[:160],
        )
        if control.status_code == 201:
            requests.delete(
                self.url(f"/api/v1/alerts/channels/{control.json()['id']}/"),
                headers=self.bearer(owner.token),
                timeout=TIMEOUT_S,
            )
        for what, url in [*INTERNAL_URLS, *loopback_names()]:
            response = webhook(url)
            refused = response.status_code == 400 and "target" in response.text
            self.record(
                "ssrf", f"alert webhook at {what} ({url})", response, refused, detail=response.text[:160]
            )
            if response.status_code == 201:
                requests.delete(
                    self.url(f"/api/v1/alerts/channels/{response.json()['id']}/"),
                    headers=self.bearer(owner.token),
                    timeout=TIMEOUT_S,
                )
        if staff is None:
            return
        control = target(PUBLIC_URL)
        self.record(
            "ssrf",
            f"control: a benchmark target at a public address passes its check ({PUBLIC_URL})",
            control,
            control.status_code in (201, 400) and not target_refused(control),
            detail=control.text[:160],
        )
        for what, url in [*INTERNAL_URLS, *loopback_names()]:
            response = target(url)
            self.record(
                "ssrf",
                f"benchmark target at {what} ({url})",
                response,
                target_refused(response),
                detail=response.text[:160],
            )

    def endpoints_api(self, owner: Person, outsider: Person) -> None:
        assert self.rows is not None
        rows = self.rows
        job = rows.finished_job(owner, "probe winner")
        other_job = rows.finished_job(owner, "probe second winner")
        deploy_job = rows.finished_job(owner, "probe deploy")
        outsider_job = rows.finished_job(outsider, "probe outsider's job")
        endpoint = rows.running_endpoint(owner, job)
        stopped = rows.running_endpoint(owner, other_job)
        rows.mark_stopped(stopped)
        policy_body = {
            "auto_retune": True,
            "retune_cooldown_s": 3600,
            "retune_max_per_day": 2,
            "retune_budget_trials": 8,
            "detect_window_s": 900,
        }
        attempts = (
            ("read the owner's endpoint", "get", f"/api/v1/endpoints/{endpoint}/", None, {}),
            (
                "promote the owner's endpoint",
                "post",
                f"/api/v1/endpoints/{endpoint}/promote/",
                {"job": other_job},
                {},
            ),
            (
                "promote the owner's endpoint to the outsider's job",
                "post",
                f"/api/v1/endpoints/{endpoint}/promote/",
                {"job": outsider_job},
                {},
            ),
            ("stop the owner's endpoint", "post", f"/api/v1/endpoints/{endpoint}/stop/", None, {}),
            ("start the owner's stopped endpoint", "post", f"/api/v1/endpoints/{stopped}/start/", None, {}),
            (
                "read the owner's endpoint metrics",
                "get",
                f"/api/v1/endpoints/{endpoint}/metrics/?range=7d",
                None,
                {},
            ),
            ("read the owner's endpoint policy", "get", f"/api/v1/endpoints/{endpoint}/policy/", None, {}),
            (
                "replace the owner's endpoint policy",
                "put",
                f"/api/v1/endpoints/{endpoint}/policy/",
                policy_body,
                {},
            ),
            (
                "deploy the owner's job",
                "post",
                f"/api/v1/tuning-jobs/{deploy_job}/deploy/",
                {},
                {"Idempotency-Key": "probe-outsider"},
            ),
        )
        before = {e: rows.endpoint_state(e) for e in (endpoint, stopped)}
        deployed_before = rows.endpoints_of_job(deploy_job)
        for attack, method, path, body, headers in attempts:
            response = getattr(requests, method)(
                self.url(path),
                json=body,
                headers={**self.bearer(outsider.token), **headers},
                timeout=TIMEOUT_S,
            )
            self.record(
                "endpoints_api",
                f"outsider: {attack}",
                response,
                response.status_code == 404,
                leaked=self.leaks(response, owner) or endpoint in response.text,
            )
        listed = requests.get(
            self.url("/api/v1/endpoints/"), headers=self.bearer(outsider.token), timeout=TIMEOUT_S
        )
        self.record(
            "endpoints_api",
            "outsider: list endpoints",
            listed,
            listed.ok and endpoint not in listed.text,
            leaked=endpoint in listed.text or stopped in listed.text,
        )
        after = {e: rows.endpoint_state(e) for e in (endpoint, stopped)}
        self.cases.append(
            Case(
                "endpoints_api",
                "outsider's attempts changed none of the owner's endpoints or jobs",
                0,
                after == before and rows.endpoints_of_job(deploy_job) == deployed_before,
                detail="" if after == before else f"{before} -> {after}",
            )
        )

        # The owner's own token, for the control and the bounds.
        own = self.bearer(owner.token)
        wrong = requests.post(
            self.url(f"/api/v1/endpoints/{endpoint}/promote/"),
            json={"job": outsider_job},
            headers=own,
            timeout=TIMEOUT_S,
        )
        self.record(
            "endpoints_api",
            "owner: promote to another tenant's job",
            wrong,
            wrong.status_code in (400, 404),
            leaked="probe outsider" in wrong.text,
        )
        for name, change in (
            ("retune_cooldown_s -1", {"retune_cooldown_s": -1}),
            ("retune_cooldown_s 1e30", {"retune_cooldown_s": 10**30}),
            ("retune_max_per_day 2^63", {"retune_max_per_day": 2**63}),
            ("retune_budget_trials 1e9", {"retune_budget_trials": 10**9}),
            ("retune_budget_trials -5", {"retune_budget_trials": -5}),
            ("detect_window_s 1e308 (float)", {"detect_window_s": 1e308}),
            ("detect_window_s 0", {"detect_window_s": 0}),
            ("auto_retune a number", {"auto_retune": 10**20}),
        ):
            response = requests.put(
                self.url(f"/api/v1/endpoints/{endpoint}/policy/"),
                json={**policy_body, **change},
                headers=own,
                timeout=TIMEOUT_S,
            )
            self.record(
                "bad_numbers",
                f"policy {name}",
                response,
                response.status_code == 400 and next(iter(change)) in _error_fields(response),
            )
        for query in ("range=-1", "range=99999999999d", "range=1h&range=7d"):
            response = requests.get(
                self.url(f"/api/v1/endpoints/{endpoint}/metrics/?{query}"), headers=own, timeout=TIMEOUT_S
            )
            self.record("bad_numbers", f"GET metrics?{query}", response, response.status_code == 400)
        for query in (
            "limit=-1",
            "limit=0",
            "limit=99999999999999999999",
            "limit=1e3",
            "offset=-1",
            "offset=99999999999999999999",
            "offset=9223372036854775808",
        ):
            for path in ("/api/v1/endpoints/", "/api/v1/compliance/audit-events/"):
                response = requests.get(self.url(f"{path}?{query}"), headers=own, timeout=TIMEOUT_S)
                # An offset past the end is a well-formed question with an empty answer.
                empty = response.status_code == 200 and not response.json().get("results")
                self.record(
                    "bad_numbers",
                    f"GET {path}?{query}",
                    response,
                    response.status_code == 400 or ("offset" in query and empty),
                )
        for name, body, headers in (
            (
                "deploy with a 10,000-character name",
                {"name": "x" * 10_000},
                {"Idempotency-Key": "probe-long-name"},
            ),
            ("deploy with a 256-character Idempotency-Key", {}, {"Idempotency-Key": "k" * 256}),
            ("deploy with a 10,000-character Idempotency-Key", {}, {"Idempotency-Key": "k" * 10_000}),
            ("deploy without an Idempotency-Key", {}, {}),
        ):
            response = requests.post(
                self.url(f"/api/v1/tuning-jobs/{deploy_job}/deploy/"),
                json=body,
                headers={**own, **headers},
                timeout=TIMEOUT_S,
            )
            # 431: the WSGI server's own header limit refuses it before the portal sees it.
            self.record("bad_numbers", name, response, response.status_code in (400, 431))

        # A viewer-capped token of the owner: reads, never writes.
        token = owner.session.post(
            self.url("/api/v1/tokens/"),
            json={"name": "probe viewer"},
            headers={**self.csrf(owner.session), "Referer": self.url("/")},
            timeout=TIMEOUT_S,
        )
        token.raise_for_status()
        rows.cap_token(token.json()["id"], "viewer")
        viewer = self.bearer(token.json()["token"])
        before = {e: rows.endpoint_state(e) for e in (endpoint, stopped)}
        for attack, method, path, body, headers in (
            ("stop", "post", f"/api/v1/endpoints/{endpoint}/stop/", None, {}),
            ("start", "post", f"/api/v1/endpoints/{stopped}/start/", None, {}),
            ("promote", "post", f"/api/v1/endpoints/{endpoint}/promote/", {"job": other_job}, {}),
            (
                "replace the policy",
                "put",
                f"/api/v1/endpoints/{endpoint}/policy/",
                {**policy_body, "auto_retune": False},
                {},
            ),
            (
                "deploy",
                "post",
                f"/api/v1/tuning-jobs/{deploy_job}/deploy/",
                {},
                {"Idempotency-Key": "probe-viewer"},
            ),
            ("mint a token", "post", "/api/v1/tokens/", {"name": "escalate"}, {}),
        ):
            response = getattr(requests, method)(
                self.url(path), json=body, headers={**viewer, **headers}, timeout=TIMEOUT_S
            )
            self.record(
                "viewer_token", f"viewer-capped token: {attack}", response, response.status_code in (403, 404)
            )
        read = requests.get(self.url(f"/api/v1/endpoints/{endpoint}/"), headers=viewer, timeout=TIMEOUT_S)
        self.record(
            "viewer_token",
            "viewer-capped token: reading still works (control)",
            read,
            read.status_code == 200,
        )
        after = {e: rows.endpoint_state(e) for e in (endpoint, stopped)}
        self.cases.append(
            Case(
                "viewer_token",
                "the viewer-capped token changed nothing",
                0,
                after == before and rows.endpoints_of_job(deploy_job) == deployed_before,
                detail="" if after == before else f"{before} -> {after}",
            )
        )

        # A deploy replayed with its Idempotency-Key: one endpoint, however often and however close.
        key = f"probe-{secrets.token_hex(8)}"
        first = requests.post(
            self.url(f"/api/v1/tuning-jobs/{deploy_job}/deploy/"),
            json={},
            headers={**own, "Idempotency-Key": key},
            timeout=TIMEOUT_S,
        )
        again = requests.post(
            self.url(f"/api/v1/tuning-jobs/{deploy_job}/deploy/"),
            json={},
            headers={**own, "Idempotency-Key": key},
            timeout=TIMEOUT_S,
        )
        same = (
            first.status_code == 201
            and again.status_code == 200
            and first.json().get("id") == again.json().get("id")
        )
        made = rows.endpoints_of_job(deploy_job) - deployed_before
        self.record(
            "idempotency",
            "deploy, then the same Idempotency-Key again",
            again,
            same and made == 1 and not again.json().get("api_key"),
            detail=f"{first.status_code}/{again.status_code}, endpoints made: {made}",
        )
        key = f"probe-{secrets.token_hex(8)}"
        answers: list[requests.Response] = []
        barrier = threading.Barrier(4)

        def send() -> None:
            barrier.wait()
            answers.append(
                requests.post(
                    self.url(f"/api/v1/tuning-jobs/{other_job}/deploy/"),
                    json={},
                    headers={**own, "Idempotency-Key": key},
                    timeout=TIMEOUT_S,
                )
            )

        before_count = rows.endpoints_of_job(other_job)
        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        made = rows.endpoints_of_job(other_job) - before_count
        ids = {a.json().get("id") for a in answers if a.status_code in (200, 201)}
        worst = max(answers, key=lambda a: a.status_code)
        self.record(
            "idempotency",
            "four deploys at once with one Idempotency-Key",
            worst,
            made == 1 and len(ids) == 1 and all(a.status_code in (200, 201) for a in answers),
            detail=f"statuses {sorted(a.status_code for a in answers)}, endpoints made: {made}",
        )

    def reports_api(self, owner: Person, outsider: Person, sample_id: str) -> None:
        assert self.rows is not None
        report = self.rows.report(owner)
        before = self.rows.report_state(report)
        link = self.rows.share_link(report)
        for attack, method, path, body in (
            ("read the owner's report", "get", f"/api/v1/benchmark-reports/{report}/", None),
            ("read the owner's report result", "get", f"/api/v1/benchmark-reports/{report}/result/", None),
            (
                "list the owner's report share links",
                "get",
                f"/api/v1/benchmark-reports/{report}/share-links/",
                None,
            ),
            (
                "create a share link to the owner's report",
                "post",
                f"/api/v1/benchmark-reports/{report}/share-links/",
                {},
            ),
            (
                "revoke the owner's share link",
                "delete",
                f"/api/v1/benchmark-reports/{report}/share-links/{link}/",
                None,
            ),
        ):
            response = getattr(requests, method)(
                self.url(path), json=body, headers=self.bearer(outsider.token), timeout=TIMEOUT_S
            )
            self.record(
                "reports_api",
                f"outsider (a sales engineer elsewhere): {attack}",
                response,
                response.status_code == 404,
                leaked=self.leaks(response, owner) or "probe report" in response.text,
            )
        listed = requests.get(
            self.url("/api/v1/benchmark-reports/"), headers=self.bearer(outsider.token), timeout=TIMEOUT_S
        )
        self.record(
            "reports_api",
            "outsider (a sales engineer elsewhere): list reports",
            listed,
            listed.status_code in (200, 404) and report not in listed.text,
            leaked=report in listed.text,
        )
        after = self.rows.report_state(report)
        self.cases.append(
            Case(
                "reports_api",
                "the outsider's attempts changed nothing of the owner's report",
                0,
                after == before,
                detail="" if after == before else f"{before} -> {after}",
            )
        )
        for name, change in (
            ("duration_s 1e308", {"duration_s": 1e308}),
            ("duration_s -1", {"duration_s": -1}),
            ("load_multipliers [1e308]", {"load_multipliers": [1e308]}),
            ("load_multipliers [-1]", {"load_multipliers": [-1]}),
            ("max_output_tokens 2^70", {"max_output_tokens": 2**70}),
            ("request_timeout_s -1", {"request_timeout_s": -1}),
            (
                "price -1",
                {
                    "targets": [
                        {
                            "name": "t",
                            "base_url": PUBLIC_URL,
                            "model": "m",
                            "pricing": "per_token",
                            "price_input_per_mtok_usd": "-1",
                            "price_output_per_mtok_usd": "1e30",
                        }
                    ]
                },
            ),
        ):
            body = {
                "traffic_sample": sample_id,
                "load_multipliers": [1.0],
                "duration_s": 10,
                "targets": [
                    {
                        "name": "t",
                        "base_url": PUBLIC_URL,
                        "model": "m",
                        "pricing": "per_token",
                        "price_input_per_mtok_usd": "1",
                        "price_output_per_mtok_usd": "1",
                    }
                ],
                **change,
            }
            response = requests.post(
                self.url("/api/v1/benchmark-reports/"),
                json=body,
                headers=self.bearer(outsider.token),
                timeout=TIMEOUT_S,
            )
            # The sample is refused too (it has no replayable workload): the field must be named.
            field_named = next(iter(change)) in _error_fields(response)
            self.record(
                "bad_numbers",
                f"benchmark report {name}",
                response,
                response.status_code == 400 and field_named,
                detail=response.text[:160],
            )

    def run(self) -> list[Case]:
        owner, outsider = self.person("owner"), self.person("outsider")
        self.token_scope(owner)
        self.cross_tenant(owner, outsider)
        self.unbounded_jobs(owner)
        self.model_folders(owner, outsider)
        self.csrf_and_get(owner)
        self.headers(owner)
        self.bad_input(owner)
        self.two_factor(owner)
        self.audit_ids(owner, outsider)
        if self.rows is not None:
            # The outsider becomes a sales engineer of their own organization: the strongest
            # stranger for the benchmark routes (to anyone else they are 404 anyway).
            self.rows.make_sales_engineer(outsider)
            sample = self.rows.ready_sample(outsider)
            self.ssrf(owner, outsider, sample)
            self.endpoints_api(owner, outsider)
            self.reports_api(owner, outsider, sample)
        else:
            self.ssrf(owner, None, "")
        # Last: its failed sign-ins must not hold back the rest of the probe's sign-ins.
        self.lockout(owner)
        return self.cases


# --- A portal of its own (--serve) ---------------------------------------------------------------


class Portal:
    """gunicorn serving the portal on a fresh database, as production runs it (see the module
    docstring). The probe's own process gets the same settings, as the tables' owner, so that
    `Rows` sets up and checks what the attacks need."""

    def __init__(self, database_url: str, workers: int = 2) -> None:
        parts = urlsplit(database_url)
        if parts.scheme not in ("postgres", "postgresql") or not parts.path.strip("/"):
            raise SystemExit(f"--serve needs DATABASE_URL naming a PostgreSQL database, not {database_url!r}")
        self.database_url = database_url
        self.name = parts.path.strip("/")
        self.server = urlunsplit(parts._replace(path="/postgres"))
        self.workers = workers
        self.tmp = Path(tempfile.mkdtemp(prefix="tg-security-probe-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def _admin(self, statement: Any) -> None:
        import psycopg

        with psycopg.connect(self.server, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    def environment(self) -> dict[str, str]:
        return {
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DATABASE_URL": self.database_url,
            "SITE_URL": "http://127.0.0.1",
            "SECURE_SSL_REDIRECT": "false",
            "SESSION_COOKIE_SECURE": "false",
            "CSRF_COOKIE_SECURE": "false",
            "TAILGUARD_VAR_DIR": str(self.tmp / "var"),
            "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
            "LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
        }

    def __enter__(self) -> Portal:
        from psycopg import sql

        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        env = self.environment()
        os.environ.update(env)
        os.environ.pop("CELERY_TASK_ALWAYS_EAGER", None)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from portal.accounts import rls

        call_command("migrate", verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("db_app_role", verbosity=0)
        connections.close_all()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        parts = urlsplit(self.database_url)
        web_database = urlunsplit(
            parts._replace(netloc=f"{rls.DEFAULT_APP_ROLE}@{parts.hostname}:{parts.port or 5432}")
        )
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("gunicorn")),
                "portal.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(self.workers),
                "--worker-class",
                "gthread",
                "--threads",
                "4",
                "--timeout",
                "60",
            ],
            cwd=REPO,
            env={**os.environ, **env, "DATABASE_URL": web_database},
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode} before it answered")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/login/", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"gunicorn did not answer {self.url} within 120 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        from django.db import connections

        connections.close_all()
        from psycopg import sql

        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        shutil.rmtree(self.tmp, ignore_errors=True)

    def description(self) -> str:
        return (
            f"gunicorn ({self.workers} workers) on portal.wsgi, DEBUG=false, PostgreSQL database "
            f"{self.name} made for the run, web processes as the row-level-security application role"
        )


def summarise(cases: list[Case]) -> dict[str, Any]:
    def counts(group: list[Case]) -> dict[str, int]:
        return {
            "attacks": len(group),
            "refused": sum(c.refused for c in group),
            "unrefused": sum(not c.refused for c in group),
            "leaks": sum(c.leaked for c in group),
            "server_errors": sum(c.server_error for c in group),
        }

    summary: dict[str, Any] = counts(cases)
    summary["categories"] = {
        name: counts([c for c in cases if c.category == name]) for name in sorted({c.category for c in cases})
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the portal to probe, e.g. http://127.0.0.1:8000")
    where.add_argument(
        "--serve",
        action="store_true",
        help="start a portal of its own on the PostgreSQL database DATABASE_URL names (made afresh, then dropped)",
    )
    parser.add_argument("--results", type=Path, default=RESULT, help=f"where to write (default {RESULT})")
    parser.add_argument(
        "--lockout-attempts",
        type=int,
        default=LOCKOUT_ATTEMPTS,
        choices=range(1, 201),
        metavar="1-200",
        help=f"failed sign-ins before the owner's (default {LOCKOUT_ATTEMPTS}: past the default allowances)",
    )
    parser.add_argument(
        "--no-database",
        action="store_true",
        help="HTTP only: leave out the attacks that need rows set up or checked in the portal's database",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    portal: Portal | None = None
    if args.serve:
        portal = Portal(os.environ.get("DATABASE_URL", ""))
        with portal:
            cases = Probe(
                portal.url, lockout_attempts=args.lockout_attempts, database=not args.no_database
            ).run()
    else:
        cases = Probe(
            args.base_url, lockout_attempts=args.lockout_attempts, database=not args.no_database
        ).run()
    summary = summarise(cases)
    result = {
        "machine": machine_facts().get("description", ""),
        "date": datetime.now(UTC).date().isoformat(),
        **git_state(REPO),
        "versions": common_versions("django", "djangorestframework", "requests", "gunicorn", "psycopg"),
        "portal": portal.description() if portal is not None else f"running at {args.base_url}",
        "command": "benchmarks/security_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "duration_s": round(time.monotonic() - started, 1),
        "summary": summary,
        "cases": [{**asdict(c), "server_error": c.server_error} for c in cases],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{summary['attacks']} attacks: {summary['unrefused']} unrefused, {summary['leaks']} leaks, "
        f"{summary['server_errors']} server errors -> {args.results}"
    )
    for case in cases:
        if not case.refused or case.leaked:
            print(f"  {case.category}: {case.attack}: {case.status} {case.detail}")
    return 0 if not (summary["unrefused"] or summary["leaks"] or summary["server_errors"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
