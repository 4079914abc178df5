"""The endpoint's tokenizer, loaded from local files only (never downloaded).

Prompts are synthesised to exact token counts, so the load generator needs the tokenizer the
endpoint uses. transformers' `AutoTokenizer` is used when importable (it handles every format
and chat templates); otherwise a bare `tokenizer.json` is read with the `tokenizers` library.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TokenizerUnavailable(RuntimeError):
    """No local tokenizer could be loaded for the endpoint's model."""


class PromptTokenizer:
    """Encode/decode and chat-template overhead of one model's tokenizer."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self._hf: Any = None
        self._raw: Any = None
        if not source.exists():
            raise TokenizerUnavailable(f"tokenizer path {source} does not exist")
        auto: Any = None
        try:
            from transformers import AutoTokenizer

            auto = AutoTokenizer
        except ImportError:
            pass
        if auto is not None:
            try:
                self._hf = auto.from_pretrained(str(source), local_files_only=True)
            except (OSError, ValueError) as exc:
                raise TokenizerUnavailable(f"cannot load a tokenizer from {source}: {exc}") from exc
        else:
            from tokenizers import Tokenizer

            path = source / "tokenizer.json" if source.is_dir() else source
            if not path.exists():
                raise TokenizerUnavailable(f"{path} not found (install transformers for other formats)")
            self._raw = Tokenizer.from_file(str(path))
            config_path = path.with_name("tokenizer_config.json")
            self._config = json.loads(config_path.read_text()) if config_path.exists() else {}

    def __repr__(self) -> str:
        return f"PromptTokenizer(source={str(self.source)!r}, vocab_size={self.vocab_size})"

    @property
    def vocab_size(self) -> int:
        if self._hf is not None:
            return len(self._hf)
        size: int = self._raw.get_vocab_size()
        return size

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        if self._hf is not None:
            ids: list[int] = self._hf.encode(text, add_special_tokens=add_special_tokens)
            return ids
        encoded: list[int] = self._raw.encode(text, add_special_tokens=add_special_tokens).ids
        return encoded

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        if self._hf is not None:
            batch: list[list[int]] = self._hf(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
            return batch
        return [e.ids for e in self._raw.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int]) -> str:
        if self._hf is not None:
            text: str = self._hf.decode(list(ids))
            return text
        decoded: str = self._raw.decode(list(ids))
        return decoded

    def special_tokens_added(self) -> int:
        """Tokens the tokenizer adds around a completion prompt (e.g. 1 for a BOS token)."""
        return len(self.encode("", add_special_tokens=True))

    def chat_overhead_tokens(self, sample: str) -> int:
        """Tokens a one-message chat adds around `sample` (template, role markers, BOS)."""
        if self._hf is None or not getattr(self._hf, "chat_template", None):
            raise TokenizerUnavailable(f"{self.source}: no chat template (or transformers missing)")
        messages = [{"role": "user", "content": sample}]
        rendered = self._hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with_template = len(self._hf.encode(rendered, add_special_tokens=False))
        return with_template - len(self.encode(sample))
