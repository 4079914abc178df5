"""Model catalog: architecture parameters -> parameters, weight bytes, FLOPs/bytes per token, KV bytes.

Architectures are the published `config.json` shapes of each family (dense GQA, MoE, and
DeepSeek-V3's multi-head latent attention). The local random-weight models come from
`serving.models.tiny.SIZES`, so the catalog and the checkpoints the engine serves cannot drift.

Cost conventions (per layer, per token): a matrix-vector product with P weights costs 2P FLOPs;
attention costs 2 * heads * (d_qk + d_v) FLOPs per (query token, context token) pair; MoE layers
run `num_experts_per_token` routed experts (+ shared ones) per token, and a batch of T tokens
touches E * (1 - (1 - k/E)^T) distinct experts in expectation, which is what decode reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from serving.models.tiny import SIZES

BYTES_PER_FORMAT: dict[str, float] = {
    "fp32": 4.0,
    "float32": 4.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
    "float16": 2.0,
    "auto": 2.0,  # published checkpoints are 16-bit
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
    "nvfp4": 0.5,
    "mxfp4": 0.5,
    "int4": 0.5,
    "awq": 0.5,
    "gptq": 0.5,
}


def format_bytes(fmt: str) -> float:
    try:
        return BYTES_PER_FORMAT[fmt.lower()]
    except KeyError:
        raise ValueError(
            f"unknown number format {fmt!r}; known: {', '.join(sorted(BYTES_PER_FORMAT))}"
        ) from None


@dataclass(frozen=True)
class ModelSpec:
    """Transformer architecture of one model (dimensions as in its config.json)."""

    name: str
    family: str  # "llama", "qwen3", "qwen3-moe", "glm4-moe", "deepseek-v3", "tiny-llama", ...
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (dense layers of MoE models too)
    vocab_size: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    # MoE (num_experts == 0: dense)
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0  # leading layers with a dense MLP in MoE models
    # Multi-head latent attention (kv_lora_rank == 0: ordinary GQA)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    checkpoint_format: str = "bf16"  # what the published checkpoint stores
    max_position_embeddings: int = 32768  # the engine's default max_model_len
    published_params_b: float | None = None  # the family's own parameter count, for checks
    source: str = ""  # where the shape comes from

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    # -- parameters ----------------------------------------------------------------------------

    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.uses_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk + self.q_lora_rank
            else:
                q = h * self.num_heads * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv + o
        q = h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * h
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + bias

    def _dense_mlp(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def _expert(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def num_parameters(self) -> int:
        h = self.hidden_size
        per_layer_common = self.attention_params_per_layer() + 2 * h
        total = self.num_layers * per_layer_common
        total += (self.num_layers - self.num_moe_layers) * self._dense_mlp()
        total += self.num_moe_layers * (
            h * self.num_experts + (self.num_experts + self.num_shared_experts) * self._expert()
        )
        total += self.vocab_size * h * (1 if self.tie_embeddings else 2) + h
        return total

    def num_active_parameters(self) -> int:
        """Parameters used per token (routed experts: only the chosen ones)."""
        h = self.hidden_size
        total = self.num_layers * (self.attention_params_per_layer() + 2 * h)
        total += (self.num_layers - self.num_moe_layers) * self._dense_mlp()
        total += self.num_moe_layers * (
            h * self.num_experts + (self.num_experts_per_token + self.num_shared_experts) * self._expert()
        )
        total += self.vocab_size * h * (1 if self.tie_embeddings else 2) + h
        return total

    def weight_bytes(self, fmt: str = "bf16") -> float:
        return self.num_parameters() * format_bytes(fmt)

    # -- per-token costs -----------------------------------------------------------------------

    def linear_flops_per_token(self) -> float:
        """Matmul FLOPs of the layers for one token (no attention scores, no LM head)."""
        h = self.hidden_size
        per_layer = self.attention_params_per_layer()
        total = self.num_layers * per_layer
        total += (self.num_layers - self.num_moe_layers) * self._dense_mlp()
        total += self.num_moe_layers * (
            h * self.num_experts + (self.num_experts_per_token + self.num_shared_experts) * self._expert()
        )
        return 2.0 * total

    def lm_head_flops_per_sampled_token(self) -> float:
        return 2.0 * self.vocab_size * self.hidden_size

    def attention_dims(self, *, decode: bool) -> tuple[int, int]:
        """(d_qk, d_v) per head as the kernels compute them (MLA decode runs absorbed)."""
        if self.uses_mla:
            if decode:
                return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank
            return self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        return self.head_dim, self.head_dim

    def attention_flops_per_pair(self, *, decode: bool) -> float:
        """FLOPs per (query token, context token) pair over all layers."""
        d_qk, d_v = self.attention_dims(decode=decode)
        return 2.0 * self.num_layers * self.num_heads * (d_qk + d_v)

    def kv_elements_per_token(self) -> int:
        if self.uses_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_format: str = "bf16") -> float:
        return self.kv_elements_per_token() * format_bytes(kv_format)

    def weight_bytes_touched(self, num_tokens: int, fmt: str = "bf16") -> float:
        """Weight bytes one forward pass over `num_tokens` tokens reads (MoE: experts hit)."""
        per = format_bytes(fmt)
        if not self.is_moe or num_tokens <= 0:
            return self.num_parameters() * per
        e, k = self.num_experts, self.num_experts_per_token
        hit = e * (1.0 - (1.0 - k / e) ** num_tokens)
        unused = (e - hit) * self._expert() * self.num_moe_layers
        return (self.num_parameters() - unused) * per

    def prefill_cost(
        self, num_tokens: int, fmt: str = "bf16", kv_format: str = "bf16"
    ) -> tuple[float, float]:
        """(FLOPs, bytes) of a whole-prompt prefill of `num_tokens` tokens, one sequence."""
        pairs = num_tokens * (num_tokens + 1) / 2.0
        flops = num_tokens * self.linear_flops_per_token() + pairs * self.attention_flops_per_pair(
            decode=False
        )
        flops += self.lm_head_flops_per_sampled_token()
        data = self.weight_bytes_touched(num_tokens, fmt) + num_tokens * self.kv_bytes_per_token(kv_format)
        return flops, data

    def decode_cost(
        self, context_tokens: int, fmt: str = "bf16", kv_format: str = "bf16"
    ) -> tuple[float, float]:
        """(FLOPs, bytes) of one decode token for one sequence with `context_tokens` of context."""
        flops = self.linear_flops_per_token() + self.lm_head_flops_per_sampled_token()
        flops += context_tokens * self.attention_flops_per_pair(decode=True)
        data = self.weight_bytes_touched(1, fmt) + (context_tokens + 1) * self.kv_bytes_per_token(kv_format)
        return flops, data


_HF = "Hugging Face config.json of "


MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        "llama-3.1-8b",
        "llama",
        4096,
        32,
        32,
        8,
        128,
        14336,
        128256,
        max_position_embeddings=131072,
        published_params_b=8.03,
        source=_HF + "meta-llama/Llama-3.1-8B",
    ),
    "llama-3.1-70b": ModelSpec(
        "llama-3.1-70b",
        "llama",
        8192,
        80,
        64,
        8,
        128,
        28672,
        128256,
        max_position_embeddings=131072,
        published_params_b=70.6,
        source=_HF + "meta-llama/Llama-3.1-70B",
    ),
    "qwen3-8b": ModelSpec(
        "qwen3-8b",
        "qwen3",
        4096,
        36,
        32,
        8,
        128,
        12288,
        151936,
        max_position_embeddings=40960,
        published_params_b=8.2,
        source=_HF + "Qwen/Qwen3-8B",
    ),
    "qwen3-32b": ModelSpec(
        "qwen3-32b",
        "qwen3",
        5120,
        64,
        64,
        8,
        128,
        25600,
        151936,
        max_position_embeddings=40960,
        published_params_b=32.8,
        source=_HF + "Qwen/Qwen3-32B",
    ),
    "qwen3-30b-a3b": ModelSpec(
        "qwen3-30b-a3b",
        "qwen3-moe",
        2048,
        48,
        32,
        4,
        128,
        6144,
        151936,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=768,
        max_position_embeddings=40960,
        published_params_b=30.5,
        source=_HF + "Qwen/Qwen3-30B-A3B",
    ),
    "qwen3-235b-a22b": ModelSpec(
        "qwen3-235b-a22b",
        "qwen3-moe",
        4096,
        94,
        64,
        4,
        128,
        12288,
        151936,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=1536,
        max_position_embeddings=40960,
        published_params_b=235.0,
        source=_HF + "Qwen/Qwen3-235B-A22B",
    ),
    "glm-4.5-air": ModelSpec(
        "glm-4.5-air",
        "glm4-moe",
        4096,
        46,
        96,
        8,
        128,
        10944,
        151552,
        qkv_bias=True,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=1408,
        num_shared_experts=1,
        num_dense_layers=1,
        max_position_embeddings=131072,
        published_params_b=106.0,
        source=_HF + "zai-org/GLM-4.5-Air",
    ),
    "glm-4.5": ModelSpec(
        "glm-4.5",
        "glm4-moe",
        5120,
        92,
        96,
        8,
        128,
        12288,
        151552,
        qkv_bias=True,
        num_experts=160,
        num_experts_per_token=8,
        moe_intermediate_size=1536,
        num_shared_experts=1,
        num_dense_layers=3,
        max_position_embeddings=131072,
        published_params_b=355.0,
        source=_HF + "zai-org/GLM-4.5",
    ),
    "deepseek-v3": ModelSpec(
        "deepseek-v3",
        "deepseek-v3",
        7168,
        61,
        128,
        128,
        128,
        18432,
        129280,
        num_experts=256,
        num_experts_per_token=8,
        moe_intermediate_size=2048,
        num_shared_experts=1,
        num_dense_layers=3,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        checkpoint_format="fp8",
        max_position_embeddings=163840,
        published_params_b=671.0,
        source=_HF + "deepseek-ai/DeepSeek-V3",
    ),
}

# The local random-weight models, straight from the builder's size presets.
for _arch in ("llama", "qwen2"):
    for _size, _shape in SIZES.items():
        _name = f"tiny-{_arch}-{_size}"
        MODELS[_name] = ModelSpec(
            name=_name,
            family=f"tiny-{_arch}",
            hidden_size=_shape.hidden_size,
            num_layers=_shape.num_hidden_layers,
            num_heads=_shape.num_attention_heads,
            num_kv_heads=_shape.num_key_value_heads,
            head_dim=_shape.head_dim,
            intermediate_size=_shape.intermediate_size,
            vocab_size=_shape.vocab_size,
            qkv_bias=_arch == "qwen2",
            max_position_embeddings=_shape.max_position_embeddings,
            source="serving.models.tiny.SIZES (random weights, built locally)",
        )

_ALIASES = {
    "llama-s": "tiny-llama-s",
    "llama-m": "tiny-llama-m",
    "llama-xs": "tiny-llama-xs",
    "llama-l": "tiny-llama-l",
}


class UnknownModel(KeyError):
    """No catalog entry by that name; the message lists the known ones."""


def get_model(name: str) -> ModelSpec:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in MODELS:
        raise UnknownModel(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


_DENSE_HF_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def model_spec_from_dir(path: str | Path) -> ModelSpec:
    """The architecture of a dense checkpoint directory, from its config.json.

    A catalog entry with the same dimensions is returned as is (so a locally built tiny model
    keeps its catalog name); other dense Llama/Mistral/Qwen2/Qwen3 checkpoints get a spec of their
    own. MoE and MLA checkpoints are refused: name their catalog entry instead.
    """
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise UnknownModel(f"{config_path}: cannot read the model's config ({exc})") from None
    model_type = config.get("model_type")
    if model_type is None and config.get("architectures"):
        model_type = str(config["architectures"][0]).removesuffix("ForCausalLM").lower()
    family = _DENSE_HF_TYPES.get(str(model_type))
    if family is None:
        raise UnknownModel(
            f"{config_path}: model_type {model_type!r} is not a dense architecture the "
            f"catalog derives ({', '.join(sorted(_DENSE_HF_TYPES))}); use a catalog name"
        )
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        spec = ModelSpec(
            name=Path(path).name,
            family=family,
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", family == "qwen2")),
            max_position_embeddings=int(config.get("max_position_embeddings") or 32768),
            source=str(config_path),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnknownModel(f"{config_path}: missing or invalid field {exc}") from None
    shape = (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim)
    for known in MODELS.values():
        if (
            known.family.removeprefix("tiny-") == family
            and (known.hidden_size, known.num_layers, known.num_heads, known.num_kv_heads, known.head_dim)
            == shape
            and (known.intermediate_size, known.vocab_size) == (spec.intermediate_size, spec.vocab_size)
        ):
            return known
    return spec
