"""The job form's budget is honest (issue 24 item 4): it says what the budget counts and what
comes on top of it, and refuses a budget that cannot search (the first search trial is the
competent baseline, so one trial tries no candidate) on the form and in the API alike, creating
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from portal.jobs import services
from portal.jobs.models import TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tuning.search.job import BUDGET_MIN_ERROR

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(settings, tmp_path: Path, alice, alice_org, shared_traces, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """A profiled sample and a registered config-only model (no engine starts in these tests)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    model_dir = tmp_path / "models" / "llama-cfg"
    model_dir.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "intermediate_size": 384,
        "max_position_embeddings": 16384,
        "torch_dtype": "bfloat16",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"\0" * 16)
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    settings.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    settings.TUNING_MODEL_ROOTS = [tmp_path / "models"]
    trace = shared_traces / "azure2023_conv.csv"
    with django_capture_on_commit_callbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="azure",
            upload=SimpleUploadedFile(trace.name, trace.read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    model = services.served_model_register(actor=alice, organization=alice_org, name="m", path=str(model_dir))
    return sample, model


def test_the_form_explains_the_budget_and_refuses_one_that_cannot_search(ready, alice_client) -> None:  # type: ignore[no-untyped-def]
    sample, model = ready
    page = alice_client.get(reverse("jobs:list")).content.decode()
    # The help is on the page, tied to the input for screen readers.
    assert 'id="id_budget_trials_helptext"' in page and 'aria-describedby="id_budget_trials_helptext"' in page
    for words in ("competent baseline", "reference capture", "confirmation rounds", "ablation"):
        assert words in page, words
    assert 'min="2"' in page
    form = {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "ttft_p50_ms": 600,
        "ttft_p95_ms": 1500,
        "peak_rps": 1.0,
        "headroom": 1.25,
        "hardware": "local-cpu",
        "strategy": "tpe",
        "confirm_repeats": 0,
    }
    for budget in (1, 0):
        response = alice_client.post(reverse("jobs:list"), {**form, "budget_trials": budget})
        assert response.status_code == 400
        assert (
            '<span class="error" data-field="budget_trials">A search needs at least 2 trials: the first '
            "measures the competent baseline, so with fewer no candidate is ever tried.</span>"
        ) in response.content.decode()
    assert not TuningJob.objects.exists()
    response = alice_client.post(
        reverse("jobs:list"), {**form, "budget_trials": 2, "name": "smallest search"}
    )
    assert response.status_code == 302
    job = TuningJob.objects.get(name="smallest search")
    assert job.spec["budget_trials"] == 2
    detail = alice_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "one reference capture (the correctness gate's yardstick), then up to 2 configurations" in detail


def test_the_api_holds_the_same_minimum(ready, alice) -> None:  # type: ignore[no-untyped-def]
    sample, model = ready
    api = APIClient()
    api.force_login(alice)
    body = {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "slo": "ttft_p50_ms<=600",
        "peak_rps": 1,
    }
    response = api.post("/api/v1/tuning-jobs/", {**body, "budget_trials": 1}, format="json")
    assert response.status_code == 400
    assert response.json()["budget_trials"] == [BUDGET_MIN_ERROR]
    assert not TuningJob.objects.exists()
    response = api.post(
        "/api/v1/tuning-jobs/", {**body, "budget_trials": 2, "confirm_repeats": 0}, format="json"
    )
    assert response.status_code == 201, response.json()
    schema = api.get("/api/schema/?format=json").json()
    field = schema["components"]["schemas"]["TuningJobCreateRequest"]["properties"]["budget_trials"]
    assert field["minimum"] == 2 and "reference capture" in field["description"]


def test_the_service_refuses_it_too_with_the_librarys_message(ready, alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    """Below the form and the API, the library's own validation refuses it (one shared constant)."""
    from django.core.exceptions import ValidationError

    sample, model = ready
    with pytest.raises(ValidationError) as info:
        services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="",
            traffic_sample=sample,
            served_model=model,
            slo="ttft_p50_ms<=600",
            peak_rps=1.0,
            budget_trials=1,
        )
    assert info.value.message_dict == {"budget_trials": [BUDGET_MIN_ERROR]}
    assert not TuningJob.objects.exists()
