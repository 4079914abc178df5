"""Issue 27, finding 13: `month=0001-01` or `9999-12` on the SLA and billing usage views was an
unhandled 500 (no month before or after); now a 400 that says which months are accepted."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from compliance import sla
from portal.billing.usage import parse_month
from tests.factories import SLA_TERMS, api_client, deployed_endpoint
from tests.portal.billing import enable_billing

EDGE_MONTHS = ["0001-01", "9999-12", "0000-06", "1999-12", "3000-01"]


@pytest.mark.parametrize("value", EDGE_MONTHS)
def test_parsers_refuse_months_without_neighbours(value: str) -> None:
    with pytest.raises(ValueError, match="2000"):
        sla.parse_month(value)
    with pytest.raises(ValueError, match="2000"):
        parse_month(value)


def test_parsers_accept_the_range() -> None:
    assert sla.parse_month("2000-01").year == 2000 and parse_month("2999-12").month == 12
    assert sla.parse_month("2026-3").month == 3  # what the earlier strptime accepted


@pytest.mark.django_db
def test_sla_api_answers_400_for_edge_months(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    url = f"/api/v1/compliance/endpoints/{endpoint.id}/sla/"
    assert api_client(alice).put(url, SLA_TERMS, format="json").status_code == 200
    for value in ("0001-01", "9999-12"):
        response = api_client(alice).get(url, {"month": value})
        assert response.status_code == 400, (value, response.status_code)
        assert "2000-01 to 2999-12" in str(response.json())


@pytest.mark.django_db
def test_billing_usage_answers_400_for_edge_months(alice, alice_client, settings: Any) -> None:  # type: ignore[no-untyped-def]
    enable_billing(settings)
    for value in ("0001-01", "9999-12"):
        page = alice_client.get(reverse("billing:usage"), {"month": value})
        assert page.status_code == 400 and b"out of range" in page.content
        api = api_client(alice).get("/api/v1/billing/usage/", {"month": value})
        assert api.status_code == 400 and "out of range" in str(api.json())
