"""The dashboard's first-steps checklist follows what the organization has really done."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from portal.endpoints.models import Endpoint
from portal.jobs.models import ServedModel, TuningJob
from portal.traffic.models import TrafficSample

pytestmark = pytest.mark.django_db


def _states(client) -> dict[str, str]:  # type: ignore[no-untyped-def]
    page = client.get(reverse("accounts:dashboard"))
    assert page.status_code == 200
    html = page.content.decode()
    return dict(re.findall(r'<li id="step-([a-z-]+)" class="[^"]*" data-state="([a-z]+)"', html))


def _next(client) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The highlighted step and where its button leads."""
    html = client.get(reverse("accounts:dashboard")).content.decode()
    match = re.search(
        r'<li id="step-([a-z-]+)" class="[^"]*step-next".*?<a class="button" href="([^"]+)"', html, re.S
    )
    assert match, "no next step on the dashboard"
    return match.group(1), match.group(2)


def test_the_checklist_advances_with_real_state_and_ignores_other_tenants(  # type: ignore[no-untyped-def]
    alice, alice_org, alice_client, bob_client, charlie
) -> None:
    assert _states(alice_client) == {
        "organization": "done",
        "sample-uploaded": "todo",
        "sample-ready": "todo",
        "model": "todo",
        "job": "todo",
        "endpoint": "todo",
    }
    assert _next(alice_client) == ("sample-uploaded", reverse("traffic:list") + "#upload-form")

    # Another organization's progress never shows here.
    other_org = charlie.memberships.get().organization
    TrafficSample.objects.create(organization=other_org, name="theirs", status=TrafficSample.Status.READY)
    assert _states(alice_client)["sample-uploaded"] == "todo"

    sample = TrafficSample.objects.create(
        organization=alice_org, name="calls", status=TrafficSample.Status.VALIDATING
    )
    states = _states(alice_client)
    assert (states["sample-uploaded"], states["sample-ready"]) == ("done", "working")
    assert _next(alice_client) == ("sample-ready", reverse("traffic:detail", args=[sample.id]))

    TrafficSample.objects.filter(pk=sample.pk).update(status=TrafficSample.Status.FAILED, error="line 3: bad")
    assert _states(alice_client)["sample-ready"] == "failed"
    assert "could not be read" in alice_client.get(reverse("accounts:dashboard")).content.decode()

    TrafficSample.objects.filter(pk=sample.pk).update(status=TrafficSample.Status.READY)
    assert _states(alice_client)["sample-ready"] == "done"
    assert _next(alice_client) == ("model", reverse("jobs:list") + "#model-form")

    model = ServedModel.objects.create(organization=alice_org, name="llama-8b", path="/models/llama-8b")
    assert _next(alice_client) == ("job", reverse("jobs:list") + "#job-form")

    job = TuningJob.objects.create(
        organization=alice_org,
        name="first",
        traffic_sample=sample,
        served_model=model,
        spec={},
        status=TuningJob.Status.RUNNING,
    )
    assert _states(alice_client)["job"] == "working"
    assert _next(alice_client) == ("job", reverse("jobs:detail", args=[job.id]))
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.SUCCEEDED, winner_trial=0)
    assert _states(alice_client)["job"] == "done"
    assert _next(alice_client) == ("endpoint", reverse("jobs:detail", args=[job.id]) + "#deploy-form")

    endpoint = Endpoint.objects.create(
        organization=alice_org,
        name="voice",
        served_model=model,
        job=job,
        config={},
        port=18_123,
        api_key_prefix="x",
        api_key_hash="y",
        status=Endpoint.Status.STARTING,
    )
    assert _states(alice_client)["endpoint"] == "working"
    # A viewer of the organization sees the same progress.
    assert _states(bob_client)["endpoint"] == "working"

    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.HEALTHY)
    # All done: the checklist steps aside.
    page = alice_client.get(reverse("accounts:dashboard")).content.decode()
    assert 'id="onboarding"' not in page and "Recent activity" in page


def test_pages_a_first_time_user_reads_explain_their_numbers_and_empty_states(  # type: ignore[no-untyped-def]
    alice_org, alice_client, bob_client, shared_traces
) -> None:
    from tuning.workload import ingest_path

    jobs_page = alice_client.get(reverse("jobs:list")).content.decode()
    assert "A job needs a profiled traffic sample and a registered model" in jobs_page
    assert "Register one below" in jobs_page
    # A viewer cannot register models, so the page tells them who can.
    assert (
        "An owner or admin of the organization registers models"
        in bob_client.get(reverse("jobs:list")).content.decode()
    )
    assert "can upload one" in bob_client.get(reverse("traffic:list")).content.decode()

    profile = ingest_path(str(shared_traces / "mooncake_synthetic.jsonl")).profile
    sample = TrafficSample.objects.create(
        organization=alice_org,
        name="calls",
        status=TrafficSample.Status.READY,
        profile=profile.to_json_dict(),
    )
    page = alice_client.get(reverse("traffic:detail", args=[sample.id])).content.decode()
    assert f"{profile.arrival.peak_rps_60s:.2f} req/s" in page and "busiest 60 s" in page
    assert f"the average is {profile.arrival.mean_rps:.2f} req/s" in page
    assert "p99 is exceeded by 1 request in 100" in page
    assert "what a prefix cache can skip" in page
    assert 'href="/jobs/#job-form">start a tuning job</a>' in page

    model = ServedModel.objects.create(organization=alice_org, name="llama-8b", path="/models/llama-8b")
    job = TuningJob.objects.create(
        organization=alice_org,
        name="first",
        traffic_sample=sample,
        served_model=model,
        spec={"slo": "p95_ttft_ms<=800"},
    )
    page = alice_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "What do these columns mean?" in page and "Time to first token" in page
    assert "No trials yet. The first one captures the reference answers" in page
