"""Trace readers, arrival processes, summaries, and open-loop sending against a fake endpoint."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from serving.loadgen import (
    SLO,
    LatencyStats,
    TraceFormatError,
    TraceRequest,
    gamma_offsets_s,
    poisson_offsets_s,
    read_trace,
    trace_offsets_s,
)
from serving.loadgen.client import PreparedRequest, build_body
from serving.loadgen.results import RequestResult, summarize
from serving.loadgen.runner import normalize_base_url, run_prepared


def test_reads_the_shared_traces(shared_traces: Path) -> None:
    mooncake = read_trace(shared_traces / "mooncake_synthetic.jsonl", max_requests=5)
    assert [r.num_prompt_tokens for r in mooncake[:2]] == [40160, 36640]
    assert mooncake[0].hash_ids[:3] == (0, 1, 2) and mooncake[2].arrival_s == pytest.approx(0.04)
    azure = read_trace(shared_traces / "azure2023_conv.csv", max_requests=3)
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in azure] == [(374, 44), (396, 109), (879, 55)]
    assert azure[0].arrival_s == 0.0 and azure[1].arrival_s == pytest.approx(4.3145790, abs=1e-6)
    skipped = read_trace(shared_traces / "azure2023_conv.csv", max_requests=2, skip=1)
    assert skipped[0].num_prompt_tokens == 396 and skipped[0].arrival_s == 0.0


def test_azure_csv_with_bom_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n")
    assert read_trace(path)[0].num_prompt_tokens == 10
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,x\n")
    with pytest.raises(TraceFormatError, match="line 2"):
        read_trace(path)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n'
    )
    with pytest.raises(TraceFormatError, match="line 2: `output_length` is missing"):
        read_trace(jsonl)


def test_trace_time_and_rate_scaling() -> None:
    requests = [TraceRequest(t, 10, 1) for t in (0.0, 1.0, 3.0)]
    assert trace_offsets_s(requests, time_scale=0.5) == [0.0, 0.5, 1.5]
    assert trace_offsets_s(requests, rate_scale=2.0) == [0.0, 0.5, 1.5]
    with pytest.raises(ValueError):
        trace_offsets_s(requests, time_scale=0)


def test_generated_arrivals_are_seeded_and_have_the_rate() -> None:
    a = poisson_offsets_s(4000, rate_rps=20.0, rng=np.random.default_rng(1))
    b = poisson_offsets_s(4000, rate_rps=20.0, rng=np.random.default_rng(1))
    assert a == b and a[0] == 0.0
    gaps = np.diff(a)
    assert 1 / gaps.mean() == pytest.approx(20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)
    bursty = np.diff(gamma_offsets_s(4000, rate_rps=20.0, rng=np.random.default_rng(1), cv=2.0))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)
    assert np.allclose(np.diff(gamma_offsets_s(5, rate_rps=4.0, rng=np.random.default_rng(1), cv=0.0)), 0.25)


def _result(
    index: int, ttft: float | None, e2e: float | None, out: int, error: str | None = None
) -> RequestResult:
    tpot = (e2e - ttft) / (out - 1) if ttft is not None and e2e is not None and out > 1 else None
    return RequestResult(
        index=index,
        scheduled_s=index * 0.1,
        send_lateness_ms=0.5 * index,
        num_prompt_tokens=100,
        num_prompt_tokens_reported=100,
        max_output_tokens=out,
        num_output_tokens=out if error is None else 0,
        ttft_ms=ttft,
        e2e_ms=e2e,
        tpot_ms=tpot,
        itl_ms=(),
        status=200,
        error=error,
    )


def test_summary_percentiles_goodput_and_errors() -> None:
    results = [_result(i, 100.0 * (i + 1), 100.0 * (i + 1) + 90.0, 10) for i in range(9)]
    results.append(_result(9, None, None, 10, error="HTTP 500: boom"))
    summary = summarize(results, duration_s=2.0, slo=SLO(ttft_ms=500.0, tpot_ms=20.0))
    assert summary.num_requests == 10 and summary.num_errors == 1 and summary.error_rate == 0.1
    assert summary.ttft_ms == LatencyStats.of([100.0 * (i + 1) for i in range(9)])
    assert summary.ttft_ms.p50 == 500.0 and summary.ttft_ms.p90 == pytest.approx(820.0)
    assert summary.tpot_ms.p50 == pytest.approx(10.0)
    assert summary.slo_attainment == 0.5  # TTFT <= 500 ms: requests 0..4
    assert summary.goodput_rps == 2.5
    assert summary.request_throughput_rps == 4.5 and summary.output_throughput_tps == 45.0


def test_empty_stats_serialise_as_null(tmp_path: Path) -> None:
    from serving.loadgen.results import ReplayResult, ReplaySettings

    settings = ReplaySettings(
        "http://x", "m", "completions", "t", 1.0, 1.0, None, None, None, None, None, True, 0, "tok"
    )
    result = ReplayResult(settings, summarize([], duration_s=0.0, slo=SLO()), (), "2026-01-01T00:00:00+00:00")
    path = tmp_path / "r.json"
    result.write_json(path)
    assert json.loads(path.read_text())["summary"]["ttft_ms"]["p50"] is None


def test_normalize_base_url() -> None:
    for url in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert normalize_base_url(url) == "http://h:1"


# -- against a fake streaming endpoint ---------------------------------------------------------

FIRST_TOKEN_S = 0.20
TOKEN_GAP_S = 0.05
NUM_TOKENS = 5


async def _fake_completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert request.headers.get("Authorization") == "Bearer k"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.sleep(FIRST_TOKEN_S)
    for i in range(body["max_tokens"]):
        if i:
            await asyncio.sleep(TOKEN_GAP_S)
        event = {"choices": [{"index": 0, "text": f" t{i}"}]}
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": body["max_tokens"]}}
    await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return response


def test_open_loop_sends_on_schedule_while_earlier_requests_are_slow() -> None:
    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", _fake_completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1/completions"
        try:
            # 20 requests 20 ms apart; each takes 0.4 s, so up to 20 are in flight at once.
            prepared = [
                PreparedRequest(
                    index=i,
                    scheduled_s=0.02 * i,
                    url=url,
                    num_prompt_tokens=7,
                    max_output_tokens=NUM_TOKENS,
                    body=build_body(
                        api="completions",
                        model="m",
                        prompt="x",
                        max_output_tokens=NUM_TOKENS,
                        ignore_eos=True,
                    ),
                )
                for i in range(20)
            ]
            headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
            results, duration_s, _ = await run_prepared(prepared, headers=headers, request_timeout_s=30)
        finally:
            await runner.cleanup()
        assert all(r.error is None for r in results), [r.error for r in results]
        # Open loop: the last request left ~0.38 s after the first, not after the others finished.
        assert max(r.send_lateness_ms for r in results) < 50.0
        assert duration_s < 0.38 + FIRST_TOKEN_S + (NUM_TOKENS - 1) * TOKEN_GAP_S + 0.3
        for r in results:
            assert r.ttft_ms == pytest.approx(FIRST_TOKEN_S * 1000, abs=60)
            assert len(r.itl_ms) == NUM_TOKENS - 1
            assert r.tpot_ms == pytest.approx(TOKEN_GAP_S * 1000, abs=25)
            assert r.num_output_tokens == NUM_TOKENS and r.num_prompt_tokens_reported == 7

    asyncio.run(scenario())


def test_http_errors_and_refused_connections_are_recorded_not_raised() -> None:
    async def scenario() -> list[RequestResult]:
        prepared = [
            PreparedRequest(
                index=0,
                scheduled_s=0.0,
                url="http://127.0.0.1:9/v1/completions",
                num_prompt_tokens=1,
                max_output_tokens=1,
                body=b"{}",
            )
        ]
        results, _, _ = await run_prepared(prepared, headers={}, request_timeout_s=5, connect_timeout_s=2)
        return results

    (result,) = asyncio.run(scenario())
    assert result.error is not None and result.ttft_ms is None
    assert math.isfinite(result.send_lateness_ms)


def _serve_in_thread(app: web.Application) -> tuple[str, object]:
    """Run `app` on its own loop in a thread; returns (base URL, stopper)."""
    import threading

    ready = threading.Event()
    box: dict[str, object] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        box["loop"] = loop
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    loop = box["loop"]

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)  # type: ignore[attr-defined]
        thread.join(10)

    return f"http://127.0.0.1:{box['port']}", stop


def _fake_openai_app() -> web.Application:
    """A streaming OpenAI-compatible endpoint serving one model, "their-model"."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "their-model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", _fake_completions)
    return app


