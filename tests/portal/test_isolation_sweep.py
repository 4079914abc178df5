"""Isolation sweep: every route, tried by Charlie and Bob against Alice's objects of every kind.

The routes come from the URL resolver (walked recursively: the API's and the admin's included)
and from the OpenAPI schema, so a new route is swept as soon as it exists. Every named route
needs an entry in ROUTES saying how to build its URL arguments from Alice's objects and, for
each write it serves, a payload that would be valid for Alice (so a refusal is a refusal, not a
form error); or a line in PUBLIC_ROUTES saying why it has nothing of a tenant's to protect. A
route in neither, or an API method without a payload, fails the sweep with its name.

Each route is tried with every method (the ones it serves and the rest), as:
- Charlie, owner of another organization, by session and by API token: Alice's objects answer
  404, and no body he receives shows any of Alice's ids or names (lists and exports included);
- Bob, a viewer in Alice's organization: reads as declared (200, or 403 where a viewer may not
  read), every write 403;
- an anonymous visitor: a redirect to sign in (401 or 403 from the API);
and after every request, every row of every table with an `organization` key that belongs to
Alice's organization (the world fixture builds at least one of each, or the sweep fails), and
every platform table, is compared field by field with what it was before. Any 5xx fails.
Alice (staff, for the staff tools) reads every object route as a control, so the arguments are
real and a 404 means a refusal; at the end she makes every write of those routes herself, with
the same payloads: never refused, never a server error. Django's admin is for staff: a login
redirect for both Charlie and Bob.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.shortcuts import get_object_or_404

from portal.accounts import rls
from portal.traffic.models import TrafficSample
from tests.db_roles import application_role
from tests.portal.sweep import (
    MIN_CHECKS,
    MIN_ROUTES,
    Found,
    World,
    coverage_problems,
    resolver_routes,
    run_sweep,
    schema_methods,
)

# Database roles are the PostgreSQL cluster's, not one test database's: every test that makes
# them runs on one xdist worker (`--dist loadgroup`), never two at once.
pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("db_roles")]


def test_every_route_is_mapped_or_public() -> None:
    problems = coverage_problems(resolver_routes(), schema_methods())
    assert not problems, "\n".join(problems)


def test_an_unmapped_route_fails_the_coverage_check() -> None:
    found = resolver_routes()
    schema = schema_methods()
    extra = Found("widgets/<uuid:widget_id>/", "widgets:detail", ("widget_id",))
    problems = coverage_problems([*found, extra], schema)
    assert problems == [
        "route widgets:detail (widgets/<uuid:widget_id>/) has no entry in ROUTES (how to build Alice's "
        "object for it) and is not in PUBLIC_ROUTES"
    ]
    # An API method the schema documents without a payload in ROUTES fails too.
    schema = {**schema, "/api/v1/tokens/{}/": schema["/api/v1/tokens/{}/"] | {"PATCH"}}
    assert coverage_problems(found, schema) == [
        "PATCH /api/v1/tokens/{}/ (api:token_detail) is in the schema but ROUTES has no payload for it"
    ]


def test_isolation_sweep(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    sweep, routes = run_sweep(world)
    with capsys.disabled():
        print(f"\nisolation sweep: {sweep.checks} checks over {routes} routes (+ the admin)")
        for persona in ("charlie", "charlie_token", "bob", "anon", "alice", "sam"):
            statuses = sorted((status, n) for (who, status), n in sweep.outcomes.items() if who == persona)
            print(f"  {persona}: " + ", ".join(f"{n}x{status}" for status, n in statuses))
    if sweep.failures:
        pytest.fail(f"{len(sweep.failures)} failures:\n" + "\n".join(sweep.failures), pytrace=False)
    assert sweep.checks >= MIN_CHECKS and routes >= MIN_ROUTES, (sweep.checks, routes)


TRAFFIC_ROUTES = {"traffic:list", "traffic:detail", "api:traffic_samples", "api:traffic_sample_detail"}


def _plant_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traffic pages with their tenant checks taken out: an HTML view that looks objects up by
    id alone, an API base class that forgets the organization, and a list that shows every
    tenant's samples."""
    from portal.restkit.base import TenantScopedMixin
    from portal.traffic import selectors as traffic_selectors
    from portal.traffic import views as traffic_views

    monkeypatch.setattr(
        traffic_views, "get_object_for_member", lambda request, qs, pk: get_object_or_404(qs, pk=pk)
    )
    monkeypatch.setattr(TenantScopedMixin, "get_queryset", lambda self: self.tenant_queryset())
    monkeypatch.setattr(
        traffic_selectors, "traffic_sample_list", lambda *, organization: TrafficSample.objects.all()
    )


def test_the_sweep_reports_planted_leaks(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep against traffic pages with their tenant checks taken out: it must say so."""
    _plant_leaks(monkeypatch)
    sweep, _routes = run_sweep(world, only=TRAFFIC_ROUTES)
    sample = world.sample.pk
    report = "\n".join(sweep.failures)
    assert f"charlie GET /traffic/{sample}/ [traffic:detail]: 200, expected 404" in report
    assert (
        f"charlie GET /api/v1/traffic-samples/{sample}/ [api:traffic_sample_detail]: 200, expected 404"
        in report
    )
    assert f"charlie_token GET /api/v1/traffic-samples/{sample}/ [api:traffic_sample_detail]: 200" in report
    assert "charlie GET /traffic/ [traffic:list]: shows Alice's" in report
    assert "charlie GET /api/v1/traffic-samples/ [api:traffic_samples]: shows Alice's" in report


# --- Through the application role: the second wall ------------------------------------------------


@pytest.fixture
def as_app_role(world: World) -> Iterator[None]:
    """After the world is built (as the suite's superuser), every request, and every read the
    sweep makes, connects as the role production's web processes use."""
    with application_role():
        yield


@pytest.mark.django_db(transaction=True)
def test_isolation_sweep_through_the_application_role(
    world: World, as_app_role: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole sweep again, with row-level security binding every query: every owner's
    control and write still works (the requests set their tenant), and nothing leaks."""
    sweep, routes = run_sweep(world)
    with capsys.disabled():
        print(f"\nisolation sweep as {rls.DEFAULT_APP_ROLE}: {sweep.checks} checks over {routes} routes")
    if sweep.failures:
        pytest.fail(f"{len(sweep.failures)} failures:\n" + "\n".join(sweep.failures), pytrace=False)
    assert sweep.checks >= MIN_CHECKS and routes >= MIN_ROUTES, (sweep.checks, routes)


@pytest.mark.django_db(transaction=True)
def test_row_level_security_stops_the_planted_leaks(
    world: World, as_app_role: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same forgotten filters as above, through the application role: the database returns
    nothing of Alice's to Charlie, so the sweep finds no leak at all."""
    _plant_leaks(monkeypatch)
    sweep, _routes = run_sweep(world, only=TRAFFIC_ROUTES)
    assert sweep.failures == []
    # Alice's own requests (the controls) still found her sample: the wall hid only Charlie's view.
    assert sweep.outcomes["alice", 200] >= 1
