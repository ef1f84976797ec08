"""Model architecture specs: our YAML files and HuggingFace ``config.json`` files.

A ``config.json`` is read from a local path only; nothing is ever fetched from a hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import InputError
from simulator.model.loader import (
    load_validated,
    looks_like_path,
    read_mapping,
    suggest,
    validate,
)
from simulator.model.registry import config_files

# Upper bounds on a model's sizes: far above any published model, low enough that a unit slip
# (a context in bytes, a width of 1e12) is caught and products of them (weights = layers x
# width^2, KV bytes = layers x heads x head_dim x context) stay far inside float64's range. Largest published
# values: 126 layers (Llama-3.1-405B), hidden 16384 / FFN 53248 (405B), 128 heads, vocab
# 256k (Gemma), context 10M tokens (Llama 4 Scout), 256 routed experts (DeepSeek-V3).
MAX_LAYERS = 4096
MAX_WIDTH = 2**20
MAX_HEADS = 2**14
MAX_VOCAB = 2**24
MAX_CONTEXT = 2**27
MAX_EXPERTS = 2**16


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are element counts; ``max_context`` is in tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    num_kv_heads: int = Field(default=0, ge=0, le=MAX_HEADS, description="0 means = num_heads (MHA)")
    head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="0 means hidden_size // num_heads")
    ffn_size: int = Field(ge=1, le=MAX_WIDTH)
    gated_mlp: bool = Field(default=True, description="SwiGLU (3 matrices) vs ungated (2)")
    activation: Literal["silu", "gelu", "relu"] = "silu"
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    max_context: int = Field(ge=1, le=MAX_CONTEXT)
    tied_embeddings: bool = False
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=1, le=2)
    linear_bias: bool = False
    position_embedding: Literal["rotary", "learned", "alibi"] = "rotary"
    learned_position_rows: int = Field(default=0, ge=0, le=MAX_CONTEXT + 2, description="0 means max_context")
    parallel_attention: bool = Field(default=False, description="attention and MLP read one norm (Falcon)")
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    moe_experts: int = Field(default=1, ge=1, le=MAX_EXPERTS)
    moe_top_k: int = Field(default=1, ge=1, le=MAX_EXPERTS)

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; give head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} must divide num_heads {self.num_heads}")
        if self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k {self.moe_top_k} exceeds moe_experts {self.moe_experts}")
        if self.position_embedding == "learned" and self.learned_position_rows == 0:
            object.__setattr__(self, "learned_position_rows", self.max_context)
        return self

    @property
    def attention_kind(self) -> str:
        """'MHA', 'MQA' or 'GQA-g'."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return f"GQA-{self.num_kv_heads}"


def with_attention(spec: ModelSpec, variant: str | None) -> ModelSpec:
    """The MHA, MQA or GQA-N variant of ``spec`` (``variant`` is 'mha', 'mqa' or 'gqa:N')."""
    if variant is None:
        return spec
    text = variant.strip().lower()
    if text == "mha":
        kv_heads = spec.num_heads
    elif text == "mqa":
        kv_heads = 1
    elif text.startswith("gqa:"):
        try:
            kv_heads = int(text[4:])
        except ValueError:
            raise InputError(f"--attention: '{variant}' needs an integer after 'gqa:', e.g. gqa:8") from None
        if kv_heads < 1 or spec.num_heads % kv_heads:
            divisors = [d for d in range(1, spec.num_heads + 1) if spec.num_heads % d == 0]
            raise InputError(
                f"--attention: {kv_heads} KV heads must divide the {spec.num_heads} heads of {spec.name}; "
                f"allowed: {', '.join(map(str, divisors))}"
            )
    else:
        raise InputError(f"--attention: unknown variant '{variant}'; allowed: mha, mqa, gqa:N")
    if kv_heads == spec.num_kv_heads:
        return spec
    return spec.model_copy(update={"num_kv_heads": kv_heads, "name": f"{spec.name} ({text})"})


