"""Sends the buffer's sealed segments to the portal's edge ingest, oldest first.

A batch is retried (same span and request ids, less any the buffer's bound dropped) until the portal answers 200; the
ingest stores a request id once, so a batch that arrived but whose answer was lost does no harm
when sent again. While the portal is unreachable or answers 5xx, 408 or 429, the shipper waits
with exponential back-off (capped) and the buffer's bound decides what is given up. Any other 4xx
means the portal will never take this batch (a wrong token, an unknown endpoint, a span the
portal refuses): it is logged with the portal's reason and dropped, counted as rejected, so one
bad batch cannot stop every later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from serving.edge.records import EdgeBuffer, Segment

logger = logging.getLogger(__name__)

_RETRYABLE_4XX = frozenset({408, 429})


@dataclass(frozen=True)
class IngestTarget:
    url: str  # the portal's edge ingest, e.g. https://portal.example/sla/edge/
    endpoint_id: str  # the portal's id of the endpoint this proxy fronts
    token: str = field(repr=False)  # SLA_EDGE_INGEST_TOKEN; never printed


class IngestShipper:
    def __init__(
        self,
        buffer: EdgeBuffer,
        target: IngestTarget,
        *,
        clock_us: Callable[[], int],
        flush_interval_s: float = 5.0,
        timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.buffer, self.target, self.clock_us = buffer, target, clock_us
        self.flush_interval_s, self.timeout_s = flush_interval_s, timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.failures = 0  # consecutive failed attempts (0 while the portal takes batches)
        self.last_error = ""  # the last attempt's failure, cause first
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> IngestShipper:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def backoff_s(self) -> float:
        if not self.failures:
            return self.flush_interval_s
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (self.failures - 1)))

    async def _post(self, segment: Segment) -> bool:
        """One attempt at the oldest batch; True when the portal settled it (taken or refused)."""
        assert self._session is not None, "use the shipper as an async context manager"
        headers = {"Authorization": f"Bearer {self.target.token}"}
        try:
            async with self._session.post(
                self.target.url, json=segment.payload(self.target.endpoint_id), headers=headers
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.buffer.failed(segment)
            self.failures += 1
            self.last_error = f"the portal's ingest is unreachable ({type(exc).__name__}: {exc})"
            logger.warning("edge ingest: %s; retrying in %.1f s", self.last_error, self.backoff_s())
            return False
        if status == 200:
            self.buffer.delivered(segment)
            self.failures, self.last_error = 0, ""
            return True
        if 400 <= status < 500 and status not in _RETRYABLE_4XX:
            self.buffer.rejected(segment)
            self.failures, self.last_error = 0, f"the portal refused a batch ({status}): {text[:300]}"
            logger.error(
                "edge ingest: the portal refused a batch of %d records (%d): %s",
                len(segment.records),
                status,
                text[:300],
            )
            return True
        self.buffer.failed(segment)
        self.failures += 1
        self.last_error = f"the portal's ingest answered {status}: {text[:300]}"
        logger.warning("edge ingest: %s; retrying in %.1f s", self.last_error, self.backoff_s())
        return False

    async def flush(self) -> bool:
        """Seal coverage up to now and send what is sealed; False when the portal did not take
        everything (the rest waits for the next round)."""
        self.buffer.seal(self.clock_us())
        while (segment := self.buffer.next_batch()) is not None:
            if not await self._post(segment):
                return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every `flush_interval_s` (backing off while the portal fails) until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.backoff_s())
            if not stop.is_set():
                try:
                    await self.flush()
                except Exception:
                    # A bug here must not end the measuring: the records stay buffered (bounded).
                    self.failures += 1
                    logger.exception("edge ingest: flushing failed; retrying in %.1f s", self.backoff_s())

    async def drain(self, *, deadline_s: float) -> bool:
        """The last flush at shutdown: retry (with back-off) for at most `deadline_s`."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while True:
            if await self.flush():
                return True
            left = end - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.backoff_s(), left))
