"""The measuring proxy against a real aiohttp upstream speaking the OpenAI streaming protocol and a
real ingest receiver, both on loopback. Nothing here asserts a duration: the deliberate delays
only order events, and the assertions are about order, structure, counts, bytes and statuses."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from serving.edge import REQUEST_ID_HEADER, TOKEN_ENV, EdgeBuffer, EdgeProxy, EdgeProxySettings, IngestTarget
from serving.edge.records import (
    ERROR_CLIENT_DISCONNECTED,
    ERROR_STREAM_BROKEN,
    ERROR_STREAM_ERROR,
    ERROR_UPSTREAM_TIMEOUT,
    ERROR_UPSTREAM_UNREACHABLE,
    EdgeRequestRecord,
)
from serving.engine.launcher import free_port

TOKEN = "edge-test-token"
ENDPOINT_ID = "7b0f6f3e-2a51-4c1e-9d55-0a4a8f1f2c10"


def clock_us() -> int:
    """One clock for the proxy and the upstream, so their times can be ordered."""
    return time.monotonic_ns() // 1000 + 1_700_000_000_000_000


# -- the upstream: an OpenAI-compatible server with chosen behaviours ---------------------------------


@dataclass
class Upstream:
    # Per prompt: when the role chunk and the first content chunk left (clock_us).
    sent: dict[str, dict[str, int]] = field(default_factory=dict)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt"))
        if prompt == "fail500":
            return web.json_response({"error": {"message": "engine dead", "code": 500}}, status=500)
        if not body.get("stream"):
            await asyncio.sleep(0.05)
            return web.json_response({"id": "c", "choices": [{"index": 0, "text": f"answer to {prompt}"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.05)  # the queue and prefill
        try:
            for i in range(4 if prompt != "slow" else 400):
                if i == 0:
                    self.sent.setdefault(prompt, {})["content"] = clock_us()
                chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if prompt == "break" and i == 1:
                    # The engine dies mid-stream: the connection closes without the chunked end.
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if prompt == "stall" and i == 1:
                    await asyncio.sleep(30)  # the engine goes silent mid-stream
                if prompt == "error-event" and i == 1:
                    await response.write(b'data: {"error": {"message": "out of KV cache", "code": 500}}\n\n')
                    break
                await asyncio.sleep(0.01)
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled.set()
            raise
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = str(body["messages"][0]["content"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        self.sent.setdefault(name, {})["role"] = clock_us()
        await response.write(f"data: {json.dumps(role)}\n\n".encode())
        await asyncio.sleep(0.05)  # the role chunk comes before any token
        self.sent[name]["content"] = clock_us()
        for word in ("Hello", " there"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            # Split across writes on purpose: an event may straddle chunks.
            text = f"data: {json.dumps(chunk)}\r\n\r\n".encode()
            await response.write(text[:9])
            await response.write(text[9:])
        await response.write(b"data: [DONE]\r\n\r\n")
        await response.write_eof()
        return response


# -- the ingest: stores what it is sent, keyed by request id --------------------------------------


@dataclass
class Ingest:
    posts: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    received_ids: list[str] = field(default_factory=list)  # every id in every accepted batch
    spans: list[tuple[float, float]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/sla/edge/", self.receive)
        return app

    async def receive(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "token"}, status=401)
        batch = await request.json()
        # The portal's rules for a batch (portal.sla.services.edge_batch_record), checked whole.
        lo, hi = batch["covered_from"], batch["covered_to"]
        assert batch["endpoint"] == ENDPOINT_ID
        assert lo < hi and hi - lo <= 3600
        for row in batch["requests"]:
            assert lo <= row["arrived_at"] < hi, (row, lo, hi)
            assert isinstance(row["id"], str) and 0 < len(row["id"]) <= 64
            assert isinstance(row["status"], int) and 100 <= row["status"] <= 599
        self.posts.append(batch)
        self.spans.append((lo, hi))
        for row in batch["requests"]:
            self.received_ids.append(row["id"])
            self.rows[row["id"]] = row
        return web.json_response({"received": len(batch["requests"])})

    def covered(self, at: float) -> bool:
        return any(lo <= at < hi for lo, hi in self.spans)


@asynccontextmanager
async def serve(app: web.Application, port: int = 0) -> AsyncIterator[int]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def settings_for(upstream_port: int, ingest_port: int, **overrides: Any) -> EdgeProxySettings:
    values: dict[str, Any] = {
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "upstream_url": f"http://127.0.0.1:{upstream_port}",
        "ingest": IngestTarget(
            url=f"http://127.0.0.1:{ingest_port}/sla/edge/", endpoint_id=ENDPOINT_ID, token=TOKEN
        ),
        "flush_interval_s": 3600.0,  # the tests flush when they choose
        "drain_timeout_s": 5.0,
    }
    return EdgeProxySettings(**(values | overrides))


@asynccontextmanager
async def proxy_for(settings: EdgeProxySettings) -> AsyncIterator[tuple[EdgeProxy, list[EdgeRequestRecord]]]:
    proxy = EdgeProxy(settings, clock_us=clock_us)
    records: list[EdgeRequestRecord] = []
    proxy.on_record = records.append
    await proxy.start()
    try:
        yield proxy, records
    finally:
        await proxy.stop()


async def fetch(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None
) -> tuple[int, bytes, str | None]:
    method = "POST" if body is not None else "GET"
    async with session.request(method, url, json=body) as response:
        return response.status, await response.read(), response.headers.get(REQUEST_ID_HEADER)


# -- tests ------------------------------------------------------------------------------------------


def test_streams_pass_through_byte_for_byte_and_every_request_is_recorded_once() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        async with (
            serve(upstream.app()) as up_port,
            serve(ingest.app()) as in_port,
            aiohttp.ClientSession() as session,
        ):
            async with proxy_for(settings_for(up_port, in_port)) as (proxy, records):
                base = f"http://127.0.0.1:{proxy.port}"
                bodies: list[dict[str, Any]] = [
                    {"model": "tiny", "prompt": f"p{i}", "max_tokens": 4, "stream": True} for i in range(6)
                ]
                bodies += [{"model": "tiny", "prompt": f"n{i}", "max_tokens": 4} for i in range(3)]
                chats = [
                    {"model": "tiny", "messages": [{"role": "user", "content": f"chat{i}"}], "stream": True}
                    for i in range(3)
                ]
                calls = [(f"{base}/v1/completions", b) for b in bodies]
                calls += [(f"{base}/v1/chat/completions", c) for c in chats]
                via_proxy = await asyncio.gather(*(fetch(session, url, b) for url, b in calls))
                sent = {name: dict(times) for name, times in upstream.sent.items()}
                direct = await asyncio.gather(
                    *(fetch(session, url.replace(base, f"http://127.0.0.1:{up_port}"), b) for url, b in calls)
                )
                models = await fetch(session, f"{base}/v1/models")
                assert models[0] == 200 and models[2] is None  # passed through, not measured
                # Byte for byte what the engine sent, and one id per request in the header.
                assert [(s, b) for s, b, _ in via_proxy] == [(s, b) for s, b, _ in direct]
                ids = [rid for _, _, rid in via_proxy]
                assert all(ids) and len(set(ids)) == len(calls)
                by_id = {r.request_id: r for r in records}
                assert sorted(by_id) == sorted(ids)
                for (_, body), request_id in zip(calls, ids, strict=True):
                    record = by_id[request_id]
                    assert record.status == 200 and record.error is None and record.ttft_ms is not None
                    assert record.ttft_ms >= 0
                    assert record.streamed == bool(body.get("stream"))
                # The chat's TTFT is to the first content chunk, never to the role-only chunk.
                for (_, body), request_id in zip(calls[-3:], ids[-3:], strict=True):
                    record = by_id[request_id]
                    name = body["messages"][0]["content"]
                    assert record.arrived_at_us + record.ttft_ms * 1000 >= sent[name]["content"]
                    assert sent[name]["content"] > sent[name]["role"]
                arrivals = [r.arrived_at_us for r in records]
                assert len(set(arrivals)) == len(arrivals)
            # Stopped: everything was flushed, each request once, each arrival inside a covered span.
            assert sorted(ingest.received_ids) == sorted(ids)
            for request_id in ids:
                row = ingest.rows[request_id]
                record = by_id[request_id]
                assert row["arrived_at"] == record.arrived_at_us / 1e6 and ingest.covered(row["arrived_at"])
                assert (row["ttft_ms"], row["status"], row["streamed"]) == (
                    record.ttft_ms,
                    200,
                    record.streamed,
                )
            assert proxy.stats().delivered == len(calls) and proxy.stats().dropped == 0

    asyncio.run(main())


def test_failures_are_recorded_as_such() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        async with (
            serve(upstream.app()) as up_port,
            serve(ingest.app()) as in_port,
            aiohttp.ClientSession() as session,
        ):
            async with proxy_for(settings_for(up_port, in_port, max_body_bytes=4096)) as (proxy, records):
                url = f"http://127.0.0.1:{proxy.port}/v1/completions"
                status, body, failed_id = await fetch(session, url, {"prompt": "fail500", "stream": True})
                assert status == 500 and b"engine dead" in body
                # A stream the engine breaks is broken for the client too, never a clean end.
                with pytest.raises(aiohttp.ClientPayloadError):
                    await fetch(session, url, {"prompt": "break", "stream": True})
                status, body, error_event_id = await fetch(
                    session, url, {"prompt": "error-event", "stream": True}
                )
                assert status == 200 and b"out of KV cache" in body
                status, _, big_id = await fetch(session, url, {"prompt": "x" * 5000})
                assert status == 413
            async with proxy_for(settings_for(free_port(), in_port)) as (dead, dead_records):
                status, body, unreachable_id = await fetch(
                    session, f"http://127.0.0.1:{dead.port}/v1/completions", {"prompt": "p", "stream": True}
                )
                assert status == 502 and b"did not answer" in body
        outcomes = {r.request_id: (r.status, r.error, r.ttft_ms is None) for r in records}
        broken = [r for r in records if r.request_id not in {failed_id, error_event_id, big_id}]
        assert len(records) == 4 and len(broken) == 1
        assert outcomes[failed_id] == (500, None, True)
        assert outcomes[error_event_id][:2] == (200, ERROR_STREAM_ERROR)
        assert outcomes[big_id] == (413, None, True)
        assert (broken[0].status, broken[0].error) == (200, ERROR_STREAM_BROKEN)
        assert [(r.request_id, r.status, r.error) for r in dead_records] == [
            (unreachable_id, 502, ERROR_UPSTREAM_UNREACHABLE)
        ]
        # What the SLA judges: a stream that broke or carried an error failed, whatever went out first.
        statuses = {rid: row["status"] for rid, row in ingest.rows.items()}
        assert statuses == {
            failed_id: 500,
            broken[0].request_id: 502,
            error_event_id: 502,
            big_id: 413,
            unreachable_id: 502,
        }
        assert ingest.rows[broken[0].request_id]["error"] == ERROR_STREAM_BROKEN

    asyncio.run(main())


def test_an_engine_that_goes_silent_mid_stream_is_cut_off_and_recorded_as_a_timeout() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        async with (
            serve(upstream.app()) as up_port,
            serve(ingest.app()) as in_port,
            proxy_for(settings_for(up_port, in_port, upstream_read_timeout_s=0.5)) as (proxy, records),
            aiohttp.ClientSession() as session,
        ):
            with pytest.raises(aiohttp.ClientPayloadError):
                await fetch(
                    session,
                    f"http://127.0.0.1:{proxy.port}/v1/completions",
                    {"prompt": "stall", "stream": True},
                )
        [record] = records
        assert (record.status, record.error, record.ttft_ms is not None) == (
            200,
            ERROR_UPSTREAM_TIMEOUT,
            True,
        )
        assert ingest.rows[record.request_id]["status"] == 504

    asyncio.run(main())


def test_a_client_that_leaves_cancels_the_engine_request() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        async with (
            serve(upstream.app()) as up_port,
            serve(ingest.app()) as in_port,
            proxy_for(settings_for(up_port, in_port)) as (proxy, records),
        ):
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"http://127.0.0.1:{proxy.port}/v1/completions",
                    json={"prompt": "slow", "stream": True},
                ) as response,
            ):
                assert await response.content.readany()  # the first chunk came through
                response.close()  # the client goes away mid-stream
            # The engine's handler sees its connection go (a liveness wait, not a timing).
            await asyncio.wait_for(upstream.cancelled.wait(), timeout=30)
            while not records:
                await asyncio.sleep(0.01)
        [record] = records
        assert (record.status, record.error) == (499, ERROR_CLIENT_DISCONNECTED)
        assert record.ttft_ms is not None  # its first token had come
        assert ingest.rows[record.request_id]["status"] == 499

    asyncio.run(main())


def test_ingest_down_then_up_delivers_every_record_exactly_once() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        in_port = free_port()
        async with (
            serve(upstream.app()) as up_port,
            aiohttp.ClientSession() as session,
            proxy_for(settings_for(up_port, in_port)) as (proxy, records),
        ):
            url = f"http://127.0.0.1:{proxy.port}/v1/completions"
            first = [await fetch(session, url, {"prompt": f"a{i}", "stream": True}) for i in range(3)]
            assert proxy.shipper is not None
            assert not await proxy.shipper.flush()  # nobody listens at the ingest yet
            assert not await proxy.shipper.flush()
            assert proxy.shipper.failures == 2 and "unreachable" in proxy.shipper.last_error
            assert proxy.shipper.backoff_s() > proxy.shipper.backoff_initial_s
            async with serve(ingest.app(), in_port):
                second = [await fetch(session, url, {"prompt": f"b{i}"}) for i in range(2)]
                assert await proxy.shipper.flush()
                assert proxy.shipper.failures == 0
                assert sorted(ingest.received_ids) == sorted(r[2] for r in first + second)
                third = await fetch(session, url, {"prompt": "c", "stream": True})
                await proxy.stop()  # the last flush at shutdown
        sent = [r[2] for r in [*first, *second, third]]
        assert sorted(ingest.received_ids) == sorted(sent)
        assert len(ingest.received_ids) == len(set(ingest.received_ids)) == len(records) == 6
        # The spans sent cover the proxy's whole up-time without a hole.
        spans = sorted(ingest.spans)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        assert proxy.stats().dropped == 0 and proxy.stats().buffered == 0

    asyncio.run(main())


def test_records_go_out_on_their_own_every_flush_interval() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        async with (
            serve(upstream.app()) as up_port,
            serve(ingest.app()) as in_port,
            proxy_for(settings_for(up_port, in_port, flush_interval_s=0.1)) as (proxy, _records),
            aiohttp.ClientSession() as session,
        ):
            url = f"http://127.0.0.1:{proxy.port}/v1/completions"
            ids = [(await fetch(session, url, {"prompt": f"t{i}", "stream": True}))[2] for i in range(3)]
            # Delivered while the proxy runs, without a flush from here (a liveness wait).
            async with asyncio.timeout(30):
                while len(ingest.received_ids) < 3:
                    await asyncio.sleep(0.05)
            assert sorted(ingest.received_ids) == sorted(ids)
            assert len(ingest.posts) >= 1 and proxy.stats().delivered == 3

    asyncio.run(main())


def test_a_full_buffer_drops_the_oldest_and_leaves_a_gap_in_coverage() -> None:
    async def main() -> None:
        upstream, ingest = Upstream(), Ingest()
        in_port = free_port()
        async with (
            serve(upstream.app()) as up_port,
            aiohttp.ClientSession() as session,
            proxy_for(settings_for(up_port, in_port, max_buffered_records=4)) as (proxy, records),
        ):
            url = f"http://127.0.0.1:{proxy.port}/v1/completions"
            assert proxy.shipper is not None
            for i in range(10):
                await fetch(session, url, {"prompt": f"r{i}", "stream": True})
                if i % 3 == 0:
                    await proxy.shipper.flush()  # the portal is down: sealed, kept, not sent
            assert proxy.stats().dropped == 6 and proxy.stats().buffered == 4
            async with serve(ingest.app(), in_port):
                await proxy.stop()
        kept, lost = records[-4:], records[:-4]
        assert sorted(ingest.received_ids) == sorted(r.request_id for r in kept)
        # Every dropped request's arrival lies in a gap: the portal cannot read it as "no traffic".
        assert not any(ingest.covered(r.arrived_at_us / 1e6) for r in lost)
        assert all(ingest.covered(r.arrived_at_us / 1e6) for r in kept)
        assert proxy.stats().dropped == 6

    asyncio.run(main())


def test_the_buffer_seals_only_what_has_finished_and_splits_batches_at_arrivals() -> None:
    buffer = EdgeBuffer(started_at_us=1_000, max_records=10, max_batch_records=2)

    def done(request_id: str, at: int) -> EdgeRequestRecord:
        return EdgeRequestRecord(
            request_id=request_id, arrived_at_us=at, ttft_ms=1.0, status=200, streamed=True
        )

    a = buffer.arrived("a", 1_100)
    b = buffer.arrived("b", 1_100)  # the same microsecond: moved one on
    c = buffer.arrived("c", 1_200)
    assert (a, b, c) == (1_100, 1_101, 1_200)
    buffer.finished(done("b", b))
    buffer.seal(5_000)
    batch = buffer.next_batch()
    # "a" still runs: nothing from its arrival on may be sealed yet.
    assert batch is not None and (batch.from_us, batch.to_us, batch.records) == (1_000, 1_100, [])
    buffer.delivered(batch)
    for request_id, at in (("a", a), ("c", c)):
        buffer.finished(done(request_id, at))
    d = buffer.arrived("d", 1_300)
    buffer.finished(done("d", d))
    buffer.seal(6_000)
    segments = []
    while (segment := buffer.next_batch()) is not None:
        segments.append((segment.from_us, segment.to_us, [r.request_id for r in segment.records]))
        buffer.delivered(segment)
    # At most two records a batch: the next batch starts exactly at the next arrival.
    assert segments == [(1_100, 1_200, ["a", "b"]), (1_200, 6_000, ["c", "d"])]
    assert buffer.stats().delivered == 4


def test_the_command_takes_its_token_from_the_environment_only(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "serving.edge",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
        "--ingest-url",
        "http://127.0.0.1:9/sla/edge/",
        "--endpoint-id",
        ENDPOINT_ID,
    ]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and TOKEN_ENV in done.stderr
    flag = subprocess.run(
        [*command, "--token", "x"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert flag.returncode == 2 and "unrecognized arguments: --token" in flag.stderr
