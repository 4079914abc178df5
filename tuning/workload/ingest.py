"""Streaming ingest: one pass over an uploaded file gives the profile and the chart data.

The portal calls `ingest(stream, ...)` with the upload's binary file object; the CLI calls
`ingest_path`. Either the whole file is valid and a result comes back, or a `TraceError` naming
the line and the problem is raised and nothing is returned (no half profile).

Privacy: where a log carries prompt text (OpenAI-style), the text is tokenized and its blocks
hashed with the organization's salt as each line streams past, then dropped. The result holds
numbers only; no text is written anywhere.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tuning.workload.charts import ChartData, compute_charts
from tuning.workload.columns import BlockStructure, ColumnBuilder, RequestColumns
from tuning.workload.errors import TraceError
from tuning.workload.formats import (
    FORMATS,
    PromptBlockHasher,
    TraceFormat,
    detect_format,
    mooncake_has_prefix,
    parse_azure,
    parse_burstgpt,
    parse_mooncake,
    parse_openai,
)
from tuning.workload.profile import WorkloadProfile, compute_profile
from tuning.workload.reader import LineReader
from tuning.workload.tokenizer import ApproxTokenizer, Tokenizer

MOONCAKE_BLOCK_SIZE_TOKENS = 512


@dataclass(frozen=True)
class IngestLimits:
    """Limits on what an upload may be; the portal takes them from its settings."""

    max_bytes: int = 2 << 30  # whole file after decompression (a gzip bomb stops here)
    max_line_bytes: int = 16 << 20  # one line (a long chat with its history fits)
    max_tokens_per_request: int = 10_000_000  # larger counts are taken as corrupt
    max_lines: int | None = None  # physical lines, blank ones included (None: no cap)
    # Lines with nothing but whitespace: a few are harmless, millions are a "newline bomb" (a
    # small gzip that expands to gigabytes of line breaks); None: no cap.
    max_blank_lines: int | None = None
    max_seconds: float | None = None  # wall-clock time for reading and profiling (None: no cap)


# The clock the time limit is measured on (tests replace it).
_clock: Callable[[], float] = time.monotonic


class _LimitedLineReader(LineReader):
    """A `LineReader` that also stops at a number of lines, of blank lines and at a deadline,
    checked once per batch (a megabyte of input), before any parser sees the batch."""

    def __init__(
        self, stream: BinaryIO, *, limits: IngestLimits, progress: Callable[[int], None] | None
    ) -> None:
        super().__init__(
            stream, max_bytes=limits.max_bytes, max_line_bytes=limits.max_line_bytes, progress=progress
        )
        self._limits = limits
        self._blank_lines = 0
        self._deadline = None if limits.max_seconds is None else _clock() + limits.max_seconds

    def check_deadline(self) -> None:
        if self._deadline is not None and _clock() > self._deadline:
            raise TraceError(
                None,
                f"reading the file took longer than the {self._limits.max_seconds:,.0f} s limit; "
                "upload a shorter sample",
            )

    def _next_batch(self) -> tuple[int, list[bytes]] | None:
        batch = super()._next_batch()
        self.check_deadline()
        if batch is None:
            return None
        first, lines = batch
        limits = self._limits
        if limits.max_lines is not None and self.line_no > limits.max_lines:
            raise TraceError(
                limits.max_lines + 1, f"the file has more than the {limits.max_lines:,} lines allowed"
            )
        if limits.max_blank_lines is not None:
            blank = sum(1 for line in lines if not line.strip())
            self._blank_lines += blank
            if self._blank_lines > limits.max_blank_lines:
                raise TraceError(
                    None,
                    f"the file has more than the {limits.max_blank_lines:,} blank lines allowed "
                    "(is it padded with empty lines?)",
                )
        return first, lines


@dataclass(frozen=True, eq=False)
class IngestResult:
    profile: WorkloadProfile
    charts: ChartData = field(repr=False)
    columns: RequestColumns  # per-request numbers (arrival, lengths, prefix hits) for later steps
    blocks: BlockStructure | None  # prompt block ids, only when asked for (synthesis)


def ingest(
    stream: BinaryIO,
    *,
    trace_format: str = "auto",
    salt: bytes | None = None,
    tokenizer: Tokenizer | None = None,
    limits: IngestLimits | None = None,
    block_size_tokens: int = MOONCAKE_BLOCK_SIZE_TOKENS,
    keep_blocks: bool = False,
    curve_max_blocks: int = 150_000,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    """Read a traffic sample from a binary stream and profile it.

    `trace_format` is "auto" or one of `FORMATS`. `salt` keys the prompt-block hashes (pass the
    organization's; None draws a random one, so hashes are comparable only within this call).
    `tokenizer` counts tokens where the source has text but no counts (default:
    `ApproxTokenizer`). `block_size_tokens` is the prefix-block size for logs with text
    (Mooncake traces fix it at 512). `curve_max_blocks` bounds the work of the reuse-vs-cache
    -size curve (it covers the trace's first requests up to that many block accesses).
    `progress`, if given, is called now and then with the number of bytes read so far.

    Raises `TraceError` (line and problem, never file content) on any invalid input.
    """
    failure: tuple[int | None, str] | None = None
    try:
        return _ingest(
            stream,
            trace_format=trace_format,
            salt=salt,
            tokenizer=tokenizer or ApproxTokenizer(),
            limits=limits or IngestLimits(),
            block_size_tokens=block_size_tokens,
            keep_blocks=keep_blocks,
            curve_max_blocks=curve_max_blocks,
            progress=progress,
        )
    except TraceError as exc:
        failure = (exc.line, exc.problem)
    # Raised afresh, outside the handler: no chained context, and a traceback that holds only
    # this frame, none of the parser frames whose locals saw file content.
    raise TraceError(*failure)


def ingest_path(path: str | os.PathLike[str], **options: object) -> IngestResult:
    """`ingest` on a file by name (same keyword options)."""
    with Path(path).open("rb") as stream:
        return ingest(stream, **options)  # type: ignore[arg-type]


def _ingest(
    stream: BinaryIO,
    *,
    trace_format: str,
    salt: bytes | None,
    tokenizer: Tokenizer,
    limits: IngestLimits,
    block_size_tokens: int,
    keep_blocks: bool,
    curve_max_blocks: int,
    progress: Callable[[int], None] | None,
) -> IngestResult:
    if trace_format != "auto" and trace_format not in FORMATS:
        raise TraceError(None, f"unknown format {trace_format!r}: use auto, {', '.join(FORMATS)}")
    if block_size_tokens <= 0:
        raise TraceError(None, "block_size_tokens must be positive")
    reader = _LimitedLineReader(stream, limits=limits, progress=progress)
    chosen: TraceFormat
    if trace_format == "auto":
        chosen = detect_format(reader)
    else:
        if reader.first_nonblank() is None:
            raise TraceError(None, "the file is empty")
        chosen = trace_format  # type: ignore[assignment]
    max_tokens = limits.max_tokens_per_request
    tokenizer_name: str | None = None
    num_sessions: int | None = None

    def builder(with_prefix: bool, block: int) -> ColumnBuilder:
        return ColumnBuilder(
            with_prefix=with_prefix,
            block_size_tokens=block,
            curve_max_blocks=curve_max_blocks,
            keep_blocks=keep_blocks,
        )

    if chosen == "mooncake":
        columns_builder = builder(mooncake_has_prefix(reader), MOONCAKE_BLOCK_SIZE_TOKENS)
        parse_mooncake(reader, columns_builder, max_tokens=max_tokens)
    elif chosen == "openai":
        columns_builder = builder(True, block_size_tokens)
        key = salt if salt is not None else os.urandom(32)
        hasher = PromptBlockHasher(salt=key, block_size_tokens=block_size_tokens)
        # Session ids are counted as salted digests: the id itself (often a user or patient
        # reference) is never kept.
        session_salt = hashlib.blake2b(key, digest_size=32).digest()

        def session_key(session: str) -> bytes:
            # surrogatepass: JSON may escape a lone surrogate (a cut emoji), which strict UTF-8 refuses.
            raw = session.encode("utf-8", "surrogatepass")
            return hashlib.blake2b(raw, key=session_salt, digest_size=16).digest()

        used_tokenizer, num_sessions = parse_openai(
            reader,
            columns_builder,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            hasher=hasher,
            session_key=session_key,
        )
        tokenizer_name = tokenizer.name if used_tokenizer else None
    elif chosen == "azure":
        columns_builder = builder(False, block_size_tokens)
        parse_azure(reader, columns_builder, max_tokens=max_tokens)
    else:
        columns_builder = builder(False, block_size_tokens)
        parse_burstgpt(reader, columns_builder, max_tokens=max_tokens)
    reader.finish()
    reader.check_deadline()
    columns = columns_builder.finish()
    tracker = columns_builder.tracker
    reuse_ratio: float | None = None
    if tracker is not None and tracker.prompt_tokens_total > 0:
        reuse_ratio = tracker.hit_tokens_total / tracker.prompt_tokens_total
    else:
        tracker = None
        columns = RequestColumns(
            arrival_ns=columns.arrival_ns,
            input_tokens=columns.input_tokens,
            output_tokens=columns.output_tokens,
            prefix_hit_tokens=None,
            prefix_tokens=None,
        )
    profile = compute_profile(
        columns,
        trace_format=chosen,
        tokenizer=tokenizer_name,
        num_failed_requests=columns_builder.num_failed,
        num_sessions=num_sessions,
        reuse_ratio=reuse_ratio,
        block_size_tokens=tracker.block_size_tokens if tracker is not None else None,
        unique_blocks=tracker.unique_blocks() if tracker is not None else None,
    )
    reader.check_deadline()
    charts = compute_charts(columns, tracker.reuse_curve() if tracker is not None else None)
    blocks = tracker.kept_blocks() if tracker is not None and keep_blocks else None
    return IngestResult(profile=profile, charts=charts, columns=columns, blocks=blocks)
