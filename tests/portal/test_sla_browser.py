"""In Chromium: the provider proposes an endpoint's SLA terms (prefilled from the tuning job's
SLO and peak rate), the customer's owner reads and signs them, and both see them in force; the
owner then adds an alert channel for SLA breaches."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from portal.accounts import services as account_services
from portal.accounts.models import User
from portal.alerts.models import AlertChannel
from portal.sla.models import SLAAgreement
from tests.browser import sign_in, watched
from tests.conftest import PASSWORD
from tests.portal.sla import make_endpoint

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_provider_proposes_and_the_customer_signs_sla_terms_in_the_browser(
    live_server: Any,
    page_factory: Any,
) -> None:
    owner = account_services.user_signup(email="nora@northwind.test", password=PASSWORD)
    org = account_services.organization_create(actor=owner, name="Northwind Health")
    endpoint = make_endpoint(org, owner)
    User.objects.create_user(
        email="pat@tailguard.test", password=PASSWORD, staff_role=User.StaffRole.PLATFORM_ADMIN
    )
    problems: list[str] = []

    provider = watched(page_factory(), problems)
    sign_in(provider, live_server.url, "pat@tailguard.test", PASSWORD)
    provider.goto(live_server.url + reverse("sla:endpoint", args=[endpoint.pk]))
    # The provider's form starts from the job: p50 600 ms, p95 1500 ms, 4 req/s.
    assert provider.input_value("input[name=ttft_p50_ms]") == "600.0"
    assert provider.input_value("input[name=peak_rps]") == "4.0"
    provider.fill("input[name=monthly_fee_cents]", "250000")
    provider.click("#propose-form button:has-text('Propose a new version')")
    provider.wait_for_selector("text=Version 1 proposed")
    assert "awaited" in (provider.text_content("#proposal") or "")

    customer = watched(page_factory(), problems)
    sign_in(customer, live_server.url, "nora@northwind.test", PASSWORD)
    customer.goto(live_server.url + reverse("sla:overview"))
    customer.click(f"a[href='{reverse('sla:endpoint', args=[endpoint.pk])}']")
    proposal = customer.text_content("#proposal") or ""
    assert "TTFT p50 at most 600.0 ms" in proposal and "Up to 4.0 requests/s" in proposal
    # The customer's form has no credit terms to edit.
    assert customer.locator("#propose-form input[name=credit_tiers]").count() == 0
    customer.click("#sign-form button")
    customer.wait_for_selector("text=signed by both sides: it is in force")
    in_force = customer.text_content("#in-force") or ""
    assert "signed by pat@tailguard.test (provider) and nora@northwind.test (customer)" in in_force
    agreement = SLAAgreement.objects.get()
    assert agreement.status == "in_force" and agreement.monthly_fee_cents == 250_000

    # Who hears about a breach: an e-mail channel for SLA alerts.
    customer.goto(live_server.url + reverse("alerts:overview"))
    customer.fill("#channel-form input[name=name]", "on-call")
    customer.fill("#channel-form input[name=target]", "oncall@northwind.test")
    for box in customer.locator("#channel-form input[name=kinds]").all():
        if box.get_attribute("value") not in ("sla.breached", "sla.at_risk"):
            box.uncheck()
    customer.click("#channel-form button")
    customer.wait_for_selector("text=Alert channel on-call added.")
    assert re.search(r"on-call", customer.text_content("#channels") or "")
    assert AlertChannel.objects.get().kinds == ["sla.at_risk", "sla.breached"]
    assert problems == []
