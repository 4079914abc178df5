"""Tuned fused-MoE tables in the portal (issue 25): a job's tables ship with the endpoint
deployed from it where its hardware's engine reads them (the endpoint page lists them and the
revision history shows which tables each generation runs), are refused with the reason where it
does not, and a promotion can change them. The job step's own refusals run the real command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

from compliance.services import residency_policy_set
from portal.accounts.models import User
from portal.endpoints import services as endpoint_services
from portal.endpoints.models import Endpoint
from portal.jobs.models import TuningJob
from portal.pools import services as pool_services
from tests.factories import finished_job

H100_TABLE = (
    Path(__file__).parents[1] / "serving" / "data" / "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json"
)


@pytest.fixture
def platform_admin(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)


def _job_with_tables(org, user, tables: dict[str, str], hardware: str, name: str) -> TuningJob:  # type: ignore[no-untyped-def]
    job = finished_job(org, user, name=name, winner=True)
    TuningJob.objects.filter(pk=job.pk).update(
        spec={**job.spec, "hardware": hardware}, moe_tables=tables, moe_tables_note="tuned for the traffic"
    )
    job.refresh_from_db()
    return job


@pytest.mark.django_db
def test_a_jobs_tables_ship_with_its_endpoint_and_a_promotion_can_change_them(
    alice, alice_org, platform_admin, settings, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    settings.COMPLIANCE_REGIONS = ["local", "us"]
    residency_policy_set(actor=alice, organization=alice_org, allowed_regions=["local", "us"])
    pool = pool_services.pool_create(actor=platform_admin, name="h100-us", region="us", accelerator="h100")
    table = H100_TABLE.read_text()
    job = _job_with_tables(alice_org, alice, {H100_TABLE.name: table}, "h100", "moe tuning")
    TuningJob.objects.filter(pk=job.pk).update(pool=pool)
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=False):
        endpoint, _ = endpoint_services.endpoint_deploy(actor=alice, job=job)
    assert set(endpoint.moe_tables) == {H100_TABLE.name} and endpoint.moe_tables_note == ""
    assert json.loads(endpoint.moe_tables[H100_TABLE.name]) == json.loads(table)
    first = endpoint.revisions.get()
    assert len(first.moe_tables_digest) == 12
    page = Client()
    page.force_login(alice)
    html = page.get(f"/endpoints/{endpoint.id}/").content.decode()
    keys = sorted(int(k) for k in json.loads(table))
    assert H100_TABLE.name in html and f"{len(keys)} ({keys[0]} to {keys[-1]})" in html
    assert f"MoE tables {first.moe_tables_digest}" in html
    # The API says the same: the job's tables, the endpoint's, and the note where none shipped.
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/endpoints/{endpoint.id}/").json()
    assert body["moe_tables"] == [H100_TABLE.name] and body["moe_tables_note"] == ""
    body = api.get(f"/api/v1/tuning-jobs/{job.id}/").json()
    assert body["moe_tables"] == [H100_TABLE.name] and body["moe_tables_note"] == "tuned for the traffic"

    # A promotion from a job whose tables are for another GPU: refused with the reason, and the
    # engine goes back to vLLM's own; the history says the tables changed.
    Endpoint.objects.filter(pk=endpoint.pk).update(status=Endpoint.Status.HEALTHY)
    endpoint.refresh_from_db()
    h200_name = H100_TABLE.name.replace("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200")
    other = _job_with_tables(alice_org, alice, {h200_name: table}, "h100", "moe tuning 2")
    TuningJob.objects.filter(pk=other.pk).update(served_model=job.served_model)
    other.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=False):
        second = endpoint_services.endpoint_promote(actor=alice, endpoint=endpoint, job=other)
    endpoint.refresh_from_db()
    assert endpoint.moe_tables == {} and second.moe_tables_digest == ""
    assert "is for NVIDIA_H200, and the endpoint runs on NVIDIA_H100_80GB_HBM3" in endpoint.moe_tables_note
    html = page.get(f"/endpoints/{endpoint.id}/").content.decode()
    assert f"MoE tables: {first.moe_tables_digest} → vLLM" in html
    assert "not shipped" in html and "no tuned tables ship with this endpoint" in html


@pytest.mark.django_db
def test_tables_for_a_cpu_job_are_not_shipped_and_the_endpoint_says_why(
    alice, alice_org, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    job = _job_with_tables(alice_org, alice, {H100_TABLE.name: H100_TABLE.read_text()}, "local-cpu", "cpu")
    with django_capture_on_commit_callbacks(execute=False):
        endpoint, _ = endpoint_services.endpoint_deploy(actor=alice, job=job)
    assert endpoint.moe_tables == {}
    assert "no vLLM device name is known for local-cpu" in endpoint.moe_tables_note


def _moe_tables_tune(tmp_path: Path, model_dir: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"dtype": "auto"}))
    trace = Path(__file__).parents[2] / "data" / "traces" / "azure2023_conv.csv"
    return subprocess.run(
        [
            sys.executable, "-m", "tailguard.cli", "moe-tables", "tune", "--model-dir", str(model_dir),
            "--config", str(config), "--trace", str(trace), "--hardware", "h100",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_job_step_refuses_a_dense_model_and_a_host_without_a_gpu(tmp_path: Path) -> None:
    from benchmarks.kernels_e2e import SHAPES
    from serving.models.tiny import build_tiny_model

    dense = tmp_path / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=dense, seed=0)
    done = _moe_tables_tune(tmp_path, dense)
    assert done.returncode == 3, done.stderr
    assert "not a mixture-of-experts model" in json.loads(done.stdout)["note"]
    moe = tmp_path / "qwen3-moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps(SHAPES["qwen3-30b-a3b"]))
    done = _moe_tables_tune(tmp_path, moe)
    assert done.returncode == 3, done.stderr
    out = json.loads(done.stdout)
    assert out["tables"] == {} and "has no CUDA GPU" in out["note"]