def _first(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def from_hf_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Map a HuggingFace ``config.json`` onto our ModelSpec fields (Llama, Mistral, Mixtral, Falcon, OPT, GPT-2 style)."""
    model_type = str(config.get("model_type", "")).lower()
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    heads = _first(config, "num_attention_heads", "n_head")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    if hidden is None or heads is None or layers is None:
        raise InputError(f"{name}: config.json lacks hidden_size / num_attention_heads / num_hidden_layers")
    act = str(_first(config, "hidden_act", "activation_function", "activation", default="silu")).lower()
    activation = "silu" if "silu" in act or "swish" in act else "relu" if "relu" in act else "gelu"
    is_falcon = model_type in ("falcon", "refinedweb", "refinedwebmodel")
    is_opt = model_type == "opt"
    is_gpt2 = model_type in ("gpt2", "gpt3")
    if is_falcon:
        kv_heads = 1 if config.get("multi_query", False) and not config.get("new_decoder_architecture") else _first(
            config, "num_kv_heads", "n_head_kv", default=heads
        )
    else:
        kv_heads = _first(config, "num_key_value_heads", default=heads)
    ffn = _first(config, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    if ffn is None:
        ffn = 4 * hidden if isinstance(hidden, int) else hidden  # a malformed width is reported by validation
    gated = not (is_falcon or is_opt or is_gpt2) and activation == "silu"
    spec: dict[str, Any] = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_size": ffn,
        "gated_mlp": gated,
        "activation": activation,
        "vocab_size": config.get("vocab_size"),
        "max_context": _first(config, "max_position_embeddings", "n_positions", "max_seq_len", default=2048),
        "tied_embeddings": bool(config.get("tie_word_embeddings", is_falcon or is_opt or is_gpt2)),
        "norm": "layernorm" if (is_falcon or is_opt or is_gpt2) else "rmsnorm",
        "linear_bias": bool(config.get("bias", is_opt or is_gpt2 or config.get("attention_bias", False))),
    }
    if config.get("head_dim"):
        spec["head_dim"] = config["head_dim"]
    if is_falcon:
        spec["parallel_attention"] = bool(config.get("parallel_attn", True))
        spec["norms_per_layer"] = 1 if spec["parallel_attention"] and not config.get("new_decoder_architecture") else 2
        spec["position_embedding"] = "alibi" if config.get("alibi") else "rotary"
    if is_opt or is_gpt2:
        spec["position_embedding"] = "learned"
        # OPT's learned position table has 2 extra rows (its padding offset).
        rows = spec["max_context"]
        spec["learned_position_rows"] = rows + (2 if is_opt else 0) if isinstance(rows, int) else rows
    if config.get("sliding_window"):
        spec["sliding_window"] = config["sliding_window"]
    if config.get("num_local_experts"):
        spec["moe_experts"] = config["num_local_experts"]
        spec["moe_top_k"] = config.get("num_experts_per_tok", 2)
    return spec


def _model_files() -> list[Path]:
    return config_files("models")


def list_models() -> list[ModelSpec]:
    """Every model config: $MEMWALL_CONFIG_DIR's first, then the shipped ones (registry.config_files)."""
    return [load_validated(ModelSpec, path) for path in _model_files()]


def load_model_file(path: Path) -> ModelSpec:
    """Our model YAML, or a HuggingFace config.json (recognised by its field names)."""
    data = read_mapping(path)
    if "num_layers" not in data and ("num_hidden_layers" in data or "n_layer" in data or "model_type" in data):
        name = data.get("_name_or_path") or path.parent.name or path.stem
        data = from_hf_config(data, str(name))
    return validate(ModelSpec, data, str(path), plausible=True)


def load_model(name_or_path: str) -> ModelSpec:
    """A shipped model by name or alias (case-insensitive), or a YAML / config.json by path."""
    if looks_like_path(name_or_path):
        return load_model_file(Path(name_or_path))
    wanted = name_or_path.lower()
    known: list[str] = []
    for model in list_models():
        names = [model.name, *model.aliases]
        if wanted in (n.lower() for n in names):
            return model
        known.extend(names)
    raise InputError(
        f"--model: unknown model '{name_or_path}'{suggest(name_or_path, known)}; "
        f"known: {', '.join(m.name for m in list_models())} (or a path to a YAML or config.json file)"
    )
