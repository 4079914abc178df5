"""The customer's own prompts, for the correctness gate's golden set and nothing else.

Ingest keeps numbers only (ingest.py). The gate is the one consumer that is better for the
customer's text: a precision change that is harmless on random token ids may not be harmless on
the customer's language, code or numbers. `draw_prompts` reads an OpenAI-style log once more and
returns **token ids**, never text:

- a uniform random sample of the successful requests' prompts (Algorithm R, a reservoir of at
  most `reservoir` prompts, seeded: the same file and seed give the same draw), each tokenised
  with the model's own tokenizer as it enters the reservoir and reduced to its last `max_tokens`
  ids (the end of a prompt is the part that differs between requests: a shared system prompt
  sits at the start) and its full length;
- then one prompt per stratum of that sample's prompt-length distribution (equal-count strata,
  shortest to longest, a random member of each), so the gate sees short and long prompts in the
  proportions the customer sends them.

Chat requests are rendered in the same fixed form ingest hashes (`<|role|>` markers), not the
model's chat template. Nothing here logs, prints or raises with text: errors are `TraceError`s
naming a line and a field. The caller keeps the ids in the job's work dir only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuning.workload.errors import TraceError
from tuning.workload.formats import (
    BLANK,
    decode_json_line_strictly,
    detect_format,
    request_failed,
    request_prompt_text,
)
from tuning.workload.ingest import IngestLimits, _LimitedLineReader

MAX_RESERVOIR = 4096  # prompts tokenised and held (as bounded id lists) at once, whatever the caller
MAX_PROMPTS = 64
MAX_PROMPT_TOKENS = 4096


@dataclass(frozen=True)
class DrawnPrompts:
    """Token ids of the prompts drawn (bounded to `max_tokens` each) and counts about the draw."""

    prompts: tuple[tuple[int, ...], ...] = field(repr=False)
    full_lengths: tuple[int, ...]  # each drawn prompt's tokens before bounding
    prompts_with_text: int  # successful requests in the file that carry prompt text
    tokenizer: str

    @property
    def num_bounded(self) -> int:
        return sum(1 for p, n in zip(self.prompts, self.full_lengths, strict=True) if n > len(p))


class _ModelTokenizer:
    """The model directory's `tokenizer.json` (Hugging Face `tokenizers`), ids without special tokens."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.name = f"{path.parent.name}/{path.name}"
        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def model_tokenizer(model_path: str | os.PathLike[str]) -> _ModelTokenizer | None:
    """The model's tokenizer, or None when its directory has no loadable `tokenizer.json`."""
    path = Path(model_path) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        return _ModelTokenizer(path)
    except Exception:  # a malformed file: the caller falls back to synthesised prompts
        return None


def draw_prompts(
    trace_path: str | os.PathLike[str],
    *,
    tokenizer: Any,
    rng: np.random.Generator,
    num_prompts: int = 8,
    max_tokens: int = 128,
    min_tokens: int = 2,
    reservoir: int = 512,
    limits: IngestLimits | None = None,
) -> DrawnPrompts | None:
    """A stratified draw of `num_prompts` of the file's prompts as token ids (see the module
    docstring); None when the file is not an OpenAI-style log or none of its successful
    requests carries prompt text of at least `min_tokens` tokens.

    `tokenizer` has `encode(text) -> list[int]` and `name`. Raises `TraceError` on an invalid file.
    """
    if not 1 <= num_prompts <= MAX_PROMPTS:
        raise ValueError(f"num_prompts must be 1 to {MAX_PROMPTS}")
    if not 1 <= min_tokens <= max_tokens <= MAX_PROMPT_TOKENS:
        raise ValueError(f"need 1 <= min_tokens <= max_tokens <= {MAX_PROMPT_TOKENS}")
    if not num_prompts <= reservoir <= MAX_RESERVOIR:
        raise ValueError(f"reservoir must be num_prompts to {MAX_RESERVOIR}")
    failure: tuple[int | None, str] | None = None
    try:
        with Path(trace_path).open("rb") as stream:
            return _draw(
                stream,
                tokenizer=tokenizer,
                rng=rng,
                num_prompts=num_prompts,
                max_tokens=max_tokens,
                min_tokens=min_tokens,
                reservoir=reservoir,
                limits=limits or IngestLimits(),
            )
    except TraceError as exc:
        failure = (exc.line, exc.problem)
    # Raised afresh outside the handler, as ingest does: no frame that saw text is kept.
    raise TraceError(*failure)


def _draw(
    stream: Any,
    *,
    tokenizer: Any,
    rng: np.random.Generator,
    num_prompts: int,
    max_tokens: int,
    min_tokens: int,
    reservoir: int,
    limits: IngestLimits,
) -> DrawnPrompts | None:
    reader = _LimitedLineReader(stream, limits=limits, progress=None)
    if detect_format(reader) != "openai":
        return None
    kept: list[tuple[int, tuple[int, ...]]] = []  # (full length, last max_tokens ids)
    seen = 0
    for first, lines in reader.batches():
        for n, raw in enumerate(lines, first):
            obj = decode_json_line_strictly(raw, n)
            if obj is BLANK:
                continue
            if type(obj) is not dict:
                raise TraceError(n, "expected a JSON object")
            if request_failed(obj):
                continue
            text = request_prompt_text(obj, n)
            if not text:
                continue
            seen += 1
            # Algorithm R: prompt number `seen` replaces a random member with probability
            # reservoir/seen, so every prompt is equally likely to end up kept.
            slot = len(kept) if len(kept) < reservoir else int(rng.integers(0, seen))
            if slot >= reservoir:
                continue
            ids = _encode(tokenizer, text, n)
            text = ""
            entry = (len(ids), tuple(ids[-max_tokens:]))
            if slot == len(kept):
                kept.append(entry)
            else:
                kept[slot] = entry
    reader.check_deadline()
    usable = sorted({e for e in kept if e[0] >= min_tokens})
    if not usable:
        return None
    strata = np.array_split(np.arange(len(usable)), min(num_prompts, len(usable)))
    picked = [usable[int(rng.choice(s))] for s in strata if s.size]
    return DrawnPrompts(
        prompts=tuple(ids for _, ids in picked),
        full_lengths=tuple(n for n, _ in picked),
        prompts_with_text=seen,
        tokenizer=str(getattr(tokenizer, "name", "tokenizer")),
    )


def _encode(tokenizer: Any, text: str, n: int) -> list[int]:
    ids: list[int] | None
    try:
        ids = [int(t) for t in tokenizer.encode(text)]
    except Exception:
        ids = None
    if ids is None:
        raise TraceError(n, "the model's tokenizer failed on this line's prompt")
    return ids
