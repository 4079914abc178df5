"""Error pages keep the site's navigation, say what to do next, and show nothing internal."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from portal.jobs.models import TuningJob
from tests.factories import finished_job

pytestmark = pytest.mark.django_db

NAV = '<a href="/traffic/">Traffic</a>'


@pytest.mark.parametrize("debug", [False, True])
def test_an_unknown_address_gets_the_site_404_page_with_or_without_debug(
    alice_client, settings, debug
) -> None:  # type: ignore[no-untyped-def]
    settings.DEBUG = debug
    response = alice_client.get("/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "We can't find that page" in html and NAV in html
    assert "URLconf" not in html and "portal.urls" not in html and "healthz" not in html
    # The API keeps answering in JSON.
    api = alice_client.get("/api/v1/no-such-thing/")
    assert api.status_code == 404 and api.json() == {"detail": "Not found."}
    # Signed out, the page offers to sign in instead.
    anonymous = Client().get("/no-such-page/").content.decode()
    assert 'href="/login/"' in anonymous and NAV not in anonymous


@pytest.mark.parametrize("debug", [False, True])
def test_a_view_that_finds_nothing_gets_the_site_404_page_with_or_without_debug(
    alice, alice_org, alice_client, charlie_client, settings, debug
) -> None:  # type: ignore[no-untyped-def]
    settings.DEBUG = debug
    job = finished_job(alice_org, alice)
    # Another tenant's job answers exactly like a missing one: the view raises Http404.
    for client, job_id in ((charlie_client, job.id), (alice_client, "00000000-0000-0000-0000-000000000000")):
        response = client.get(reverse("jobs:detail", args=[job_id]))
        html = response.content.decode()
        assert response.status_code == 404
        assert "We can't find that page" in html and NAV in html
        assert "Raised by" not in html and "TuningJob" not in html and "portal.jobs" not in html


def test_a_crash_shows_the_site_500_page_without_the_exception(alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ROOT_URLCONF = "tests.portal.crash_urls"
    alice_client.raise_request_exception = False
    response = alice_client.get("/crash-for-test/")
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on our side" in html and NAV in html
    assert "secret-internal-detail" not in html and "RuntimeError" not in html
    api = alice_client.get("/api/v1/crash-for-test/")
    assert api.status_code == 500 and "secret" not in api.content.decode()
    assert api.json()["detail"].startswith("Server error")


def test_when_the_database_broke_the_500_page_is_plain_but_still_a_page(alice_client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ROOT_URLCONF = "tests.portal.crash_urls"
    alice_client.raise_request_exception = False
    response = alice_client.get("/crash-in-the-database/")
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on our side" in html and 'href="/dashboard/"' in html
    assert "secret_internal_table" not in html and "ProgrammingError" not in html
    assert NAV not in html  # the plain page: the site's one needs the database it lost
    # The next request is served normally.
    assert alice_client.get(reverse("accounts:dashboard")).status_code == 200


def test_a_role_refusal_says_why_and_who_can_change_it(bob_client) -> None:  # type: ignore[no-untyped-def]
    before = TuningJob.objects.count()
    response = bob_client.post(reverse("jobs:list"), {"name": "x"})
    html = response.content.decode()
    assert response.status_code == 403
    assert "Only a member or above can start tuning jobs." in html and NAV in html
    assert "<strong>viewer</strong>" in html and 'href="/members/"' in html
    assert TuningJob.objects.count() == before


def test_an_expired_form_explains_itself(alice) -> None:  # type: ignore[no-untyped-def]
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("accounts:organization_create"), {"name": "Second"})
    html = response.content.decode()
    assert response.status_code == 403
    assert "That form had expired" in html and NAV in html and "CSRF verification" not in html
    assert alice.memberships.count() == 1
