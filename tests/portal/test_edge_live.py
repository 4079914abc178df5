"""The SLA's measuring point end to end: the portal starts an endpoint with the ingest on, the local
runner puts the measuring proxy in front of the real vLLM engine (tiny model, CPU), requests go
through the proxy, and the proxy posts into the portal's own ingest on a live server. The portal's
edge records must match the requests exactly, and its percentiles must be numpy's over the
proxy's own request log."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from portal.endpoints import services
from portal.endpoints.models import Endpoint
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.sla import selectors
from portal.sla.models import EdgeCoverage, EdgeRequest
from portal.traffic.models import TrafficSample
from serving.edge import REQUEST_ID_HEADER, TOKEN_ENV
from serving.engine import EngineConfig

INGEST_TOKEN = "edge-live-token"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("edge-models") / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=out, seed=0)
    return out


def _job(org: Any, user: Any, model_dir: Path) -> TuningJob:
    sample = TrafficSample.objects.create(organization=org, name="s", status=TrafficSample.Status.READY)
    model = ServedModel.objects.create(organization=org, name="llama-xs", path=str(model_dir))
    job = TuningJob.objects.create(
        organization=org,
        name="j",
        traffic_sample=sample,
        served_model=model,
        spec={},
        created_by=user,
        status=TuningJob.Status.SUCCEEDED,
        winner_trial=0,
    )
    config = EngineConfig.cpu_default(max_model_len=1024, cpu_kv_cache_space_gib=1, seed=0).to_mapping()
    Trial.objects.create(
        organization=org,
        job=job,
        number=0,
        assignment={},
        label="default",
        status=Trial.Status.DONE,
        result={"config": config, "ttft_p50_ms": 40.0, "ttft_p95_ms": 80.0},
    )
    return job


def _processes_naming(text: str) -> list[tuple[int, bytes]]:
    """(pid, argv) of this user's processes whose command line names `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in argv:
                found.append((int(entry.name), argv))
    return found


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


@pytest.mark.engine
@pytest.mark.django_db(transaction=True)
def test_the_portal_records_exactly_what_the_proxy_in_front_of_the_engine_measured(
    alice: Any, alice_org: Any, settings: Any, live_server: Any, tmp_path: Path, model_dir: Path
) -> None:
    settings.ENDPOINTS_DIR = tmp_path / "endpoints"
    settings.SLA_EDGE_INGEST_TOKEN = INGEST_TOKEN
    settings.SLA_EDGE_INGEST_BASE_URL = live_server.url
    endpoint, api_key = services.endpoint_deploy(actor=alice, job=_job(alice_org, alice, model_dir))
    assert services.endpoint_start(endpoint_id=str(endpoint.id)) in {"started", "running"}
    folder = services.endpoint_dir(endpoint)
    try:
        deadline = time.monotonic() + 600
        while services.read_state(endpoint).get("status") != "healthy":
            state = services.read_state(endpoint)
            log = (
                (folder / "supervisor.log").read_text()[-3000:]
                if (folder / "supervisor.log").exists()
                else ""
            )
            assert state.get("status") != "failed", (state, log)
            assert time.monotonic() < deadline, log
            time.sleep(1)
        endpoint.refresh_from_db()
        base = f"http://127.0.0.1:{endpoint.port}/v1"
        # The token reached the proxy through a 0600 file and its environment, never an argv.
        assert (folder / "edge_token").stat().st_mode & 0o777 == 0o600
        proxies = _processes_naming(str(endpoint.id))
        assert proxies and all(INGEST_TOKEN.encode() not in argv for _, argv in proxies)
        assert any(
            argv.split(b"\0")[1:3] == [b"-m", b"serving.edge"]
            and f"{TOKEN_ENV}={INGEST_TOKEN}".encode()
            in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            for pid, argv in proxies
        )
        headers = {"Authorization": f"Bearer {api_key}"}
        model = "llama-xs"  # the short name the endpoint serves it under
        sent: dict[str, int] = {}  # request id (from the response header) -> status the client got
        with httpx.Client(timeout=120.0) as client:
            for i in range(8):
                body = {"model": model, "prompt": f"hello {i}", "max_tokens": 6, "stream": i % 2 == 0}
                with client.stream("POST", f"{base}/completions", json=body, headers=headers) as response:
                    text = response.read()
                    sent[response.headers[REQUEST_ID_HEADER]] = response.status_code
                assert response.status_code == 200 and text
                if body["stream"]:
                    assert text.rstrip().endswith(b"data: [DONE]")
            refused = client.post(
                f"{base}/completions",
                json={"model": model, "prompt": "x", "max_tokens": 1},
                headers={"Authorization": "Bearer tgk_wrong"},
            )
            sent[refused.headers[REQUEST_ID_HEADER]] = refused.status_code
            assert refused.status_code == 401
            # Not a generation request: passed through, not measured.
            listed = client.get(f"{base}/models", headers=headers)
            assert listed.status_code == 200 and REQUEST_ID_HEADER not in listed.headers
    finally:
        # The proxy stops first and sends what it recorded on its way out.
        assert services.endpoint_stop_run(endpoint_id=str(endpoint.id)) == "stopped"
    log_lines = (folder / "logs" / "edge-requests.jsonl").read_text().splitlines()
    proxy_log = {row["id"]: row for row in map(json.loads, log_lines)}
    assert set(proxy_log) == set(sent) and len(log_lines) == len(sent)
    stored = {r.request_id: r for r in EdgeRequest.objects.filter(endpoint=endpoint)}
    # Exactly the requests sent: same ids, same count, same statuses, the proxy's own TTFTs.
    assert set(stored) == set(sent)
    for request_id, status in sent.items():
        row, record = stored[request_id], proxy_log[request_id]
        assert row.status_code == status == record["status"] == record["ingest_status"]
        assert row.ttft_ms == record["ttft_ms"]
        assert row.arrived_at == datetime.fromtimestamp(record["arrived_at_us"] / 1e6, tz=UTC)
        assert (row.ttft_ms is None) == (status != 200)
    streamed = [r for r in proxy_log.values() if r["status"] == 200 and r["streamed"]]
    assert len(streamed) == 4
    # The portal covered the proxy's up-time: every arrival lies inside a reported span.
    spans = list(EdgeCoverage.objects.filter(endpoint=endpoint).values_list("covered_from", "covered_to"))
    assert all(any(lo <= row.arrived_at < hi for lo, hi in spans) for row in stored.values())
    # The SLA's percentiles over the stored records are numpy's over the proxy's own log.
    arrivals = [row.arrived_at for row in stored.values()]
    start, end = _hour(min(arrivals)), _hour(max(arrivals)) + timedelta(hours=1)
    judged = selectors.raw_intervals(
        endpoint_id=endpoint.id, interval_s=3600, peak_rps=100.0, start=start, end=end
    )
    # The refused key (401) is the client's own error: counted apart, never judged.
    assert sum(i.client_errors for i in judged) == 1 and sum(i.failed for i in judged) == 0
    assert sum(i.admitted for i in judged) == len(sent) - 1
    for interval in judged:
        inside = [
            r["ttft_ms"]
            for r in proxy_log.values()
            if r["status"] == 200
            and interval.start.timestamp() <= r["arrived_at_us"] / 1e6 < interval.end.timestamp()
        ]
        if not inside:
            assert interval.ttft_p50_ms is None
            continue
        assert interval.ttft_p50_ms == float(np.percentile(inside, 50))
        assert interval.ttft_p95_ms == float(np.percentile(inside, 95))
    assert Endpoint.objects.get(pk=endpoint.pk).status == Endpoint.Status.STOPPED
