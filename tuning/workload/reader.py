"""Bounded, streaming line reading of an uploaded file.

Everything above this module sees physical lines as bytes, each at most `max_line_bytes` long,
and the whole (decompressed) file at most `max_bytes`: a 10 GB upload, a line without a newline
or a gzip bomb stop at the limit with an error instead of filling memory. Gzip is decompressed
on the fly; other archives are refused (a zip can hold many members and bombs nest).
"""

from __future__ import annotations

import gzip
import io
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
# How often (in lines) the progress callback hears how many bytes have been read.
_PROGRESS_EVERY_LINES = 65_536


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

    `line_no` is the number of the line most recently returned (1-based). The UTF-8 byte-order
    mark, if the first line starts with one, is removed.
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
        self._pushed_back: list[bytes] = []
        head = stream.read(8)
        for magic, name in _REFUSED_MAGIC:
            if head.startswith(magic):
                raise TraceError(
                    None, f"{name} archives are not accepted: upload the trace file itself, or gzip it"
                )
        buffered = io.BufferedReader(_PrefixedRaw(head, stream), buffer_size=1 << 20)
        self._stream: io.BufferedIOBase
        if head.startswith(_GZIP_MAGIC):
            self._stream = gzip.GzipFile(fileobj=buffered, mode="rb")
            self.compressed = True
        else:
            self._stream = buffered
            self.compressed = False

    def readline(self) -> bytes:
        """The next line (with its newline), or b"" at the end of the file."""
        if self._pushed_back:
            self.line_no += 1
            return self._pushed_back.pop()
        problem = None
        try:
            line = self._stream.readline(self.max_line_bytes + 1)
        except (OSError, EOFError, gzip.BadGzipFile):
            line = b""
            problem = "the gzip stream is corrupt or truncated"
        if problem is not None:
            raise TraceError(self.line_no + 1, problem)
        if not line:
            return line
        self.line_no += 1
        if len(line) > self.max_line_bytes:
            raise TraceError(self.line_no, f"line is longer than the {_mib(self.max_line_bytes)} limit")
        self.bytes_read += len(line)
        if self.bytes_read > self.max_bytes:
            what = "decompressed file" if self.compressed else "file"
            raise TraceError(self.line_no, f"the {what} is larger than the {_mib(self.max_bytes)} limit")
        if self.line_no == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]
        if self._progress is not None and self.line_no % _PROGRESS_EVERY_LINES == 0:
            self._progress(self.bytes_read)
        return line

    def push_back(self, line: bytes) -> None:
        """Return `line` (the one just read) so that the next `readline` gives it again."""
        self._pushed_back.append(line)
        self.line_no -= 1

    def __iter__(self) -> Iterator[bytes]:
        readline = self.readline
        while True:
            line = readline()
            if not line:
                return
            yield line

    def text_lines(self) -> Iterator[str]:
        """Lines decoded as UTF-8 (strict), for the CSV reader."""
        for line in self:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                problem = f"not valid UTF-8 (byte {exc.start + 1} of the line)"
            else:
                yield text
                continue
            raise TraceError(self.line_no, problem)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress(self.bytes_read)
