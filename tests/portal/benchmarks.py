"""What the benchmark-report tests measure and whom they measure for: local OpenAI-compatible
servers (aiohttp, each on its own thread and event loop: a fast one, a slow one, one that answers
plain JSON instead of a stream, one that never answers, a closed port), a sales engineer (`sam`),
a prospect's ready sample, and the report form's data.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from compliance.storage import seal
from portal.accounts.models import User
from portal.benchmarks import measure, services
from portal.benchmarks.models import BenchmarkReport, BenchmarkTarget
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from tests.conftest import PASSWORD

API_KEY = "sk-prospect-secret-0123456789"


# --- A local OpenAI-compatible server ---------------------------------------------------------


@dataclass
class FakeOpenAI:
    """mode: "stream" (SSE chunks after `ttft_s`, `tpot_s` apart), "json" (a non-streaming
    answer) or "hang" (never answers)."""

    mode: str = "stream"
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    received: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append({"body": body, "authorization": request.headers.get("Authorization")})
        num_tokens = int(body["max_tokens"])
        usage = {
            "prompt_tokens": 7 + len(body["messages"][0]["content"].split()),
            "completion_tokens": num_tokens,
        }
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "json":
            return web.json_response(
                {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.ttft_s)
        for i in range(num_tokens):
            if i:
                await asyncio.sleep(self.tpot_s)
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " w"}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
def serve() -> Iterator[Any]:
    """Starts FakeOpenAI servers on loopback, each in its own thread; stops them all at the end."""
    stops = []

    def start(server: FakeOpenAI) -> FakeOpenAI:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", server.chat)
        runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)

        async def up() -> int:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

        port = asyncio.run_coroutine_threadsafe(up(), loop).result(timeout=10)
        server.base_url = f"http://127.0.0.1:{port}/v1"

        def stop() -> None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)

        stops.append(stop)
        return server

    yield start
    for stop in stops:
        stop()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --- Fixtures (tests/portal/conftest.py offers them to every portal module) -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bench_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tokenizer import build_tokenizer, save_tokenizer

    out = tmp_path_factory.mktemp("bench-tokenizer") / "llama-xs"
    tokenizer = build_tokenizer(family="llama", vocab_size=2048, rng=np.random.default_rng(0))
    save_tokenizer(tokenizer, family="llama", out_dir=out, model_max_length=8192)
    return out


@pytest.fixture
def bench_settings(settings, bench_tokenizer: Path):  # type: ignore[no-untyped-def]
    settings.BENCHMARK_TOKENIZER_DIR = bench_tokenizer
    return settings


@pytest.fixture
def sam(db) -> User:  # type: ignore[no-untyped-def]
    """A sales engineer (staff)."""
    return User.objects.create_user(
        email="sam@tailguard.test", password=PASSWORD, is_staff=True, staff_role=User.StaffRole.SALES_ENGINEER
    )


@pytest.fixture
def sam_client(sam: User) -> Client:
    client = Client()
    client.force_login(sam)
    return client


def trace_bytes(num_requests: int = 180, span_s: float = 60.0) -> bytes:
    rng = np.random.default_rng(3)
    times = np.sort(rng.uniform(0, span_s * 1000, size=num_requests)).astype(int)
    lines = [
        json.dumps(
            {
                "timestamp": int(t),
                "input_length": int(rng.integers(40, 160)),
                "output_length": int(rng.integers(3, 8)),
                "hash_ids": [int(i % 4)],
            }
        )
        for i, t in enumerate(times)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def sample(alice, alice_org, bench_settings, django_capture_on_commit_callbacks) -> TrafficSample:  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name="acme voice week 12",
            upload=SimpleUploadedFile("trace.jsonl", trace_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    return sample


def target_spec(name: str, url: str, **extra: Any) -> services.TargetSpec:
    price = {"price_per_hour_usd": Decimal("4.50")}
    if extra.get("pricing") == BenchmarkTarget.Pricing.PER_TOKEN:
        price = {}
    return services.TargetSpec(name=name, base_url=url, model="acme-chat", **{**price, **extra})


def benchmark_form(sample: TrafficSample, **overrides: str) -> dict[str, str]:
    data = {
        "traffic_sample": str(sample.id),
        "traffic_source": "prospect",
        "load_multipliers": "0.5, 1, 1.25",
        "duration_s": "30",
        "request_timeout_s": "30",
        "targets-TOTAL_FORMS": "4",
        "targets-INITIAL_FORMS": "0",
        "targets-MIN_NUM_FORMS": "1",
        "targets-MAX_NUM_FORMS": "4",
        "targets-0-name": "Provider",
        "targets-0-base_url": "https://api.provider.example/v1",
        "targets-0-model": "gpt-x",
        "targets-0-api_key": API_KEY,
        "targets-0-pricing": "per_token",
        "targets-0-price_input_per_mtok_usd": "0.5",
        "targets-0-price_output_per_mtok_usd": "1.5",
        "targets-1-name": "Tuned",
        "targets-1-base_url": "http://10.0.0.5:8000",
        "targets-1-model": "acme-chat",
        "targets-1-pricing": "hourly",
        "targets-1-price_per_hour_usd": "4.5",
        "targets-1-send_ignore_eos": "on",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


# --- A finished report's view and rows (the charts' and pages' tests, the isolation sweep) ----------


def view_cell(p50: float, p95: float, *, ok: bool = True, cost: float | None = 1.0) -> dict[str, Any]:
    if not ok:
        cell = measure.failed_cell(num_requests=10, reason="x")
        cell["errors"] = {"connection_refused": 10}
        return cell
    return {
        "num_requests": 10,
        "num_ok": 10,
        "num_errors": 0,
        "error_rate": 0.0,
        "errors": {},
        "ttft_ms": {"p50": p50, "p95": p95},
        "tpot_ms": {"p50": 5.0, "p95": 9.0},
        "ttft_p50_ci_ms": [p50 - 10, p50 + 20],
        "ttft_p95_ci_ms": [p95 - 30, p95 + 40],
        "ttft_cdf_ms": [p50 * q / 50 for q in range(measure.CDF_POINTS)],
        "tpot_cdf_ms": [5.0 + q / 100 for q in range(measure.CDF_POINTS)],
        "request_throughput_rps": 2.0,
        "output_throughput_tps": 40.0 * p50 / 100,
        "cost_per_mtok_usd": cost,
    }


def report_view() -> dict[str, Any]:
    targets = [{"id": "t1", "name": "Tuned"}, {"id": "t2", "name": "Provider"}, {"id": "t3", "name": "Down"}]
    levels = []
    for multiplier, rate, scale in ((0.5, 1.5, 1.0), (1.0, 3.0, 2.0)):
        cells = [
            view_cell(100 * scale, 200 * scale),
            view_cell(300 * scale, 900 * scale, cost=2.5),
            view_cell(0, 0, ok=False),
        ]
        levels.append(
            {
                "multiplier": multiplier,
                "rate_rps": rate,
                "rows": [{"target": t, "cell": c} for t, c in zip(targets, cells, strict=True)],
            }
        )
    return {"targets": targets, "levels": levels}


def finished_report(sam: User, sample: TrafficSample) -> BenchmarkReport:
    """A report as a finished run leaves it (the run itself has its own tests above); made
    directly, so that no run starts (a transactional test would start one at commit)."""
    report = BenchmarkReport.objects.create(
        organization=sample.organization,
        name="Acme: Tuned vs Provider",
        traffic_sample=sample,
        sample_name=sample.name,
        sample_summary={"num_requests": 180, "duration_s": 59.5, "peak_rps_60s": 3.0},
        peak_rps=3.0,
        load_multipliers=[0.5, 1.0],
        duration_s=30,
        created_by=sam,
    )
    for position, (name, url) in enumerate(
        (
            ("Tuned", "http://10.0.0.5:8000/v1"),
            ("Provider", "https://api.provider.example/v1"),
            ("Down", "http://10.0.0.9:8000/v1"),
        )
    ):
        target = BenchmarkTarget(
            organization=sample.organization,
            report=report,
            position=position,
            name=name,
            base_url=url,
            model="acme-chat",
            pricing=BenchmarkTarget.Pricing.HOURLY,
            price_per_hour_usd=Decimal("4.50"),
        )
        target.api_key_sealed = seal(API_KEY.encode(), purpose=services._key_purpose(target))
        target.save()
    view = report_view()
    ids = [str(t.id) for t in report.targets.all()]
    levels = [
        {
            "multiplier": level["multiplier"],
            "rate_rps": level["rate_rps"],
            "num_requests_planned": 10,
            "cells": {ids[i]: row["cell"] for i, row in enumerate(level["rows"])},
        }
        for level in view["levels"]
    ]
    levels[0]["cells"][ids[2]]["error_examples"] = {"connection_refused": "Connect call failed 10.0.0.9"}
    BenchmarkReport.objects.filter(pk=report.pk).update(
        status=BenchmarkReport.Status.SUCCEEDED,
        finished_at=timezone.now(),
        results={
            "conditions": {"client_host": "bench-host", "started_at": "2025-01-02 03:04 UTC"},
            "levels": levels,
        },
    )
    report.refresh_from_db()
    return report
