"""The measuring proxy: an asyncio reverse proxy in front of the engine's OpenAI-compatible server.

Every request passes through unchanged (headers less the hop-by-hop ones, body bytes as they
are, compressed or not), and every response comes back unchanged, each chunk of a stream written
to the client as soon as it arrives. Generation requests (`POST /v1/completions` and
`/v1/chat/completions`) are also measured: the proxy gives each an id (returned in the
`X-Tailguard-Request-Id` header), notes its arrival, its time to first token as the client
sees it (to the first server-sent event carrying generated text; for a response that is not
streamed, to its last byte, and the record says so), and how it ended. Other paths (`/v1/models`,
`/health`, `/metrics`) pass through unmeasured: they generate nothing, so they have no TTFT.

A client that goes away cancels its request upstream (the handler is cancelled and the engine
connection closed, which makes vLLM abort the request). A stream that breaks upstream is cut
off for the client as well (its connection is closed without the stream's end), so the client
never mistakes half an answer for a whole one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict

from serving.edge.records import (
    ERROR_CLIENT_DISCONNECTED,
    ERROR_PROXY_FAILED,
    ERROR_PROXY_STOPPED,
    ERROR_STREAM_BROKEN,
    ERROR_STREAM_ERROR,
    ERROR_UPSTREAM_TIMEOUT,
    ERROR_UPSTREAM_UNREACHABLE,
    STATUS_CLIENT_CLOSED,
    BufferStats,
    EdgeBuffer,
    EdgeRequestRecord,
)
from serving.edge.shipper import IngestShipper, IngestTarget

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Tailguard-Request-Id"
MEASURED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
# Connection-level headers (RFC 9110 7.6.1) belong to one hop; the length and framing of the
# other side's message are set by aiohttp for the message it writes.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
# Delta fields that carry generated output in chat streams (text, reasoning, tool calls).
_DELTA_CONTENT = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")


@dataclass(frozen=True)
class EdgeProxySettings:
    listen_host: str
    listen_port: int  # 0: any free port (see EdgeProxy.port)
    upstream_url: str  # the engine's (or router's) base URL, e.g. http://127.0.0.1:8000
    ingest: IngestTarget
    max_body_bytes: int = 16 * 2**20  # larger request bodies are refused with 413
    max_buffered_records: int = 100_000
    flush_interval_s: float = 5.0
    ingest_timeout_s: float = 10.0
    upstream_connect_timeout_s: float = 10.0
    # Longest silence from the engine: before the first token (a long queue and prefill) and
    # between chunks. Past it the request is cut off and recorded as a timeout.
    upstream_read_timeout_s: float = 600.0
    # At shutdown: how long running requests may finish, then how long the last flush may retry.
    shutdown_grace_s: float = 10.0
    drain_timeout_s: float = 10.0
    record_log: Path | None = field(default=None)  # JSONL of every measured request, when set


def _wall_clock_us() -> Callable[[], int]:
    """Wall-clock microseconds that never go backwards: one reading of the wall clock, then the
    monotonic clock (a stepped system clock must not reorder arrivals)."""
    wall_ns, mono_ns = time.time_ns(), time.monotonic_ns()
    return lambda: (wall_ns + time.monotonic_ns() - mono_ns) // 1000


class _SSEScanner:
    """Reads a server-sent event stream as it passes: when the first generated content comes,
    whether it ended with `data: [DONE]`, and whether the engine reported an error inside it."""

    # One event larger than this is not the OpenAI protocol: the scanner stops holding it (the
    # bytes still pass through) and the stream counts as ended without its [DONE].
    MAX_EVENT_BYTES = 4 * 2**20

    def __init__(self) -> None:
        self._pending = b""
        self.content_seen = False
        self.done = False
        self.error = False

    def feed(self, chunk: bytes) -> bool:
        """Scan `chunk`; True when it completed the first event with generated content."""
        if self.done or len(self._pending) > self.MAX_EVENT_BYTES:
            return False
        self._pending += chunk
        first = False
        while True:
            events = self._pending.replace(b"\r\n", b"\n").split(b"\n\n", 1)
            if len(events) < 2:
                break
            event, self._pending = events
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    self.done = True
                    return first
                if data.startswith(b'{"error"') or b'"object":"error"' in data[:40]:
                    self.error = True
                elif not self.content_seen and _has_content(data):
                    self.content_seen = first = True
        return first


def _has_content(data: bytes) -> bool:
    try:
        event = json.loads(data)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    if "error" in event or event.get("object") == "error":
        return False
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(delta.get(k) for k in _DELTA_CONTENT):
            return True
    return False


def _forwardable(headers: Any) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in _HOP_BY_HOP:
            out.add(name, value)
    return out


class _Measurement:
    """What one measured request has shown so far."""

    def __init__(self, request_id: str, arrived_at_us: int) -> None:
        self.request_id, self.arrived_at_us = request_id, arrived_at_us
        self.started = time.monotonic()
        self.ttft_ms: float | None = None
        self.status = 0
        self.streamed = False
        self.error: str | None = None

    def mark_first_token(self) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = (time.monotonic() - self.started) * 1000.0

    def record(self) -> EdgeRequestRecord:
        return EdgeRequestRecord(
            request_id=self.request_id,
            arrived_at_us=self.arrived_at_us,
            ttft_ms=self.ttft_ms,
            status=self.status,
            streamed=self.streamed,
            error=self.error,
        )


class EdgeProxy:
    """The proxy and its shipper on the running event loop: `await start()`, `await stop()`."""

    def __init__(self, settings: EdgeProxySettings, *, clock_us: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.clock_us = clock_us or _wall_clock_us()
        self.upstream = settings.upstream_url.rstrip("/")
        self.buffer: EdgeBuffer | None = None
        self.shipper: IngestShipper | None = None
        # Called with every finished record (after it is buffered): tests and embedders read the
        # proxy's own view through it.
        self.on_record: Callable[[EdgeRequestRecord], None] | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._stop = asyncio.Event()
        self._ship_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped: bool | None = None  # what stop() returned, once it has run
        self._log: IO[str] | None = None
        self.port = settings.listen_port

    # -- life cycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self.buffer = EdgeBuffer(started_at_us=self.clock_us(), max_records=s.max_buffered_records)
        self.shipper = IngestShipper(
            self.buffer,
            s.ingest,
            clock_us=self.clock_us,
            flush_interval_s=s.flush_interval_s,
            timeout_s=s.ingest_timeout_s,
        )
        await self.shipper.__aenter__()
        if s.record_log is not None:
            s.record_log.parent.mkdir(parents=True, exist_ok=True)
            self._log = s.record_log.open("a", buffering=1)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, connect=s.upstream_connect_timeout_s, sock_read=s.upstream_read_timeout_s
            ),
            # Bytes pass through as the engine sent them: never decompressed, never re-encoded.
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application(client_max_size=s.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Cancelling the handler when its client disconnects is what cancels the upstream request.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=s.shutdown_grace_s, access_log=None
        )
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, s.listen_host, s.listen_port, reuse_address=True)
        await self._site.start()
        server = self._site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        self._ship_task = asyncio.create_task(self.shipper.run(self._stop))
        logger.info("edge proxy on %s:%d in front of %s", s.listen_host, self.port, self.upstream)

    async def stop(self) -> bool:
        """Stop accepting, let running requests finish (up to the grace), and send everything
        recorded. Returns whether the portal took all of it. Idempotent."""
        if self._stopped is not None:
            return self._stopped
        self._stopping = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._stop.set()
        if self._ship_task is not None:
            await self._ship_task
            self._ship_task = None
        delivered = True
        if self.shipper is not None:
            delivered = await self.shipper.drain(deadline_s=self.settings.drain_timeout_s)
            await self.shipper.__aexit__()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if not delivered and self.buffer is not None:
            logger.error(
                "edge proxy stopped with %d records the portal did not take", self.buffer.stats().buffered
            )
        self._stopped = delivered
        return delivered

    def stats(self) -> BufferStats:
        assert self.buffer is not None, "the proxy has not started"
        return self.buffer.stats()

    # -- requests ----------------------------------------------------------------------------------

    def _finish(self, measurement: _Measurement) -> None:
        record = measurement.record()
        assert self.buffer is not None
        self.buffer.finished(record)
        if self._log is not None:
            self._log.write(json.dumps(record.to_log()) + "\n")
        if self.on_record is not None:
            self.on_record(record)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        measured = request.method == "POST" and request.path in MEASURED_PATHS
        measurement: _Measurement | None = None
        if measured:
            assert self.buffer is not None
            request_id = uuid.uuid4().hex
            measurement = _Measurement(request_id, self.buffer.arrived(request_id, self.clock_us()))
        try:
            return await self._forward(request, measurement)
        except (asyncio.CancelledError, ConnectionError):
            # Cancelled: the client left (or the proxy is shutting down); a connection error
            # here is the client's socket, gone before the response started.
            if measurement is not None:
                if self._stopping:
                    measurement.status, measurement.error = 503, ERROR_PROXY_STOPPED
                else:
                    measurement.status, measurement.error = STATUS_CLIENT_CLOSED, ERROR_CLIENT_DISCONNECTED
            raise
        except Exception:
            if measurement is not None:
                measurement.error = ERROR_PROXY_FAILED
                # A status the ingest accepts: one bad row would make it refuse the whole batch.
                if not 100 <= measurement.status <= 599:
                    measurement.status = 502
            raise
        finally:
            if measurement is not None:
                self._finish(measurement)

    def _refusal(self, status: int, kind: str, message: str, request_id: str | None) -> web.Response:
        headers = {REQUEST_ID_HEADER: request_id} if request_id else None
        # The OpenAI error shape, so clients show the message.
        body = {"error": {"message": message, "type": kind, "code": status}}
        return web.json_response(body, status=status, headers=headers)

    async def _forward(self, request: web.Request, m: _Measurement | None) -> web.StreamResponse:
        assert self._session is not None
        request_id = m.request_id if m is not None else None
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            if m is not None:
                m.status = 413
            return self._refusal(
                413,
                "request_too_large",
                f"The request body is larger than this endpoint accepts ({self.settings.max_body_bytes} bytes).",
                request_id,
            )
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                data=body if body else None,
                headers=_forwardable(request.headers),
                skip_auto_headers=(hdrs.USER_AGENT, hdrs.ACCEPT_ENCODING, hdrs.CONTENT_TYPE),
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            timeout = isinstance(exc, TimeoutError)
            status = 504 if timeout else 502
            if m is not None:
                m.status, m.error = status, ERROR_UPSTREAM_TIMEOUT if timeout else ERROR_UPSTREAM_UNREACHABLE
            return self._refusal(
                status,
                "upstream_unavailable",
                f"The engine did not answer ({type(exc).__name__}).",
                request_id,
            )
        complete = False
        try:
            response = await self._relay(request, upstream, m)
            complete = upstream.content.at_eof()
            return response
        finally:
            if complete:
                upstream.release()
            else:
                # Not read to its end (the client left, the stream broke): the engine connection
                # is closed, which ends the request there too.
                upstream.close()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, m: _Measurement | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=_forwardable(upstream.headers)
        )
        if m is not None:
            response.headers[REQUEST_ID_HEADER] = m.request_id
            m.status = upstream.status
        chunked = "chunked" in upstream.headers.get(hdrs.TRANSFER_ENCODING, "").lower()
        if upstream.content_length is not None and not chunked:
            response.content_length = upstream.content_length
        streamed = upstream.headers.get(hdrs.CONTENT_TYPE, "").startswith("text/event-stream")
        succeeded = 200 <= upstream.status < 300
        scanner = _SSEScanner() if m is not None and streamed and succeeded else None
        if m is not None:
            m.streamed = streamed
        await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                if m is not None:
                    m.error = ERROR_UPSTREAM_TIMEOUT if isinstance(exc, TimeoutError) else ERROR_STREAM_BROKEN
                return self._cut_off(request, response)
            if not chunk:
                break
            if scanner is not None and scanner.feed(chunk) and m is not None:
                m.mark_first_token()
            try:
                await response.write(chunk)
            except ConnectionError:
                if m is not None:
                    m.status, m.error = STATUS_CLIENT_CLOSED, ERROR_CLIENT_DISCONNECTED
                return response
        if m is not None and succeeded:
            if scanner is None:
                m.mark_first_token()  # not streamed: the whole answer is its first token
            elif scanner.error:
                m.error = ERROR_STREAM_ERROR
            elif not scanner.done:
                m.error = ERROR_STREAM_BROKEN  # the engine closed the stream before its end
        await response.write_eof()
        return response

    def _cut_off(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        # Closing the connection without the stream's terminating chunk: the client sees a broken
        # response, not a complete one.
        with contextlib.suppress(Exception):
            if request.transport is not None:
                request.transport.close()
        return response
