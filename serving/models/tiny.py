"""Random-weight models of real architectures, built locally.

Serving latency depends on the architecture and the sizes, not on the weight values, so tests
and local endpoints serve models whose weights are random but whose shapes, tokenizer and files
are those of a real checkpoint. The checkpoint is saved in bfloat16 with `torch_dtype` set in
`config.json`, as published models are, so that an engine started with its defaults behaves as
it would on a user's real model.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.models.tokenizer import FAMILIES, build_tokenizer, save_tokenizer


@dataclass(frozen=True)
class ModelShape:
    """Transformer dimensions of one size preset."""

    vocab_size: int  # requested; the trained tokenizer may come out a little smaller
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# Head dimensions stay within what vLLM's CPU attention supports (32, 64, 80, ...).
SIZES: dict[str, ModelShape] = {
    # ~0.6 M parameters, ~1 MB: unit tests
    "xs": ModelShape(2048, 64, 128, 2, 2, 1, 8192),
    # ~2 M parameters, ~4 MB: engine tests
    "s": ModelShape(4096, 128, 384, 4, 4, 2, 16384),
    # ~40 M parameters, ~80 MB: local benchmarks (the 8-layer GQA shape measured in DESIGN.md)
    "m": ModelShape(16384, 512, 1408, 8, 8, 4, 32768),
    # ~200 M parameters, ~400 MB: heavier local benchmarks
    "l": ModelShape(32000, 1024, 2816, 12, 16, 8, 32768),
}

ARCHITECTURES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
ARCH_ALIASES: dict[str, str] = {"qwen": "qwen2"}


@dataclass(frozen=True)
class TinyModel:
    """What `build_tiny_model` wrote."""

    path: Path
    arch: str
    size: str
    num_parameters: int
    size_bytes: int  # of the weight files on disk
    vocab_size: int  # the tokenizer's and the embedding's (they match exactly)
    max_position_embeddings: int


def _hf_config(arch: str, shape: ModelShape, vocab_size: int, bos_id: int | None, eos_id: int) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": eos_id,
        "bos_token_id": bos_id,
        "rope_theta": 500000.0 if arch == "llama" else 1000000.0,
    }
    if arch == "llama":
        return LlamaConfig(head_dim=shape.head_dim, **common)
    return Qwen2Config(use_sliding_window=False, **common)


def build_tiny_model(*, arch: str, size: str, out_dir: Path, seed: int = 0) -> TinyModel:
    """Build a random-weight `arch` model of preset `size` with its own tokenizer into `out_dir`.

    The same seed gives the same tokenizer and the same weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    arch = ARCH_ALIASES.get(arch, arch)
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    shape = SIZES[size]
    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(family=arch, vocab_size=shape.vocab_size, rng=rng)
    family = FAMILIES[arch]
    vocab_size = tokenizer.get_vocab_size()
    bos_id = tokenizer.token_to_id(family.bos_token) if family.bos_token else None
    eos_id = tokenizer.token_to_id(family.eos_token)
    if eos_id is None:
        raise RuntimeError(f"tokenizer lacks its end-of-text token {family.eos_token!r}")
    save_tokenizer(tokenizer, family=arch, out_dir=out_dir, model_max_length=shape.max_position_embeddings)

    config = _hf_config(arch, shape, vocab_size, bos_id, eos_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Re-draw every weight from an explicit generator: same seed, same checkpoint, and no
    # dependence on torch's global random state.
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    std = 0.02
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=generator)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    _mark_dtype(out_dir / "config.json")
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    num_parameters = sum(p.numel() for p in model.parameters())
    size_bytes = sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))
    info = TinyModel(
        path=out_dir,
        arch=arch,
        size=size,
        num_parameters=num_parameters,
        size_bytes=size_bytes,
        vocab_size=vocab_size,
        max_position_embeddings=shape.max_position_embeddings,
    )
    manifest = {**asdict(info), "path": str(out_dir), "seed": seed, "random_weights": True}
    (out_dir / "tailguard_model.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return info


def _mark_dtype(config_path: Path) -> None:
    # transformers 5 writes `dtype`; older readers (and many tools) look for `torch_dtype`.
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = "bfloat16"
    config["dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def describe_size(size: str) -> str:
    """A one-line description of a size preset (for `--help`)."""
    shape = SIZES[size]
    layer = (
        2 * shape.hidden_size * shape.hidden_size
        + 2 * shape.hidden_size * shape.num_key_value_heads * shape.head_dim
        + 3 * shape.hidden_size * shape.intermediate_size
    )
    params = 2 * shape.vocab_size * shape.hidden_size + shape.num_hidden_layers * layer
    return f"{size}: ~{params / 1e6:.1f}M parameters, ~{math.ceil(params * 2 / 2**20)} MiB in bfloat16"
