"""Rows of a deployed endpoint for the continual loop's tests: the job it was tuned by, its
trials, its revision and its metric scrapes (short prompts as tuned, or long prefix-heavy ones).

Used by `test_continual_loop` and `test_faults_endpoints`; `deployed` takes `model_root` from the
requesting module (or tests/portal/conftest.py).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from django.utils import timezone

from portal.endpoints.models import Endpoint, EndpointRevision, MetricSnapshot
from portal.endpoints.services import endpoint_dir
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.jobs.selectors import job_work_dir
from portal.traffic.models import TrafficSample
from serving.engine import EngineConfig
from tests.tuning.workload_factories import BOUNDS
from tuning.continual import LiveWindow, bucketed
from tuning.search.job import JobSpec

SLO = "ttft_p50_ms<=1000,ttft_p95_ms<=3000"


def loop_config(**overrides: object) -> dict[str, object]:
    return EngineConfig.cpu_default(max_model_len=2048, cpu_kv_cache_space_gib=1, **overrides).to_mapping()


def loop_trial(job: TuningJob, number: int, assignment: dict[str, object], **result: object) -> Trial:
    base = {
        "status": "ok",
        "config": loop_config(**{k: v for k, v in assignment.items() if k != "speculative"}),
        "slo_met": True,
        "correctness": {"passed": True},
        "reliability": {"passed": True},
        "ttft_p95_ci_ms": [0.0, 0.0],
    }
    return Trial.objects.create(
        organization=job.organization,
        job=job,
        number=number,
        assignment=assignment,
        label=str(assignment),
        status=Trial.Status.DONE,
        result={**base, **result},
        finished_at=timezone.now(),
    )


@pytest.fixture
def deployed(alice, alice_org, model_root: Path, settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    """An endpoint serving a job's winner, tuned on short prompts at 3 requests/s."""
    settings.TUNING_MODEL_ROOTS = [model_root]
    # The scrapes below are two minutes of 72 requests, and this host is where the tests re-tune:
    # the loop's evidence floor and its serving-host rule are lowered and allowed explicitly (their
    # defaults have their own tests below).
    settings.LOOP_MIN_LIVE_REQUESTS = 30
    settings.LOOP_MIN_LIVE_SPAN_S = 60
    settings.LOOP_RETUNE_ON_SERVING_HOST = True
    model = ServedModel.objects.create(
        organization=alice_org, name="llama-xs", path=str(model_root / "llama-xs")
    )
    sample = TrafficSample.objects.create(
        organization=alice_org, name="azure", status=TrafficSample.Status.READY, profile={"num_requests": 100}
    )
    spec = JobSpec(
        trace_path="unused",
        trace_format="mooncake",
        model_path=model.path,
        slo=SLO,
        peak_rps=2.4,
        budget_trials=3,
        duration_s=20,
        repeats=1,
        max_prompt_tokens=1024,
        max_output_tokens=32,
    )
    job = TuningJob.objects.create(
        organization=alice_org,
        name="tuned on azure",
        traffic_sample=sample,
        served_model=model,
        spec=spec.to_dict(),
        created_by=alice,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=1,
        finished_at=timezone.now(),
    )
    rng = np.random.default_rng(0)
    work = job_work_dir(job)
    work.mkdir(parents=True)
    with (work / "workload.jsonl").open("w") as f:
        for i in range(60):
            f.write(
                json.dumps(
                    {
                        "timestamp": i * 333,
                        "input_length": int(rng.integers(100, 900)),
                        "output_length": int(rng.integers(20, 200)),
                    }
                )
                + "\n"
            )
    running = {"dtype": "float32", "max_num_seqs": 16}
    loop_trial(job, 0, {"dtype": "float32"}, ttft_p50_ms=300.0, ttft_p95_ms=900.0)
    winner = loop_trial(job, 1, running, ttft_p50_ms=250.0, ttft_p95_ms=700.0, prefix_cache_hit_rate=0.0)
    endpoint = Endpoint.objects.create(
        organization=alice_org,
        name="voice",
        served_model=model,
        job=job,
        config=winner.result["config"],
        port=45871,
        api_key_prefix="abcd",
        api_key_hash="x" * 64,
        status=Endpoint.Status.HEALTHY,
        detect_window_s=120,
        retune_cooldown_s=600,
    )
    EndpointRevision.objects.create(
        organization=alice_org,
        endpoint=endpoint,
        generation=1,
        config=winner.result["config"],
        reason="deployed",
        job=job,
        trial_number=1,
        measured_ttft_p50_ms=250.0,
    )
    endpoint_dir(endpoint).mkdir(parents=True)
    return endpoint


def loop_scrapes(endpoint: Endpoint, *, long: bool, p95: float, start: timedelta, count: int = 8) -> None:
    """`count` 15 s scrapes ending `start` ago: short prompts (as tuned) or long, prefix-heavy ones."""
    rng = np.random.default_rng(int(p95))
    now = timezone.now() - start
    for i in range(count):
        prompts = rng.integers(1100, 2000, size=9) if long else rng.integers(100, 900, size=9)
        outputs = rng.integers(20, 200, size=9)
        window = LiveWindow(
            interval_s=15.0,
            num_requests=9.0,
            prompt_tokens=bucketed(prompts, BOUNDS),
            output_tokens=bucketed(np.minimum(outputs, 32), BOUNDS),
            prefix_queries_tokens=float(prompts.sum()),
            prefix_hits_tokens=float(prompts.sum() * (0.6 if long else 0.0)),
            ttft_p95_ms=p95,
        )
        MetricSnapshot.objects.create(
            organization=endpoint.organization,
            endpoint=endpoint,
            taken_at=now - timedelta(seconds=15 * (count - i)),
            ttft_p50_ms=p95 / 3,
            ttft_p95_ms=p95,
            requests_per_s=0.6,
            window=window.to_dict(),
        )
