"""A byte-level BPE tokenizer trained on the spot, so no tokenizer is ever downloaded.

The training text is made of pseudo-words drawn from a seeded generator with a Zipf-like
frequency, which gives the trainer enough repeated sub-words to fill a vocabulary of a few
thousand to a few tens of thousands of entries. The result is saved the way Hugging Face
checkpoints ship theirs (`tokenizer.json` + `tokenizer_config.json`), so vLLM and transformers
load it with `AutoTokenizer` like any real model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "x"]


@dataclass(frozen=True)
class TokenizerFamily:
    """Special tokens and chat template of one model family."""

    name: str
    bos_token: str | None  # prepended to every prompt when set (Llama); Qwen has none
    eos_token: str
    pad_token: str
    extra_special_tokens: tuple[str, ...]
    chat_template: str


_LLAMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_QWEN_CHAT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

FAMILIES: dict[str, TokenizerFamily] = {
    "llama": TokenizerFamily(
        name="llama",
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|finetune_right_pad_id|>",
        extra_special_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        chat_template=_LLAMA_CHAT,
    ),
    "qwen2": TokenizerFamily(
        name="qwen2",
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=("<|im_start|>", "<|im_end|>"),
        chat_template=_QWEN_CHAT,
    ),
}


def _pseudo_words(rng: np.random.Generator, num_words: int) -> list[str]:
    words: set[str] = set()
    while len(words) < num_words:
        syllables = int(rng.integers(1, 4))
        word = "".join(
            _ONSETS[int(rng.integers(len(_ONSETS)))]
            + _VOWELS[int(rng.integers(len(_VOWELS)))]
            + _CODAS[int(rng.integers(len(_CODAS)))]
            for _ in range(syllables)
        )
        words.add(word)
    return sorted(words)


def _training_text(rng: np.random.Generator, vocab_size: int) -> list[str]:
    lexicon = _pseudo_words(rng, max(2000, vocab_size * 2))
    # Zipf-like weights: a few very common words, a long tail, as in natural text.
    ranks = np.arange(1, len(lexicon) + 1, dtype=np.float64)
    weights = 1.0 / ranks
    weights /= weights.sum()
    num_lines = max(2000, vocab_size // 2)
    lines = []
    for _ in range(num_lines):
        picks = rng.choice(len(lexicon), size=int(rng.integers(8, 24)), p=weights)
        sentence = " ".join(lexicon[int(i)] for i in picks)
        lines.append(sentence.capitalize() + rng.choice([".", ",", "?", "!"]))
    # Digits and punctuation so numbers and symbols tokenize without falling back to bytes only.
    lines.extend(" ".join(str(int(n)) for n in rng.integers(0, 10_000, size=16)) for _ in range(50))
    return lines


def build_tokenizer(*, family: str, vocab_size: int, rng: np.random.Generator) -> Tokenizer:
    """Train a byte-level BPE tokenizer with `family`'s special tokens (about `vocab_size` entries)."""
    spec = FAMILIES[family]
    specials = [t for t in (spec.bos_token, spec.eos_token, spec.pad_token) if t]
    specials += [t for t in spec.extra_special_tokens if t not in specials]
    specials = list(dict.fromkeys(specials))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(rng, vocab_size), trainer=trainer)
    if spec.bos_token:
        bos_id = tokenizer.token_to_id(spec.bos_token)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos_token} $A",
            pair=f"{spec.bos_token} $A {spec.bos_token} $B",
            special_tokens=[(spec.bos_token, bos_id)],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, *, family: str, out_dir: Path, model_max_length: int) -> None:
    """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json` into `out_dir`."""
    spec = FAMILIES[family]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    special_map: dict[str, str] = {"eos_token": spec.eos_token, "pad_token": spec.pad_token}
    if spec.bos_token:
        special_map["bos_token"] = spec.bos_token
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": spec.bos_token is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": spec.chat_template,
        **special_map,
        "bos_token": spec.bos_token,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
