"""What one fuzz input must satisfy, independent of the fuzzing engine.

Every input is fed through `tuning.workload.ingest` exactly as the portal's ingest task calls it
(binary stream, an organization salt, upload limits, `keep_blocks=True`, a progress callback),
with small limits so that the size and line-length checks are reachable by a fuzzer. An input
passes when it either ingests into a profile the portal can store, or raises `TraceError` whose
line is a real line of the file. Any other exception, or a broken promise, is a crash.

Nothing here imports atheris: pytest replays the saved crash inputs through `check` without it.
"""

from __future__ import annotations

import io
import json
from typing import Final, Literal

from tuning.workload import IngestLimits, TraceError, ingest

Target = Literal["openai", "mooncake", "azure", "burstgpt", "auto"]
# One target per parser, plus "auto": format detection in front of all four.
TARGETS: Final[tuple[Target, ...]] = ("openai", "mooncake", "azure", "burstgpt", "auto")
# Small, so that a fuzzer's inputs (a few KiB) reach the limits: a long line, a gzip bomb.
LIMITS: Final = IngestLimits(max_bytes=64 << 10, max_line_bytes=4 << 10, max_tokens_per_request=10_000_000)
SALT: Final = bytes(range(32))
_GZIP_MAGIC: Final = b"\x1f\x8b"
_MAX_ABS_NS: Final = 1 << 62


class BrokenPromise(AssertionError):
    """Ingest returned or raised, but not what it promises (a crash for the fuzzer)."""


def _ignore_progress(read_bytes: int) -> None:
    del read_bytes


def _check_error(error: TraceError, data: bytes) -> None:
    if error.__cause__ is not None or error.__context__ is not None:
        raise BrokenPromise("TraceError carries a chained exception (it could hold file content)")
    if not isinstance(error.problem, str) or not error.problem.strip():
        raise BrokenPromise("TraceError without a problem")
    if error.line is None:
        return
    if type(error.line) is not int or error.line < 1:
        raise BrokenPromise(f"TraceError names line {error.line!r}")
    if not str(error).startswith(f"line {error.line}: "):
        raise BrokenPromise("TraceError message does not start with its line")
    # Line numbers are physical lines of the file as uploaded (after decompression, which only
    # the gzip case has: there the count is not known from the raw bytes).
    num_lines = data.count(b"\n") + 1
    if not data.startswith(_GZIP_MAGIC) and error.line > num_lines:
        raise BrokenPromise(f"TraceError names line {error.line} of a {num_lines}-line file")


def check(target: Target, data: bytes) -> None:
    """Ingest `data` as the portal would with format `target`; raise if a promise is broken."""
    try:
        result = ingest(
            io.BytesIO(data),
            trace_format=target,
            salt=SALT,
            limits=LIMITS,
            keep_blocks=True,
            progress=_ignore_progress,
        )
    except TraceError as error:
        _check_error(error, data)
        return
    profile = result.profile
    if profile.num_requests < 2 or profile.num_requests != result.columns.num_requests:
        raise BrokenPromise("a profile of fewer than two requests, or of other requests than the columns")
    if target != "auto" and profile.trace_format != target:
        raise BrokenPromise(f"asked for {target}, profiled as {profile.trace_format}")
    # Times within 2**62 ns of the epoch, in order, and a duration that is their real span (an
    # int64 overflow anywhere would show here).
    arrival = result.columns.arrival_ns
    span_ns = int(arrival[-1]) - int(arrival[0])
    if not -_MAX_ABS_NS < int(arrival.min()) <= int(arrival.max()) < _MAX_ABS_NS:
        raise BrokenPromise("an arrival time beyond 2**62 ns of the epoch")
    if not (arrival[1:] >= arrival[:-1]).all() or span_ns <= 0:
        raise BrokenPromise("arrivals out of order")
    if abs(profile.duration_s - span_ns / 1e9) > 1e-9 * span_ns / 1e9 + 1e-9:
        raise BrokenPromise(f"duration {profile.duration_s} s for a span of {span_ns} ns")
    # The portal stores both in PostgreSQL JSON columns, which refuse NaN and Infinity.
    json.dumps(profile.to_json_dict(), allow_nan=False)
    json.dumps(result.charts.to_json_dict(), allow_nan=False)
    if result.blocks is not None and result.blocks.offsets.shape[0] != profile.num_requests + 1:
        raise BrokenPromise("block offsets do not match the requests")
