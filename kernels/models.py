"""Architecture shapes the kernels are tuned for.

`kernels` stands alone (it imports nothing else of Tailguard), so it keeps its own small catalog
of the shapes that matter to the kernels; a model not listed is given as the path of its
Hugging Face `config.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShapes:
    name: str
    hidden_size: int
    intermediate_size: int  # dense MLP width (the SiLU-mul output width for dense models)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int = 0  # 0 for dense models: the MoE GEMM is not tuned
    experts_per_token: int = 0
    moe_intermediate_size: int = 0  # width of one expert's MLP

    @property
    def mlp_width(self) -> int:
        """Width of the activation the SiLU-mul kernel produces."""
        return self.moe_intermediate_size if self.num_experts else self.intermediate_size


CATALOG: dict[str, ModelShapes] = {
    m.name: m
    for m in (
        ModelShapes("llama-3.1-8b", 4096, 14336, 32, 8, 128),
        ModelShapes("llama-3.1-70b", 8192, 28672, 64, 8, 128),
        ModelShapes("qwen2.5-7b", 3584, 18944, 28, 4, 128),
        ModelShapes("mixtral-8x7b", 4096, 14336, 32, 8, 128, 8, 2, 14336),
        ModelShapes("qwen3-30b-a3b", 2048, 6144, 32, 4, 128, 128, 8, 768),
        # The local random-weight test model (DESIGN.md): hidden 512, GQA 8/4.
        ModelShapes("tiny-llama-29m", 512, 1536, 8, 4, 64),
    )
}


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    if default is None:
        raise ValueError(f"config.json lacks {' / '.join(keys)}")
    return default


def shapes_from_hf_config(cfg: dict[str, Any], name: str) -> ModelShapes:
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    inter = _int(cfg, "intermediate_size")
    return ModelShapes(
        name=name,
        hidden_size=hidden,
        intermediate_size=inter,
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", default=heads),
        head_dim=_int(cfg, "head_dim", default=hidden // heads),
        num_experts=experts,
        experts_per_token=_int(cfg, "num_experts_per_tok", default=2 if experts else 0),
        moe_intermediate_size=_int(cfg, "moe_intermediate_size", default=inter) if experts else 0,
    )


def resolve_model(name: str) -> ModelShapes:
    """A catalog name, or the path of a Hugging Face config.json (or of its folder)."""
    if name in CATALOG:
        return CATALOG[name]
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            return shapes_from_hf_config(json.load(fh), name)
    known = ", ".join(sorted(CATALOG))
    raise ValueError(f"unknown model {name!r}: give one of {known} or the path of a config.json")