def test_replay_trace_against_any_openai_compatible_endpoint(
    tokenizer_dir: Path, shared_traces: Path
) -> None:
    from serving.loadgen import replay_trace

    base_url, stop = _serve_in_thread(_fake_openai_app())
    try:
        result = replay_trace(
            endpoint=base_url + "/v1",
            trace=shared_traces / "mooncake_synthetic.jsonl",
            tokenizer=tokenizer_dir,
            api_key="k",
            rate_rps=20.0,
            arrival_cv=0.0,
            max_requests=6,
            max_prompt_tokens=700,
            max_output_tokens=3,
            progress=False,
        )
    finally:
        stop()  # type: ignore[operator]
    assert result.settings.model == "their-model" and result.settings.rate_rps == 20.0
    assert [r.scheduled_s for r in result.requests] == pytest.approx([0.05 * i for i in range(6)])
    assert result.summary.num_errors == 0 and result.summary.ttft_ms.count == 6
    # The first Mooncake prompts (tens of thousands of tokens, then 28) cut at 700.
    assert [r.num_prompt_tokens for r in result.requests] == [700, 700, 700, 700, 700, 28]
    assert result.settings.client_scheduling == _host_policy()


def test_a_remote_target_is_replayed_at_the_normal_policy(tokenizer_dir: Path, shared_traces: Path) -> None:
    """A target named by a host name that is not this host (pinned here to the local test
    server) is read at the normal policy, and the replay says why."""
    from serving.loadgen import replay_trace

    base_url, stop = _serve_in_thread(_fake_openai_app())
    port = base_url.rsplit(":", 1)[1]
    try:
        result = replay_trace(
            endpoint=f"http://provider.example:{port}/v1",
            model="their-model",
            trace=shared_traces / "azure2023_conv.csv",
            tokenizer=tokenizer_dir,
            api_key="k",
            rate_rps=20.0,
            max_requests=3,
            max_prompt_tokens=64,
            max_output_tokens=2,
            progress=False,
            connect_to={"provider.example": ["127.0.0.1"]},
        )
    finally:
        stop()  # type: ignore[operator]
    assert result.summary.num_errors == 0 and result.summary.ttft_ms.count == 3
    assert result.settings.client_scheduling == "normal (target not on this host)"


