"""Token counting for logs that carry prompt text.

No tokenizer is downloaded. The default, `ApproxTokenizer` ("tailguard-approx-v1"), is a
deterministic regex approximation of a GPT-style byte-pair tokenizer:

- the text is split GPT-style into pieces: a run of letters (with one optional leading space),
  a run of digits, a run of other symbols, or a run of whitespace;
- ASCII letter runs count one token per started 6 letters ("tokenization" -> 2), digit runs one
  per started 3 digits (as cl100k does), symbol runs one per character, any other letter
  (CJK, Cyrillic, ...) one per character, a whitespace run one token.

It is a rough approximation (common English words are one BPE token; long and rare words are
more), not a real vocabulary, and the profile names it whenever it was used. Token ids (needed
only to hash prompt blocks) are CRC-32s of the pieces. A real tokenizer built locally can be
passed instead through `HuggingFaceTokenizer` or anything with the `Tokenizer` shape.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

_PIECE = re.compile(r" ?[A-Za-z]+| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+|_+")
_ASCII_LETTERS = 6
_DIGITS = 3


@runtime_checkable
class Tokenizer(Protocol):
    """What ingest needs from a tokenizer: a stable name and token ids for a text."""

    @property
    def name(self) -> str: ...

    def encode(self, text: str) -> Sequence[int]: ...


class ApproxTokenizer:
    """The default local tokenizer (see the module docstring); pure Python, no data files."""

    @property
    def name(self) -> str:
        return "tailguard-approx-v1"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        crc = zlib.crc32
        for piece in _PIECE.findall(text):
            body = piece.lstrip(" ") or piece
            first = body[0]
            if first.isascii() and first.isalpha():
                step = _ASCII_LETTERS
            elif first.isdigit():
                step = _DIGITS
            elif first.isspace():
                ids.append(crc(piece.encode("utf-8", "surrogatepass")))
                continue
            else:
                step = 1
            lead = piece[: len(piece) - len(body)]
            for start in range(0, len(body), step):
                chunk = body[start : start + step]
                ids.append(crc((lead + chunk if start == 0 else chunk).encode("utf-8", "surrogatepass")))
        return ids

    def __repr__(self) -> str:
        return "ApproxTokenizer()"


class HuggingFaceTokenizer:
    """Adapter for a `transformers` tokenizer loaded from a local directory.

    Example: `HuggingFaceTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))`.
    Special tokens are not added: the count is of the prompt as sent.
    """

    def __init__(self, tokenizer: Any, name: str | None = None) -> None:
        self._tokenizer = tokenizer
        self._name = name or f"hf:{getattr(tokenizer, 'name_or_path', 'unknown')}"

    @property
    def name(self) -> str:
        return self._name

    def encode(self, text: str) -> Sequence[int]:
        ids: Sequence[int] = self._tokenizer.encode(text, add_special_tokens=False)
        return ids

    def __repr__(self) -> str:
        return f"HuggingFaceTokenizer(name={self._name!r})"
