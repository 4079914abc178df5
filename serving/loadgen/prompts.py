"""Prompt text synthesised to exact token counts, with real prefix sharing.

A trace gives token counts, not text. For every request we build text that the endpoint's
tokenizer turns into exactly the trace's number of prompt tokens. Text is assembled from
"words": vocabulary entries that are a space followed by letters and that encode to exactly
one token, alone and next to each other, so a string of k words is k tokens and blocks can be
concatenated without tokens merging across their borders.

For traces with prefix structure (Mooncake `hash_ids`), each block id maps to one fixed block of
words (drawn from a generator seeded by the run seed and the id), so requests that share
leading block ids send byte-identical leading text and the engine's prefix cache sees the
trace's real sharing. A request's partial last block is the beginning of its block's words.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import numpy as np

from serving.loadgen.tokenizer import PromptTokenizer
from serving.loadgen.traces import TraceRequest

_WORD = re.compile(r" [A-Za-z]{2,10}")
_MIN_POOL = 64


class PromptSynthesisError(RuntimeError):
    """The tokenizer offers no usable word pool or a prompt could not hit its token count."""


@dataclass(frozen=True)
class SynthesizedPrompt:
    """A prompt ready to send; the text itself is kept out of the repr."""

    text: str = field(repr=False)
    num_prompt_tokens: int  # what the endpoint will count (special tokens / chat template included)
    num_content_tokens: int  # tokens of `text` alone
    num_shared_blocks: int  # leading blocks that came from trace block ids


@functools.lru_cache(maxsize=8)
def word_pool(tokenizer: PromptTokenizer, seed: int) -> tuple[str, ...]:
    """The tokenizer's words that stay one token each, alone and next to each other, in a stable
    order. Kept for the last few (tokenizer, seed) pairs: building it decodes and encodes the
    whole vocabulary, and a run that sends its requests in many small replays (single requests
    of several lengths, one at a time) would pay that on every one. `load_tokenizer` keeps one
    tokenizer object per folder, so the key is stable."""
    tok = tokenizer
    pieces: list[tuple[int, str]] = []
    for token_id in range(tok.vocab_size):
        piece = tok.decode([token_id])
        if _WORD.fullmatch(piece):
            pieces.append((token_id, piece))
    if not pieces:
        raise PromptSynthesisError(f"{tok.source}: no single-token ' word' entries in the vocabulary")
    encoded = tok.encode_batch([p for _, p in pieces])
    pool = sorted({p for (tid, p), ids in zip(pieces, encoded, strict=True) if ids == [tid]})
    # Words must stay one token each next to their neighbours: test every word after a few
    # others and drop the ones that merge.
    rng = np.random.default_rng([seed, 7])
    for _ in range(3):
        order = rng.permutation(len(pool))
        pairs = [pool[int(a)] + pool[int(b)] for a, b in zip(order, np.roll(order, 1), strict=True)]
        counts = [len(ids) for ids in tok.encode_batch(pairs)]
        bad = {pool[int(a)] for a, c in zip(order, counts, strict=True) if c != 2}
        bad |= {pool[int(b)] for b, c in zip(np.roll(order, 1), counts, strict=True) if c != 2}
        pool = [p for p in pool if p not in bad]
    if len(pool) < _MIN_POOL:
        raise PromptSynthesisError(
            f"{tok.source}: only {len(pool)} usable single-token words (need {_MIN_POOL})"
        )
    return tuple(pool)


class PromptSynthesizer:
    """Builds prompt text of exact token counts from a tokenizer's single-token words."""

    def __init__(self, tokenizer: PromptTokenizer, *, seed: int = 0, chat: bool = False) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.chat = chat
        self._pool = word_pool(tokenizer, seed)
        sample = "".join(self._pool[:16])
        self.overhead_tokens = (
            tokenizer.chat_overhead_tokens(sample) if chat else tokenizer.special_tokens_added()
        )

    def __repr__(self) -> str:
        return f"PromptSynthesizer(pool={len(self._pool)} words, seed={self.seed}, chat={self.chat})"

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    def _block_words(self, key: tuple[int, int], num_words: int) -> list[int]:
        # Regenerated on every use rather than cached: a generator seeded by (seed, key) is cheap,
        # and a cache of every block of a long trace would hold gigabytes.
        rng = np.random.default_rng([self.seed, *key])
        return [int(i) for i in rng.integers(0, len(self._pool), size=num_words)]

    def synthesize(
        self, request: TraceRequest, *, request_index: int, max_prompt_tokens: int | None = None
    ) -> SynthesizedPrompt:
        """Text for `request` with exactly its prompt tokens (capped at `max_prompt_tokens`)."""
        target = request.num_prompt_tokens
        if max_prompt_tokens is not None:
            target = min(target, max_prompt_tokens)
        content = max(1, target - self.overhead_tokens)
        block = request.block_tokens
        words: list[int] = []
        shared = 0
        num_blocks = -(-content // block)
        for j in range(num_blocks):
            size = min(block, content - j * block)
            if j < len(request.hash_ids):
                # Key 0: trace block ids, shared across requests.
                words += self._block_words((0, request.hash_ids[j]), block)[:size]
                shared += 1
            else:
                # Key 1: blocks private to this request.
                words += self._block_words((1, request_index * 1_000_003 + j), block)[:size]
        text = "".join(self._pool[i] for i in words)
        return SynthesizedPrompt(
            text=text,
            num_prompt_tokens=content + self.overhead_tokens,
            num_content_tokens=content,
            num_shared_blocks=shared,
        )

    def count_tokens(self, text: str) -> int:
        """What the endpoint will count for `text` sent as a prompt (for verification)."""
        return len(self.tokenizer.encode(text)) + self.overhead_tokens