def _host_policy() -> str:
    from serving.loadgen.scheduling import prompt_reads

    with prompt_reads() as policy:
        return policy


def test_client_loop_reads_under_fifo_and_gives_it_back() -> None:
    """Inside `prompt_reads` the thread is real-time FIFO (where the host allows it), a process
    started from it is not, and the thread's own policy comes back after."""
    import os
    import subprocess
    import sys

    from serving.loadgen.scheduling import FIFO, prompt_reads

    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    with prompt_reads() as policy:
        if policy == FIFO:
            assert os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO
            child = subprocess.run(
                [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert int(child.stdout) == os.SCHED_OTHER
        else:  # the host refuses real-time scheduling: said so, with the reason
            assert policy.startswith("normal (")
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    with prompt_reads(enabled=False) as policy:
        assert policy == "normal (not asked)" and os.sched_getscheduler(0) == before[0]


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000", True),
        ("http://127.8.9.10:1", True),
        ("https://api.example.com/v1", False),
        ("http://10.0.0.5:8000", False),
        ("http://[2001:db8::1]:8000", False),
        ("not a url", False),
    ],
)
def test_only_a_target_on_this_host_gets_the_realtime_reads(url: str, local: bool) -> None:
    """A remote endpoint shares no core with the client: no real-time thread is spent on it."""
    from serving.loadgen.scheduling import on_this_host

    assert on_this_host(url) is local


