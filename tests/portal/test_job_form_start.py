"""The job form starts from the customer's own traffic (issue 24 item 4): the sample asked for
(or the only one) and its busiest minute as the peak to hold, with every sample's percentiles
beside the form, where the caps default from."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from portal.traffic.models import TrafficSample

pytestmark = pytest.mark.django_db


def _sample(org, name: str, peak: float, prompt_p99: float) -> TrafficSample:  # type: ignore[no-untyped-def]
    profile = {
        "num_requests": 500,
        "arrival": {"peak_rps_60s": peak, "mean_rps": peak / 3},
        "input_tokens": {"p50": prompt_p99 / 4, "p99": prompt_p99},
        "output_tokens": {"p50": 120.0, "p99": 410.0},
    }
    return TrafficSample.objects.create(
        organization=org, name=name, status=TrafficSample.Status.READY, profile=profile
    )


def _value(html: str, field: str) -> str | None:
    found = re.search(rf'<input[^>]*name="{field}"[^>]*>', html)
    assert found is not None, field
    value = re.search(r'value="([^"]*)"', found[0])
    return value[1] if value else None


def _selected(html: str) -> str | None:
    select = re.search(r'<select[^>]*name="traffic_sample".*?</select>', html, re.S)
    assert select is not None
    chosen = re.search(r'<option value="([^"]+)"[^>]*selected', select[0])
    return chosen[1] if chosen else None


def test_the_form_starts_from_the_sample_and_its_busiest_minute(alice_org, alice_client, charlie) -> None:  # type: ignore[no-untyped-def]
    url = reverse("jobs:list")
    calls = _sample(alice_org, "calls", 2.4567, 3000.0)
    html = alice_client.get(url).content.decode()
    # The only sample: chosen, with its busiest minute as the peak.
    assert _selected(html) == str(calls.id) and _value(html, "peak_rps") == "2.457"
    chat = _sample(alice_org, "chat", 0.5, 800.0)
    html = alice_client.get(url).content.decode()
    assert _selected(html) is None and _value(html, "peak_rps") is None  # two: the customer picks
    facts = re.search(r'<table id="sample-facts">.*?</table>', html, re.S)
    assert facts is not None
    assert "2.457 req/s" in facts[0] and "750 / 3000" in facts[0] and "120 / 410" in facts[0]
    assert f'href="?sample={chat.id}#job-form"' in facts[0]
    html = alice_client.get(url, {"sample": str(chat.id)}).content.decode()
    assert _selected(html) == str(chat.id) and _value(html, "peak_rps") == "0.5"
    # Another tenant's sample or a mangled link starts the form empty, as without one.
    theirs = _sample(charlie.memberships.get().organization, "theirs", 9.0, 100.0)
    for other in (str(theirs.id), "not-a-uuid"):
        html = alice_client.get(url, {"sample": other}).content.decode()
        assert _selected(html) is None and _value(html, "peak_rps") is None and "theirs" not in html
    page = alice_client.get(reverse("traffic:detail", args=[calls.id])).content.decode()
    assert f'href="{url}?sample={calls.id}#job-form"' in page
