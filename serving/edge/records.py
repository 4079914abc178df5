"""What the measuring proxy records, and the bounded buffer that holds it until the portal has it.

The portal's ingest (`/sla/edge/`) takes batches that each *cover* a span of time: every request
that arrived in the span is in the batch, and time no batch covers is a gap in the SLA, never
compliance. So the buffer is organised by time, not only by request:

- A request is *in flight* from its arrival until its record is complete (the last byte went
  out, or it failed). Coverage is sealed only up to the earliest in-flight arrival, so a sealed
  span never misses a request that is still running.
- Sealed spans become *segments* of at most `max_batch_records` records and one hour (the
  ingest's limits), sent oldest first and retried until the portal takes them.
- The buffer holds at most `max_records` records. When a new one would exceed that, the oldest
  record not being sent right now is dropped and counted, and the coverage from its segment's
  start up to just after its arrival is given up: the portal sees a gap there, not "no traffic".
  A request that finishes inside a span already given up is dropped and counted as well.

Arrival times are whole Unix microseconds, strictly increasing per proxy: the ingest stores
microseconds, and distinct times let a segment end exactly at the next segment's first arrival.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# The ingest's limits (portal.sla.services.EDGE_BATCH_MAX, EDGE_BATCH_MAX_SPAN).
INGEST_MAX_BATCH_RECORDS = 10_000
INGEST_MAX_SPAN_US = 3600 * 1_000_000

# Why a request failed, when it did. The ingest judges a request by its status and whether it had
# a first token; these words travel beside them (the ingest stores neither, it ignores them).
ERROR_UPSTREAM_UNREACHABLE = "upstream_unreachable"  # no response from the engine at all
ERROR_UPSTREAM_TIMEOUT = "upstream_timeout"  # the engine accepted it but went silent too long
ERROR_STREAM_BROKEN = "stream_broken"  # the response stopped before its end
ERROR_STREAM_ERROR = "stream_error"  # the engine reported an error inside the stream
ERROR_CLIENT_DISCONNECTED = "client_disconnected"  # the client left; the engine's work was cancelled
ERROR_PROXY_STOPPED = "proxy_stopped"  # cut off by the proxy's own shutdown
ERROR_PROXY_FAILED = "proxy_failed"  # the proxy itself failed (logged with its traceback)
# Failures on the engine's side after a success status went out: the client did not get its
# answer, so the ingest is told 502 (504 when the engine went silent) instead of that status.
_STATUS_AFTER_HEADERS = {
    ERROR_STREAM_BROKEN: 502,
    ERROR_STREAM_ERROR: 502,
    ERROR_UPSTREAM_TIMEOUT: 504,
    ERROR_PROXY_FAILED: 502,
}

# The status recorded for a client that left before its answer (nginx's convention: no real
# response code was ever sent).
STATUS_CLIENT_CLOSED = 499


@dataclass(frozen=True)
class EdgeRequestRecord:
    """One measured request. No prompt, no output, no key: only when, how fast, and how it ended."""

    request_id: str  # the proxy's id, also sent to the client in the X-Tailguard-Request-Id header
    arrived_at_us: int  # Unix microseconds when the request's headers reached the proxy
    # Streamed responses: to the first chunk that carries generated content. Non-streamed ones: to
    # the last byte of the whole response (see `streamed`). None when no answer came.
    ttft_ms: float | None
    status: int  # the HTTP status the client got (499: it left first; 502/504: no engine answer)
    streamed: bool  # whether ttft_ms is time to first streamed content (True) or to the full response
    error: str | None = None  # one of the ERROR_* words, None when the request went through

    @property
    def ingest_status(self) -> int:
        """The status the SLA judges: a stream that broke after a 200 went out failed all the same."""
        if self.error in _STATUS_AFTER_HEADERS and self.status < 500:
            return _STATUS_AFTER_HEADERS[self.error]
        return self.status

    def to_row(self) -> dict[str, Any]:
        """The ingest's request row (`id`, `arrived_at`, `ttft_ms`, `status`) and, beside it,
        `streamed` and `error`, which say how ttft_ms was measured and why a request failed."""
        return {
            "id": self.request_id,
            "arrived_at": self.arrived_at_us / 1e6,
            "ttft_ms": self.ttft_ms,
            "status": self.ingest_status,
            "streamed": self.streamed,
            "error": self.error,
        }

    def to_log(self) -> dict[str, Any]:
        """The proxy's own record of it, as its record log holds it (the client-facing status)."""
        return {
            "id": self.request_id,
            "arrived_at_us": self.arrived_at_us,
            "ttft_ms": self.ttft_ms,
            "status": self.status,
            "ingest_status": self.ingest_status,
            "streamed": self.streamed,
            "error": self.error,
        }


@dataclass
class Segment:
    """A sealed span [from_us, to_us) and every record that arrived in it (arrival order)."""

    from_us: int
    to_us: int
    records: list[EdgeRequestRecord] = field(default_factory=list)

    def payload(self, endpoint_id: str) -> dict[str, Any]:
        return {
            "endpoint": endpoint_id,
            "covered_from": self.from_us / 1e6,
            "covered_to": self.to_us / 1e6,
            "requests": [r.to_row() for r in self.records],
        }


@dataclass(frozen=True)
class BufferStats:
    in_flight: int  # requests still running
    buffered: int  # complete records not yet taken by the portal
    segments: int  # sealed spans waiting to be sent (the one being sent included)
    delivered: int  # records the portal took
    dropped: int  # records given up because the buffer was full (their time became a gap)
    rejected: int  # records in batches the portal refused for good (a 4xx other than 408/429)


def _arrival(record: EdgeRequestRecord) -> int:
    return record.arrived_at_us


