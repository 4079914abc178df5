"""No state change on GET, and none on POST without the CSRF token (issue 27 finding 14).

Alice, the owner (the persona that may change most), reads every route of the isolation sweep's
world; no row of her organization or of the platform tables may change, except the access
records the audit trail keeps of reads (an export is audited). Then, with a browser's CSRF
checks on, every write of every HTML and session-API route is sent without the token: each is
refused with 403 and again nothing changes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from compliance.middleware import TWO_FACTOR_KEY
from compliance.models import AuditEvent
from portal.accounts.reauth import SESSION_KEY as REAUTH_KEY
from portal.accounts.tenancy import SESSION_KEY
from tests.portal.sweep import (
    API_PREFIX,
    PUBLIC_ROUTES,
    ROUTES,
    World,
    alice_digest,
    resolver_routes,
)

pytestmark = pytest.mark.django_db

# Reads that the audit trail records as reads: a new event of these actions is not a change.
# (An evidence pack is a read of the audit trail and more: recorded like an export.)
ACCESS_RECORDS = {"audit.export", "staff.access", "benchmark.share_view", "compliance.evidence_pack"}
# Routes whose GET still changes something, each with the reason it is not fixed here.
KNOWN_GET_CHANGES: dict[str, str] = {}


def _client(w: World, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(w.alice)
    session = client.session
    session[SESSION_KEY] = str(w.org.pk)
    session[TWO_FACTOR_KEY] = str(w.alice.pk)
    session[REAUTH_KEY] = {"user": str(w.alice.pk), "at": time.time()}
    session.save()
    return client


def _urls(w: World) -> list[tuple[str, str, Any]]:
    """(route name, URL, ROUTES entry or None) for every route the sweep can build."""
    out = []
    for found in resolver_routes():
        route = ROUTES.get(found.name)
        if route is None:
            if found.name in PUBLIC_ROUTES and not found.kwargs:
                out.append((found.name, reverse(found.name), None))
            continue
        builder = route.objects or route.shared
        for kwargs in builder(w) if builder else [{}]:
            out.append((found.name, reverse(found.name, kwargs=kwargs), route))
    return out


def _changes(w: World, before: dict[str, str], events_before: int) -> list[str]:
    after = alice_digest(w.org)
    changed = [label for label in after if after[label] != before.get(label)]
    if "compliance.AuditEvent" in changed:
        new = AuditEvent.objects.filter(organization=w.org).order_by("pk")[events_before:]
        if all(event.action in ACCESS_RECORDS for event in new):
            changed.remove("compliance.AuditEvent")
    return changed


def _no_route_changes_anything_on_get(w: World) -> None:
    client = _client(w)
    problems, tried = [], 0
    for name, url, _route in _urls(w):
        if name in KNOWN_GET_CHANGES:
            continue
        for method in ("get", "head"):
            before = alice_digest(w.org)
            events = AuditEvent.objects.filter(organization=w.org).count()
            response = getattr(client, method)(url)
            tried += 1
            assert response.status_code < 500, (method, url, response.status_code)
            changed = _changes(w, before, events)
            if changed:
                problems.append(f"{method.upper()} {url} ({name}) changed {', '.join(changed)}")
    assert tried > 100
    assert not problems, "\n".join(problems)


def _no_write_is_accepted_without_the_csrf_token(w: World) -> None:
    client = _client(w, csrf=True)
    problems, tried = [], 0
    for name, url, route in _urls(w):
        if route is None or name.startswith("admin:"):
            continue
        for method, payload in route.writes.items():
            before = alice_digest(w.org)
            events = AuditEvent.objects.filter(organization=w.org).count()
            data = payload(w)
            has_file = any(isinstance(v, SimpleUploadedFile) for v in data.values())
            if method == "POST" and (has_file or not url.startswith("/" + API_PREFIX)):
                response = client.post(url, data=data)
            elif url.startswith("/" + API_PREFIX):
                body = json.dumps(data, default=str)
                response = getattr(client, method.lower())(url, data=body, content_type="application/json")
            else:
                response = getattr(client, method.lower())(url)
            tried += 1
            if response.status_code != 403:
                problems.append(
                    f"{method} {url} ({name}) answered {response.status_code} without a CSRF token"
                )
            changed = _changes(w, before, events)
            if changed:
                problems.append(f"{method} {url} ({name}) changed {', '.join(changed)} without a CSRF token")
    assert tried > 30
    assert not problems, "\n".join(problems)


def test_no_state_change_on_get_and_none_without_the_csrf_token(world: World) -> None:
    # One world for both sweeps: building it is most of the time.
    _no_route_changes_anything_on_get(world)
    _no_write_is_accepted_without_the_csrf_token(world)
