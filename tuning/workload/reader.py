"""Bounded, streaming line reading of an uploaded file.

Everything above this module sees physical lines as bytes, each at most `max_line_bytes` long,
and the whole (decompressed) file at most `max_bytes`: a 10 GB upload, a line without a newline
or a gzip bomb stop at the limit with an error instead of filling memory. Gzip is decompressed
on the fly; other archives are refused (a zip can hold many members and bombs nest).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from tuning.workload.errors import TraceError

_GZIP_MAGIC = b"\x1f\x8b"
_REFUSED_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"7z\xbc\xaf\x27\x1c", "7-zip"),
)
UTF8_BOM = b"\xef\xbb\xbf"
_BLOCK_BYTES = 1 << 20


def _mib(n: int) -> str:
    return f"{n:,} bytes" if n < 1 << 20 else f"{n / (1 << 20):,.0f} MiB"


class _PrefixedRaw(io.RawIOBase):
    """A raw stream that replays bytes already read (for sniffing) before the rest of `inner`."""

    def __init__(self, prefix: bytes, inner: BinaryIO) -> None:
        self._prefix = prefix
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._inner.read(len(view))
        n = len(data)
        view[:n] = data
        return n


class LineReader:
    """Physical lines of a (possibly gzip-compressed) binary stream, with limits.

    Lines come in batches (`batches()`), without their newline: reading a megabyte at a time and
    splitting it is several times faster than a call per line. The UTF-8 byte-order mark, if the
    file starts with one, is removed. `line_no` is the number of the last line handed out.
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        max_bytes: int,
        max_line_bytes: int,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_line_bytes = max_line_bytes
        self.line_no = 0
        self.bytes_read = 0
        self._progress = progress
        self._pending = b""
        self._eof = False
        self._held: tuple[int, list[bytes]] | None = None
        head = stream.read(8)
        if not isinstance(head, bytes | bytearray):
            raise TypeError("ingest needs a binary stream (open the file with 'rb')")
        head = bytes(head)
        for magic, name in _REFUSED_MAGIC:
            if head.startswith(magic):
                raise TraceError(
                    None, f"{name} archives are not accepted: upload the trace file itself, or gzip it"
                )
        buffered = io.BufferedReader(_PrefixedRaw(head, stream), buffer_size=1 << 16)
        self._stream: io.BufferedIOBase
        if head.startswith(_GZIP_MAGIC):
            self._stream = gzip.GzipFile(fileobj=buffered, mode="rb")
            self.compressed = True
        else:
            self._stream = buffered
            self.compressed = False

    def _read_block(self) -> bytes:
        problem = None
        try:
            block = self._stream.read(_BLOCK_BYTES)
        except (OSError, EOFError, zlib.error):  # BadGzipFile is an OSError; a bad deflate block is not
            block = b""
            problem = "the gzip stream is corrupt or truncated"
        if problem is not None:
            raise TraceError(None, problem)
        self.bytes_read += len(block)
        if self.bytes_read > self.max_bytes:
            what = "decompressed file" if self.compressed else "file"
            raise TraceError(None, f"the {what} is larger than the {_mib(self.max_bytes)} limit")
        return block

    def _next_batch(self) -> tuple[int, list[bytes]] | None:
        while not self._eof:
            block = self._read_block()
            if not block:
                self._eof = True
                if not self._pending:
                    return None
                lines = [self._pending]
                self._pending = b""
            else:
                lines = (self._pending + block).split(b"\n")
                self._pending = lines.pop()
                if len(self._pending) > self.max_line_bytes:
                    raise TraceError(
                        self.line_no + len(lines) + 1,
                        f"line is longer than the {_mib(self.max_line_bytes)} limit",
                    )
                if not lines:
                    continue
            if max(map(len, lines)) > self.max_line_bytes:
                longest = next(i for i, line in enumerate(lines) if len(line) > self.max_line_bytes)
                raise TraceError(
                    self.line_no + longest + 1, f"line is longer than the {_mib(self.max_line_bytes)} limit"
                )
            first = self.line_no + 1
            if first == 1 and lines[0].startswith(UTF8_BOM):
                lines[0] = lines[0][len(UTF8_BOM) :]
            self.line_no += len(lines)
            if self._progress is not None:
                self._progress(self.bytes_read)
            return first, lines
        return None

    def first_nonblank(self) -> tuple[int, bytes] | None:
        """The first line with content and its number, without consuming anything."""
        if self._held is None:
            self._held = self._next_batch()
        while self._held is not None:
            first, lines = self._held
            for offset, line in enumerate(lines):
                if line.strip():
                    return first + offset, line
            more = self._next_batch()
            if more is None:
                return None
            self._held = (first, lines + more[1])
        return None

    def batches(self) -> Iterator[tuple[int, list[bytes]]]:
        """(number of the first line, lines) until the end of the file."""
        if self._held is not None:
            held, self._held = self._held, None
            yield held
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            yield batch

    def text_lines(self) -> Iterator[str]:
        """Every line decoded as UTF-8 (strict), in order, for the CSV reader (one str a line)."""
        for first, lines in self.batches():
            joined = b"\n".join(lines)
            problem = None
            try:
                text = joined.decode("utf-8")
            except UnicodeDecodeError:
                text = ""
                problem = _utf8_problem(first, lines)
            if problem is not None:
                raise TraceError(*problem)
            yield from text.split("\n")

    def finish(self) -> None:
        if self._progress is not None:
            self._progress(self.bytes_read)


def _utf8_problem(first: int, lines: list[bytes]) -> tuple[int, str]:
    for offset, line in enumerate(lines):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return first + offset, f"not valid UTF-8 (byte {exc.start + 1} of the line)"
    return first, "not valid UTF-8"
