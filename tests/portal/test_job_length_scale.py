"""A tuning job's length scale through the portal's form and API (issue 19 item 6): the factor is
stored in the job's spec and shown on its page; a bad factor is refused by name and creates
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.jobs import services
from portal.jobs.models import TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tuning.search.job import JobSpec, plan_job, report


@pytest.fixture
def ready(settings, tmp_path: Path, alice, alice_org, shared_traces, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """Alice's organization with a profiled sample and a registered (config-only) model."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    root = tmp_path / "models"
    model_dir = root / "llama-cfg"
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
    settings.TUNING_MODEL_ROOTS = [root]
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


@pytest.mark.django_db
def test_the_job_form_and_api_take_a_length_scale(alice, alice_org, ready, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sample, model = ready
    client = Client()
    client.force_login(alice)
    form = {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "ttft_p50_ms": 600,
        "ttft_p95_ms": 1500,
        "peak_rps": 1,
        "headroom": 1.25,
        "hardware": "local-cpu",
        "budget_trials": 2,
        "strategy": "grid",
    }
    before = AuditEvent.objects.count()
    for bad in ("0", "1.5", "nan"):
        response = client.post(reverse("jobs:list"), {**form, "length_scale": bad})
        assert response.status_code == 400 and "length_scale" in response.context["form"].errors
    assert not TuningJob.objects.exists() and AuditEvent.objects.count() == before
    response = client.post(reverse("jobs:list"), {**form, "length_scale": "0.5"})
    assert response.status_code == 302, response.content[:2000]
    job = TuningJob.objects.get()
    assert job.spec["length_scale"] == 0.5
    page = client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert "every prompt and output scaled to 0.5\u00d7 its sample length" in page
    # Once planned (as the job's first step does), its page and report state the factor and the
    # share shortened, and what the correctness gate judges on (counts and lengths only).
    prepared = plan_job(JobSpec.from_dict(job.spec), tmp_path / "work")
    TuningJob.objects.filter(id=job.id).update(report=report(prepared, []))
    page = client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    assert prepared.caps["line"] in page and "0.5x its sample length" in page
    page = client.get(reverse("jobs:report", args=[job.id])).content.decode()
    assert 'id="report-golden">Correctness gate: 8 synthesised prompts of' in page
    assert "token counts only" in page
    # The defaults keep today's behaviour: real lengths, nothing said about scaling.
    client.post(reverse("jobs:list"), {**form, "name": "real lengths"})
    plain = TuningJob.objects.get(name="real lengths")
    assert plain.spec["length_scale"] == 1.0
    assert "job-length-scale" not in client.get(reverse("jobs:detail", args=[plain.id])).content.decode()

    api = APIClient()
    api.force_login(alice)
    body = {
        "traffic_sample": str(sample.id),
        "served_model": str(model.id),
        "slo": "ttft_p50_ms<=600",
        "peak_rps": 1,
    }
    count = TuningJob.objects.count()
    response = api.post("/api/v1/tuning-jobs/", {**body, "length_scale": 0}, format="json")
    assert response.status_code == 400 and "length_scale" in response.json()
    assert TuningJob.objects.count() == count
    response = api.post("/api/v1/tuning-jobs/", {**body, "length_scale": 0.25}, format="json")
    assert response.status_code == 201, response.json()
    assert TuningJob.objects.get(id=response.json()["id"]).spec["length_scale"] == 0.25
    # The service refuses what bypasses both (a caller of its own), naming the field.
    with pytest.raises(ValidationError) as info:
        services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="x",
            traffic_sample=sample,
            served_model=model,
            slo="ttft_p50_ms<=600",
            peak_rps=1.0,
            length_scale=float("nan"),
        )
    assert "length_scale" in info.value.message_dict
    assert TuningJob.objects.count() == count + 1