def test_requests_spread_over_client_processes_keep_one_schedule(
    tokenizer_dir: Path, shared_traces: Path
) -> None:
    """Three client processes (spawned, each its own event loop) send one schedule from a shared
    start: every request once, in order, with its own offset, and the settings say how it ran."""
    from serving.loadgen import replay_trace

    base_url, stop = _serve_in_thread(_fake_openai_app())
    try:
        result = replay_trace(
            endpoint=base_url + "/v1",
            trace=shared_traces / "azure2023_conv.csv",
            tokenizer=tokenizer_dir,
            api_key="k",
            rate_rps=20.0,
            arrival_cv=0.0,
            max_requests=9,
            max_prompt_tokens=64,
            max_output_tokens=2,
            client_processes=3,
            progress=False,
        )
    finally:
        stop()  # type: ignore[operator]
    assert result.settings.client_processes == 3
    assert result.settings.client_scheduling == _host_policy()  # every process's loop alike
    assert [r.index for r in result.requests] == list(range(9))
    assert [r.scheduled_s for r in result.requests] == pytest.approx([0.05 * i for i in range(9)])
    assert result.summary.num_errors == 0 and result.summary.ttft_ms.count == 9
    assert all(r.num_output_tokens == 2 for r in result.requests)
    with pytest.raises(ValueError, match="client processes"):
        from serving.loadgen.runner import run_sharded

        run_sharded([], headers={}, processes=0)


def test_connections_are_opened_before_the_first_timed_send() -> None:
    """The timed requests ride keep-alive connections opened ahead (one per request, by GETs of the
    API's model list), so no TTFT pays for a handshake; warm_connections=0 opens none."""
    from serving.loadgen.runner import warm_url

    assert warm_url("http://h:1/v1/completions") == "http://h:1/v1/models"
    assert warm_url("https://h/prefix/v1/chat/completions?x=1") == "https://h/prefix/v1/models"
    assert warm_url("http://h:1/generate") == "http://h:1/"

    async def scenario(warm: int | None) -> tuple[list[tuple[str, int]], list[RequestResult]]:
        seen: list[tuple[str, int]] = []  # (method, the client's port: one per connection)

        async def models(request: web.Request) -> web.Response:
            seen.append(("GET", request.transport.get_extra_info("peername")[1]))  # type: ignore[union-attr]
            return web.json_response({"data": []})

        async def completions(request: web.Request) -> web.StreamResponse:
            seen.append(("POST", request.transport.get_extra_info("peername")[1]))  # type: ignore[union-attr]
            return await _fake_completions(request)

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        body = build_body(api="completions", model="m", prompt="x", max_output_tokens=2, ignore_eos=True)
        prepared = [
            PreparedRequest(i, 0.0, f"http://127.0.0.1:{port}/v1/completions", body, 7, 2) for i in range(3)
        ]
        try:
            results, _, _ = await run_prepared(
                prepared, headers={"Authorization": "Bearer k"}, request_timeout_s=30, warm_connections=warm
            )
        finally:
            await runner.cleanup()
        return seen, results

    seen, results = asyncio.run(scenario(None))
    assert all(r.error is None for r in results), [r.error for r in results]
    gets = [port for method, port in seen if method == "GET"]
    posts = [port for method, port in seen if method == "POST"]
    assert [method for method, _ in seen] == ["GET"] * 3 + ["POST"] * 3
    assert len(set(gets)) == 3 and set(posts) <= set(gets)  # every request on a warmed connection
    seen, results = asyncio.run(scenario(0))
    assert all(r.error is None for r in results) and [m for m, _ in seen] == ["POST"] * 3