class EdgeBuffer:
    """The records between the proxy and the portal (see the module docstring). Not thread-safe:
    the proxy's event loop owns it."""

    def __init__(
        self,
        *,
        started_at_us: int,
        max_records: int = 100_000,
        max_batch_records: int = INGEST_MAX_BATCH_RECORDS,
        max_span_us: int = INGEST_MAX_SPAN_US,
        max_segments: int = 24 * 7,
    ) -> None:
        if max_records < 2:
            raise ValueError("the buffer must hold at least 2 records")
        if not 0 < max_span_us <= INGEST_MAX_SPAN_US:
            raise ValueError("a segment spans at most an hour (the ingest's limit)")
        self.max_records = max_records
        # At most half the buffer is ever out being sent, so a drop always finds a record that is not.
        self.max_batch_records = max(1, min(max_batch_records, INGEST_MAX_BATCH_RECORDS, max_records // 2))
        self.max_span_us = max_span_us
        self.max_segments = max(1, max_segments)
        self._open_from_us = started_at_us  # coverage not yet sealed starts here
        self._last_arrival_us = started_at_us - 1
        self._open: list[EdgeRequestRecord] = []  # complete, not sealed, in arrival order
        self._in_flight: dict[str, int] = {}  # request id -> arrival
        self._sealed: deque[Segment] = deque()
        self._sending: Segment | None = None  # handed to the sender, not yet acknowledged
        self._delivered = self._dropped = self._rejected = 0

    # -- requests ----------------------------------------------------------------------------------

    def arrived(self, request_id: str, now_us: int) -> int:
        """Register a request that just arrived; returns its arrival time (unique and increasing)."""
        arrived_us = max(now_us, self._last_arrival_us + 1)
        self._last_arrival_us = arrived_us
        self._in_flight[request_id] = arrived_us
        return arrived_us

    def finished(self, record: EdgeRequestRecord) -> None:
        """A request's record is complete."""
        self._in_flight.pop(record.request_id, None)
        if record.arrived_at_us < self._open_from_us:
            self._dropped += 1  # its time was given up while it ran
            return
        bisect.insort(self._open, record, key=_arrival)
        self._enforce_bound()

    # -- coverage ----------------------------------------------------------------------------------

    def seal(self, now_us: int) -> None:
        """Seal coverage up to now, or up to the earliest request still running."""
        horizon = min([now_us, *self._in_flight.values()])
        if horizon <= self._open_from_us:
            return
        cut = bisect.bisect_left(self._open, horizon, key=_arrival)
        records, self._open = self._open[:cut], self._open[cut:]
        pos, i = self._open_from_us, 0
        tail = self._sealed[-1] if self._sealed else None
        segment = (
            tail
            if tail is not None
            and tail.to_us == pos
            and tail.to_us - tail.from_us < self.max_span_us
            and len(tail.records) < self.max_batch_records
            else None
        )
        while pos < horizon:
            if segment is None:
                segment = Segment(from_us=pos, to_us=pos)
                self._sealed.append(segment)
            limit = min(horizon, segment.from_us + self.max_span_us)
            while (
                i < len(records)
                and records[i].arrived_at_us < limit
                and len(segment.records) < self.max_batch_records
            ):
                segment.records.append(records[i])
                i += 1
            # A full segment ends where the next record arrived: that record opens the next one.
            end = records[i].arrived_at_us if i < len(records) and records[i].arrived_at_us < limit else limit
            segment.to_us = pos = end
            segment = None
        self._open_from_us = horizon
        while len(self._sealed) > self.max_segments:
            oldest = self._sealed.popleft()
            self._dropped += len(oldest.records)

    # -- sending -----------------------------------------------------------------------------------

    def next_batch(self) -> Segment | None:
        """The oldest sealed segment, to send now. Until `delivered`, `rejected` or `failed` it
        is out being sent, and a drop never takes its records (they may already be stored)."""
        if self._sending is None and self._sealed:
            self._sending = self._sealed.popleft()
        return self._sending

    def failed(self, segment: Segment) -> None:
        """The attempt failed: the segment goes back first in line, as any other record's, so
        a full buffer may drop from it while the portal stays unreachable."""
        if segment is self._sending:
            self._sending = None
            self._sealed.appendleft(segment)
            self._enforce_bound()

    def delivered(self, segment: Segment) -> None:
        if segment is self._sending:
            self._delivered += len(segment.records)
            self._sending = None

    def rejected(self, segment: Segment) -> None:
        """The portal refused the batch for good: its records are lost and its span is a gap."""
        if segment is self._sending:
            self._rejected += len(segment.records)
            self._sending = None

    def pending(self) -> bool:
        """Whether anything sealed still waits for the portal."""
        return self._sending is not None or bool(self._sealed)

    # -- the bound ---------------------------------------------------------------------------------

    def _held(self) -> int:
        sending = len(self._sending.records) if self._sending is not None else 0
        return sending + sum(len(s.records) for s in self._sealed) + len(self._open)

    def _enforce_bound(self) -> None:
        # Only ever one record over (one is added at a time), so this drops one.
        while self._held() > self.max_records:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        for segment in self._sealed:
            if segment.records:
                dropped = segment.records.pop(0)
                # The segment's coverage now starts just after the dropped request: a gap.
                segment.from_us = dropped.arrived_at_us + 1
                if segment.from_us >= segment.to_us:
                    self._sealed.remove(segment)
                self._dropped += 1
                return
        dropped = self._open.pop(0)
        self._open_from_us = dropped.arrived_at_us + 1
        self._dropped += 1

    def stats(self) -> BufferStats:
        return BufferStats(
            in_flight=len(self._in_flight),
            buffered=self._held(),
            segments=len(self._sealed) + (self._sending is not None),
            delivered=self._delivered,
            dropped=self._dropped,
            rejected=self._rejected,
        )
