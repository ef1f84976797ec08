"""HuggingFace ``config.json`` -> ModelSpec fields (read from a local file only; nothing is fetched).

Families read: Llama (1-3.x), Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE,
DeepSeek-V2/V3 (MLA + MoE), DeepSeek-V4 (compressed attention and hyper-connections: ``compress_ratios``,
``hc_mult``), Gemma 1-3, gpt-oss, Llama 4 (its ``text_config``), Falcon,
OPT, GPT-2, and the model_types whose layers are one of these field for field (Kimi-K2,
Qwen3-VL, MiMo, MiniMax-M2, Step-3.x-Flash: :data:`simulator.model.hf_families.FAMILY_OF`),
with DSA's indexer (DeepSeek-V3.2, GLM-5: ``index_topk``; GLM-5.2's layers sharing one: ``indexer_types``) or Gated
DeltaNet layers between the attention layers (Qwen3.5, Qwen3-Next: ``linear_num_value_heads``, ``layer_types``),
Nemotron-H's blocks of Mamba-2, attention, MLP or MoE (``hybrid_override_pattern`` or ``layers_block_type``),
DeciLM's (Llama-Nemotron's) NAS-pruned layers (``block_configs``), Kimi-K3's Kimi Delta Attention layers beside
MLA ones (``linear_attn_config``: both in :mod:`simulator.model.hf_layouts`) with its Attention Residuals,
DeepSeek-V4's compressed attention and hyper-connections (``compress_ratios``, ``hc_mult``), sliding and full
layers of different widths (Gemma 4: ``global_head_dim``; MiMo-V2-Flash: ``swa_*``) and MiniMax-M3's block-sparse
layers (``sparse_attention_config``).
Each key is read the way the family's ``transformers`` modelling code reads it (cited per rule
below). A key the loader does not understand becomes one line in ``ModelSpec.warnings`` naming
it (shown by the report), never silence; a layout the simulator cannot cost at all (other model types'
state-space layers, Gemma 4's KV-shared layers) is one-line InputError naming the
feature and its field (:mod:`simulator.model.hf_families`). Quantisation configs are read by
:mod:`simulator.model.hf_quantisation`.

Keys that change nothing the cost model sees (``rope_theta``/``rope_scaling``, dropout,
``rms_norm_eps``, softcapping of scores/logits, which runs inside the attention kernel and
the LM head epilogue, router scoring functions) are read silently.
"""

from __future__ import annotations

from typing import Any

from simulator.errors import InputError
from simulator.model.compressed_attention_operators import COMPRESS_RATIOS
from simulator.model.hf_families import FAMILY_OF, fields_not_understood, refusal
from simulator.model.hf_layouts import (
    block_sparse_fields,
    decilm_blocks,
    gemma4_fields,
    indexer_types,
    kimi_delta_layers,
)
from simulator.model.hf_quantisation import compressed_attention_quantisation, quantisation_fields

# Families whose MLP is ungated (up, activation, down: 2 matrices); every other family is
# gated (SwiGLU / GeGLU: gate, up, down: 3 matrices). Gemma's gelu_pytorch_tanh MLP is gated.
UNGATED_TYPES = frozenset({
    "falcon", "refinedweb", "refinedwebmodel", "opt", "gpt2", "gpt3", "gptj", "gpt_neox", "bloom", "phi",
    "starcoder2", "gpt_bigcode", "nemotron_h",
})
LAYERNORM_TYPES = frozenset({"falcon", "refinedweb", "refinedwebmodel", "opt", "gpt2", "gpt3", "gptj", "gpt_neox",
                             "bloom", "phi", "starcoder2", "gpt_bigcode"})

# tie_word_embeddings when the config omits it: the default of each family's transformers
# config class (PretrainedConfig's own default is True; LlamaConfig, MistralConfig, Qwen2Config,
# DeepseekV3Config, GptOssConfig, ... pass False; GemmaConfig/Gemma2Config/Gemma3TextConfig True).
TIED_BY_DEFAULT = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "refinedweb", "refinedwebmodel", "opt", "gpt2", "gpt3",
    "gptj", "bloom", "starcoder2", "gpt_bigcode",
})
UNTIED_BY_DEFAULT = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
    "gpt_oss", "llama4", "llama4_text", "phi3", "gpt_neox", "phi", "nemotron_h",
})
KNOWN_TYPES = TIED_BY_DEFAULT | UNTIED_BY_DEFAULT

# Families with per-head RMSNorm on q and k (Qwen3, Gemma 3); others say so by use_qk_norm (MiniMax-M2).
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})

# DeepSeek-V4's cache entries are costed at the run's --kv dtype; vLLM runs them in FP8 only.
COMPRESSED_KV_WARNING = ("DeepSeek-V4's cache entries take the --kv dtype; vLLM runs them in FP8 only (fp8_ds_mla: 584 "
                         "bytes per entry of 512), which --kv fp8 costs")

# Keys that add something outside the decoder this simulator costs: warn, model the decoder.
NOT_MODELLED_KEYS = {
    "vision_config": "the vision encoder (vision_config) is not modelled: text decoder only",
    "audio_config": "the audio encoder (audio_config) is not modelled: text decoder only",
}



# Most layers a model may have (ModelSpec.num_layers' bound; the largest published model has 126). Checked
# here, before any per-layer list is built from the layer count (a 10^9-layer config would take minutes and GBs).
MAX_LAYERS = 4096
# config.json keys that hold one entry per layer (or a layer index per entry).
PER_LAYER_KEYS = ("layer_types", "moe_layer_freq", "mlp_layer_types", "no_rope_layers", "mlp_only_layers", "moe_layers",
                  "layers_block_type", "hybrid_override_pattern", "indexer_types", "index_topk_pattern", "block_configs")


def _check_layer_bounds(config: dict[str, Any], layers: Any, name: str) -> None:
    """InputError naming the field when the layer count, or a per-layer list, is past MAX_LAYERS."""
    if isinstance(layers, int) and not isinstance(layers, bool) and not 1 <= layers <= MAX_LAYERS:
        key = next(k for k in ("num_hidden_layers", "n_layer", "num_layers") if config.get(k) is not None)
        raise InputError(f"{name}: {key} is {layers}; allowed: a whole number of layers in [1, {MAX_LAYERS}]")
    for key in PER_LAYER_KEYS:
        value = config.get(key)
        if isinstance(value, (list, str)) and len(value) > MAX_LAYERS:
            raise InputError(f"{name}: {key} has {len(value)} entries; allowed: at most {MAX_LAYERS}, one per layer")


def _first(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _text_config(config: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The decoder's keys: a multimodal config's ``text_config`` with the top level's quantisation and tying."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    merged = dict(text)
    for key in ("quantization_config", "tie_word_embeddings", "torch_dtype", "dtype"):
        if key not in merged and key in config:
            merged[key] = config[key]
    if "model_type" not in text and config.get("model_type"):
        merged["model_type"] = str(config["model_type"])
    if "vision_config" in config:
        warnings.append(NOT_MODELLED_KEYS["vision_config"])
    return merged


def _activation(config: dict[str, Any]) -> str:
    act = str(_first(config, "hidden_activation", "hidden_act", "activation_function", "activation", "mlp_hidden_act",
                     default="silu")).lower()
    if act == "situ":
        return "situ"  # Kimi-K3's SituAndMul (modeling_kimi_linear.py)
    return "silu" if "silu" in act or "swish" in act else "relu" if "relu" in act else "gelu"


def _moe_fields(config: dict[str, Any], model_type: str, layers: Any, ffn: Any, warnings: list[str]) -> dict[str, Any]:
    """Mixture-of-experts keys of Mixtral, Qwen-MoE, DeepSeek, gpt-oss, Llama 4, Gemma 4 and MiniMax-M3."""
    experts = _first(config, "num_local_experts", "n_routed_experts", "num_experts")
    if not experts or experts <= 1:
        return {}
    spec: dict[str, Any] = {
        "moe_experts": experts,
        "moe_top_k": _first(config, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk",
                            "top_k_experts", default=2),
    }
    if config.get("moe_intermediate_size") or config.get("expert_intermediate_size"):
        # Qwen-MoE / DeepSeek: intermediate_size is the dense layers' MLP, moe_intermediate_size one expert's (Gemma 4:
        # or expert_intermediate_size, vLLM's Gemma4MoE reads either).
        spec["moe_ffn_size"] = _first(config, "moe_intermediate_size", "expert_intermediate_size")
    elif config.get("intermediate_size_mlp"):
        # Llama 4: intermediate_size is one expert's (and the shared expert's); intermediate_size_mlp the dense MLP.
        spec["moe_ffn_size"] = ffn
        spec["ffn_size"] = config["intermediate_size_mlp"]
    if config.get("dense_intermediate_size"):
        # MiniMax-M3: intermediate_size is one expert's (TensorRT-LLM's MiniMaxM3MoE), dense_intermediate_size the
        # leading dense layers' MLP.
        spec["moe_ffn_size"] = spec.get("moe_ffn_size") or ffn
        spec["ffn_size"] = config["dense_intermediate_size"]
    if config.get("enable_moe_block"):
        spec["moe_parallel_mlp"] = True  # Gemma 4: the dense MLP of intermediate_size runs beside the experts
    # DeepSeek: n_shared_experts, each of moe_intermediate_size; Kimi Linear/K3 (num_shared_experts): one MLP of
    # moe_intermediate_size x num_shared_experts (vLLM's KimiMoE), the same weights.
    shared = _first(config, "n_shared_experts", "num_shared_experts")
    if shared:
        spec["moe_shared_experts"] = shared
        if config.get("share_expert_dim"):
            spec["moe_shared_ffn_size"] = config["share_expert_dim"]  # Step-3.x: the shared expert's own width
        elif config.get("moe_shared_expert_intermediate_size"):
            # Nemotron-H (NemotronHMoE.shared_experts): one MLP of moe_shared_expert_intermediate_size; vLLM sizes it
            # moe_shared_expert_intermediate_size x n_shared_experts, so each shared expert is that wide.
            spec["moe_shared_ffn_size"] = config["moe_shared_expert_intermediate_size"]
    if _first(config, "moe_latent_size", "routed_expert_hidden_size"):
        # Nemotron-3 Super/Ultra (moe_latent_size), Kimi-K3 (routed_expert_hidden_size): experts in a latent; K3 norms
        # the experts' combined latent (latent_moe_use_norm: KimiSparseMoeBlock.routed_expert_norm).
        spec["moe_latent_size"] = _first(config, "moe_latent_size", "routed_expert_hidden_size")
        if config.get("latent_moe_use_norm"):
            spec["moe_latent_norm"] = True
    elif config.get("shared_intermediate_size"):
        spec["moe_shared_experts"] = 1  # MiniMax: one shared expert of shared_intermediate_size (0: none)
        spec["moe_shared_ffn_size"] = config["shared_intermediate_size"]
    elif config.get("shared_expert_intermediate_size"):
        spec["moe_shared_experts"] = 1  # Qwen2-MoE: one shared expert of its own width
        spec["moe_shared_ffn_size"] = config["shared_expert_intermediate_size"]
    elif model_type in ("llama4", "llama4_text"):
        spec["moe_shared_experts"] = 1  # Llama4TextMoe.shared_expert: one MLP of intermediate_size
    # Which layers are MoE, as each family's decoder layer decides it:
    # DeepSeek: i >= first_k_dense_replace and i % moe_layer_freq == 0;
    # Qwen-MoE: i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0;
    # Llama 4: (i + 1) % interleave_moe_layer_step == 0 (or an explicit moe_layers list).
    first_dense = int(config.get("first_k_dense_replace") or 0)
    if first_dense:
        spec["moe_first_dense_layers"] = first_dense
    step = _first(config, "decoder_sparse_step", "interleave_moe_layer_step", default=1)
    if step and step > 1:
        spec["moe_layer_step"] = step
    dense = [int(i) for i in config.get("mlp_only_layers") or []]
    freq = config.get("moe_layer_freq")
    if isinstance(freq, int) and freq > 1 and isinstance(layers, int):
        dense += [i for i in range(first_dense, layers) if i % freq]
    elif isinstance(freq, list):
        dense += [i for i, flag in enumerate(freq) if not flag]  # one 0/1 per layer (MiMo-V2, MiniMax-M3)
    kinds = config.get("mlp_layer_types")
    if isinstance(kinds, list):
        dense += [i for i, kind in enumerate(kinds) if kind == "dense"]  # GLM-5.1: 'dense' or 'sparse' per layer
    moe_layers = config.get("moe_layers")
    if isinstance(moe_layers, list) and isinstance(layers, int):
        chosen = {int(i) for i in moe_layers}
        dense = [i for i in range(layers) if i not in chosen]
        spec.pop("moe_layer_step", None)
    if dense:
        spec["moe_dense_layer_indices"] = sorted(set(dense))
    return spec


def _mtp_warning(config: dict[str, Any], warnings: list[str]) -> None:
    """Multi-token-prediction layers (DeepSeek's num_nextn_predict_layers, MiniMax's num_mtp_modules)."""
    for key in ("num_nextn_predict_layers", "num_mtp_modules", "mtp_num_hidden_layers"):
        if config.get(key) and (key != "num_mtp_modules" or config.get("use_mtp", True)):
            warnings.append(f"{key}={config[key]}: the multi-token-prediction module (a speculative-decoding draft) "
                            "is not modelled; its parameters are not counted")
            return


def _mla_fields(config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek's multi-head latent attention (kv_lora_rank etc.; q_lora_rank null = no query compression)."""
    if not config.get("kv_lora_rank"):
        return {}
    rope, nope = config.get("qk_rope_head_dim") or 0, config.get("qk_nope_head_dim") or 0
    return {
        "kv_lora_rank": config["kv_lora_rank"],
        "q_lora_rank": config.get("q_lora_rank") or 0,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": config.get("v_head_dim") or nope,
        "head_dim": rope + nope,
    }


def _compressed_attention_fields(config: dict[str, Any], layers: int, name: str) -> dict[str, Any]:
    """DeepSeek-V4's compressed attention (``compress_ratios``), as its reference code (inference/model.py
    ``ModelArgs``) and transformers' ``DeepseekV4Config`` read the config.

    ``compress_ratios`` has one ratio per layer and then one per multi-token-prediction layer (vLLM's
    DeepseekV4Attention: "MTP layer is not included"); the decoder's are kept. ``sliding_window`` is the raw window
    every layer keeps beside its compressed entries; ``head_dim`` (the one K = V head), ``q_lora_rank`` and
    ``qk_rope_head_dim`` are the attention's widths, ``o_groups`` and ``o_lora_rank`` its grouped output projection.
    """
    ratios = config["compress_ratios"]
    mtp = int(config.get("num_nextn_predict_layers") or 0)
    if not isinstance(ratios, list) or len(ratios) not in (layers, layers + mtp):
        got = f"has {len(ratios)} entries" if isinstance(ratios, list) else f"is a {type(ratios).__name__}"
        raise InputError(f"{name}: compress_ratios {got}; allowed: a list of one per layer ({layers}), then one per "
                         f"multi-token-prediction layer ({mtp})")
    odd = sorted({str(r) for r in ratios if r not in COMPRESS_RATIOS or isinstance(r, bool)})
    if odd:
        raise InputError(f"{name}: compress_ratios has {', '.join(odd)}; allowed: 0 (window only), 4 (compressed "
                         "sparse attention), 128 (heavily compressed attention), the ratios DeepSeek-V4's code builds")
    return {
        "compress_ratios": ratios[:layers],
        "compress_window": config.get("sliding_window") or 0,
        "q_lora_rank": config.get("q_lora_rank") or 0,
        "qk_rope_head_dim": config.get("qk_rope_head_dim") or 0,
        "o_groups": config.get("o_groups") or 0,
        "o_lora_rank": config.get("o_lora_rank") or 0,
    }


def _hyper_connection_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Manifold-constrained hyper-connections (DeepSeek-V4's ``hc_mult`` residual streams, ``hc_sinkhorn_iters``)."""
    if not config.get("hc_mult") or config["hc_mult"] == 1:
        return {}
    return {"hc_mult": config["hc_mult"], "hc_sinkhorn_iters": config.get("hc_sinkhorn_iters") or 0}


def _dsa_fields(config: dict[str, Any], layers: Any) -> dict[str, Any]:
    """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the indexer's heads and the keys it selects per query, and
    (GLM-5.2) which layers run an indexer of their own."""
    if not config.get("index_topk"):
        return {}
    spec = {"index_topk": config["index_topk"], "index_heads": config.get("index_n_heads") or 0,
            "index_head_dim": config.get("index_head_dim") or 0}
    if isinstance(layers, int):
        types = indexer_types(config, layers)
        if "shared" in types:
            spec["indexer_types"] = types
    return spec


# Qwen3.5's mamba_ssm_dtype (the Gated DeltaNet state's dtype) as this simulator names dtypes.
STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _linear_fields(config: dict[str, Any], layers: Any, has_types: bool) -> dict[str, Any]:
    """Gated DeltaNet layers (Qwen3-Next, Qwen3.5): their widths, and which layers they are.

    ``layer_types`` names them 'linear_attention' where given; else every ``full_attention_interval``-th layer
    is full attention and the rest linear (Qwen3NextConfig: layer i is full when (i + 1) % interval == 0).
    """
    if not config.get("linear_num_value_heads"):
        return {}
    spec: dict[str, Any] = {
        "linear_key_heads": config.get("linear_num_key_heads") or 0,
        "linear_value_heads": config["linear_num_value_heads"],
        "linear_key_head_dim": config.get("linear_key_head_dim") or 0,
        "linear_value_head_dim": config.get("linear_value_head_dim") or 0,
        "linear_conv_kernel": config.get("linear_conv_kernel_dim") or 0,
    }
    dtype = config.get("mamba_ssm_dtype")
    if dtype is not None:
        if str(dtype) not in STATE_DTYPES:
            raise InputError(f"mamba_ssm_dtype: '{dtype}' is not one of {', '.join(STATE_DTYPES)}")
        spec["linear_state_dtype"] = STATE_DTYPES[str(dtype)]
    if not has_types and isinstance(layers, int):
        types = config.get("layer_types")
        if isinstance(types, list):
            spec["layer_types"] = [_layer_kind(str(kind)) for kind in types]
        else:
            interval = int(config.get("full_attention_interval") or 4)
            spec["layer_types"] = ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    return spec


# Nemotron-H's layers_block_type names (old and new, transformers' remap_legacy_layer_types) as block_pattern
# characters (NemotronHConfig._list_to_pattern).
BLOCK_CHARACTERS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                    "moe": "E"}


def _block_pattern(config: dict[str, Any]) -> str | None:
    """Nemotron-H's blocks as ModelSpec.block_pattern: ``hybrid_override_pattern``, else ``layers_block_type``."""
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        odd = sorted(set(pattern) - set(BLOCK_CHARACTERS.values()))
        if odd:
            raise InputError(f"hybrid_override_pattern: characters {''.join(odd)} are not blocks this loader knows "
                             "(allowed: M mamba, * attention, - mlp, E moe)")
        return pattern
    types = config.get("layers_block_type")
    if isinstance(types, list):
        odd = sorted({str(kind) for kind in types} - set(BLOCK_CHARACTERS))
        if odd:
            raise InputError(f"layers_block_type: {', '.join(odd)} blocks are not modelled (allowed: "
                             f"{', '.join(BLOCK_CHARACTERS)})")
        return "".join(BLOCK_CHARACTERS[str(kind)] for kind in types)
    return None


def _mamba_fields(config: dict[str, Any], pattern: str) -> dict[str, Any]:
    """Nemotron-H's Mamba-2 mixers (transformers' NemotronHMamba2Mixer): heads, head width, state width, groups,
    convolution width and scan chunk, and the SSM state's dtype.

    The state dtype: ``mamba_ssm_cache_dtype``, else float32 (transformers' NemotronHConfig default, and vLLM's
    ``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``, which sets its cache's dtype from the config).
    """
    spec: dict[str, Any] = {"block_pattern": pattern, "position_embedding": "none"}  # NemotronHAttention: no RoPE
    if "M" not in pattern:
        return spec
    dtype = str(config.get("mamba_ssm_cache_dtype") or "float32")
    if dtype not in STATE_DTYPES:
        raise InputError(f"mamba_ssm_cache_dtype: '{dtype}' is not one of {', '.join(STATE_DTYPES)}")
    spec.update({
        "mamba_heads": config.get("mamba_num_heads") or 0,
        "mamba_head_dim": config.get("mamba_head_dim") or 0,
        "mamba_state_size": config.get("ssm_state_size") or 0,
        "mamba_groups": config.get("n_groups") or 0,
        "mamba_conv_kernel": config.get("conv_kernel") or 0,
        "mamba_state_dtype": STATE_DTYPES[dtype],
    })
    if config.get("chunk_size"):
        spec["mamba_chunk_size"] = config["chunk_size"]
    return spec


def _swa_fields(config: dict[str, Any]) -> dict[str, Any]:
    """MiMo-V2-Flash's sliding-window layers (vLLM's MiMoV2FlashDecoderLayer: ``hybrid_layer_pattern`` 1) with KV
    heads of their own (``swa_num_key_value_heads``) and a sink logit per head (``add_swa_attention_sink_bias``)."""
    pattern = config.get("hybrid_layer_pattern")
    if not isinstance(pattern, list):
        return {}
    # Widths the sliding layers may only share with the full ones (no ModelSpec field holds them apart).
    for own, shared in (("swa_num_attention_heads", "num_attention_heads"), ("swa_head_dim", "head_dim"),
                        ("swa_v_head_dim", "v_head_dim")):
        if config.get(own) is not None and config[own] != config.get(shared):
            raise InputError(f"sliding-window layers with their own {shared}: not modelled (config.json field {own} = "
                             f"{config[own]}, {shared} = {config.get(shared)}; allowed: equal)")
    spec: dict[str, Any] = {"sliding_window": _first(config, "sliding_window_size", "sliding_window"),
                            "layer_types": ["sliding" if flag else "full" for flag in pattern]}
    swa_kv = config.get("swa_num_key_value_heads")
    if swa_kv and swa_kv != config.get("num_key_value_heads"):
        spec["sliding_kv_heads"] = swa_kv
    if config.get("add_swa_attention_sink_bias"):
        spec["sliding_attention_sinks"] = True
    return spec


def _layer_kind(text: str) -> str:
    """A config.json layer type as ModelSpec.layer_types names it; InputError for one not modelled."""
    kinds = {"sliding_attention": "sliding", "chunked_attention": "sliding", "full_attention": "full",
             "linear_attention": "linear"}
    if text not in kinds:
        raise InputError(f"layer_types: '{text}' layers are not modelled (allowed: {', '.join(kinds)})")
    return kinds[text]


def _window_fields(config: dict[str, Any], model_type: str, layers: Any, warnings: list[str]) -> dict[str, Any]:
    """Sliding-window layers: one window for all layers, per-layer ``layer_types``, or the family's pattern."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not config.get("use_sliding_window"):
        window = None  # Qwen: sliding_window is inert unless use_sliding_window (Qwen2Attention)
    chunk = config.get("attention_chunk_size")
    if model_type in ("llama4", "llama4_text") and chunk:
        # Llama 4: layers with RoPE (no_rope_layers[i] == 1) attend within chunks of attention_chunk_size;
        # the rest (every 4th) are global. A chunk reads at most chunk tokens: costed as a window (an upper bound).
        flags = config.get("no_rope_layers")
        if isinstance(flags, list) and isinstance(layers, int) and len(flags) == layers:
            types = ["sliding" if flag else "full" for flag in flags]
        elif isinstance(layers, int):
            types = ["full" if (i + 1) % 4 == 0 else "sliding" for i in range(layers)]
        warnings.append(f"chunked attention (attention_chunk_size {chunk}) is costed as a sliding window of {chunk} "
                        "tokens: an upper bound on the keys each chunked layer reads")
        return {"sliding_window": chunk, "layer_types": types}
    if not window:
        return {}
    spec: dict[str, Any] = {"sliding_window": window}
    if isinstance(types, list):
        spec["layer_types"] = [_layer_kind(str(kind)) for kind in types]
    elif model_type == "gemma2":
        spec["sliding_window_pattern"] = 2  # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
    elif model_type in ("gemma3", "gemma3_text"):
        spec["sliding_window_pattern"] = config.get("sliding_window_pattern") or 6  # (i + 1) % pattern != 0 slides
    elif model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and isinstance(layers, int):
        first = int(config.get("max_window_layers") or 0)  # Qwen2: layers >= max_window_layers slide
        spec["layer_types"] = ["sliding" if i >= first else "full" for i in range(layers)]
    return spec


def from_hf_config(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """Map a HuggingFace ``config.json`` onto our ModelSpec fields (see module docstring)."""
    warnings: list[str] = []
    config = _text_config(raw, warnings)
    declared = str(config.get("model_type", "")).lower()
    # The family whose rules a field cannot tell (tying default, norms, gating) come from.
    model_type = FAMILY_OF.get(declared, declared)
    refused = refusal(config, declared)
    if refused:
        raise InputError(f"{name}: {refused}")
    for key, what in NOT_MODELLED_KEYS.items():
        if key in raw and "text_config" not in raw:
            warnings.append(what)
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    heads = _first(config, "num_attention_heads", "n_head")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    _check_layer_bounds(config, layers, name)
    pattern = _block_pattern(config) if declared == "nemotron_h" else None
    if pattern is not None:
        if isinstance(layers, int) and layers != len(pattern):
            raise InputError(f"{name}: num_hidden_layers is {layers} but the block pattern has {len(pattern)} layers")
        layers = len(pattern)  # NemotronHConfig.num_hidden_layers: the pattern's length
    if hidden is None or heads is None or layers is None:
        raise InputError(f"{name}: config.json lacks hidden_size / num_attention_heads / num_hidden_layers")
    if model_type not in KNOWN_TYPES:
        warnings.append(f"model_type '{declared}' is not a family the loader knows: read as a Llama-style decoder "
                        "(gated MLP, RMSNorm; check them)")
    odd = fields_not_understood(config)
    if odd:
        warnings.append(f"config.json fields not understood, taken to change nothing the cost model sees: "
                        f"{', '.join(odd)}")
    activation = _activation(config)
    is_falcon = model_type in ("falcon", "refinedweb", "refinedwebmodel")
    is_opt = model_type == "opt"
    is_gpt2 = model_type in ("gpt2", "gpt3")
    if is_falcon:
        kv_heads = 1 if config.get("multi_query", False) and not config.get("new_decoder_architecture") else _first(
            config, "num_kv_heads", "n_head_kv", default=heads
        )
    else:
        kv_heads = _first(config, "num_key_value_heads", default=heads)
    if isinstance(kv_heads, int) and not isinstance(kv_heads, bool) and kv_heads < 1:
        # memwall's own YAML reads 0 as "as many as the query heads"; transformers has no such value.
        raise InputError(f"{name}: the key-value heads (num_key_value_heads, or num_kv_heads / n_head_kv) are "
                         f"{kv_heads}; allowed: a whole number >= 1 that divides num_attention_heads ({heads})")
    ffn = _first(config, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    if ffn is None:
        ffn = 4 * hidden if isinstance(hidden, int) else hidden  # a malformed width is reported by validation
    tied_default = model_type in TIED_BY_DEFAULT or model_type not in KNOWN_TYPES
    if "tie_word_embeddings" not in config and model_type not in KNOWN_TYPES:
        warnings.append("tie_word_embeddings absent: taken as true (transformers' PretrainedConfig default)")
    spec: dict[str, Any] = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_size": ffn,
        "gated_mlp": model_type not in UNGATED_TYPES,
        "activation": activation,
        "vocab_size": config.get("vocab_size"),
        "max_context": _first(config, "max_position_embeddings", "n_positions", "max_seq_len", default=2048),
        "tied_embeddings": bool(config.get("tie_word_embeddings", tied_default)),
        "norm": "layernorm" if model_type in LAYERNORM_TYPES else "rmsnorm",
        "linear_bias": bool(config.get("bias", is_opt or is_gpt2 or config.get("attention_bias") or config.get("qkv_bias")
                                       or config.get("mlp_bias"))),
    }
    if _first(config, "head_dim", "attention_head_dim"):
        spec["head_dim"] = _first(config, "head_dim", "attention_head_dim")  # Nemotron-H-56B: attention_head_dim
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        spec["norms_per_layer"] = 4  # pre- and post-norms around attention and MLP
    if model_type in QK_NORM_TYPES or config.get("use_qk_norm"):
        spec["qk_norm"] = True
    if config.get("attn_output_gate") or config.get("mla_use_output_gate"):
        # Qwen3-Next/3.5: q_proj yields the gate beside the queries; Kimi-K3's MLA: a g_proj of its own
        spec["attention_output_gate"] = True
    if config.get("mla_use_nope"):
        spec["position_embedding"] = "none"  # Kimi Linear/K3's MLA rotates nothing (KimiMLAAttention: rotary_emb None)
    if config.get("attn_res_block_size"):
        spec["attention_residual_block"] = config["attn_res_block_size"]  # Kimi-K3's Attention Residuals
    if model_type == "gpt_oss":
        spec["attention_sinks"] = True  # GptOssAttention.sinks: one learned logit per head
    if config.get("query_pre_attn_scalar"):
        spec["query_pre_attn_scalar"] = config["query_pre_attn_scalar"]
    if is_falcon:
        spec["parallel_attention"] = bool(config.get("parallel_attn", True))
        spec["norms_per_layer"] = 1 if spec["parallel_attention"] and not config.get("new_decoder_architecture") else 2
        spec["position_embedding"] = "alibi" if config.get("alibi") else "rotary"
    if is_opt or is_gpt2:
        spec["position_embedding"] = "learned"
        # OPT's learned position table has 2 extra rows (its padding offset).
        rows = spec["max_context"]
        spec["learned_position_rows"] = rows + (2 if is_opt else 0) if isinstance(rows, int) else rows
    compressed = config.get("compress_ratios") is not None and isinstance(layers, int)
    if compressed:
        spec.update(_compressed_attention_fields(config, layers, name))
        warnings.append(COMPRESSED_KV_WARNING)
    else:
        spec.update(_window_fields(config, model_type, layers, warnings))
        spec.update(gemma4_fields(config))
        spec.update(_swa_fields(config))
        sparse = block_sparse_fields(config, warnings)
        if sparse and "layer_types" in spec:
            raise InputError("block-sparse layers (sparse_attention_config) beside sliding-window ones: not modelled")
        spec.update(sparse)
    spec.update(_hyper_connection_fields(config))
    if declared == "nemotron-nas" and isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int):
        spec.update(decilm_blocks(config, layers, heads, hidden, warnings))
    if config.get("v_head_dim") and not config.get("kv_lora_rank") and config["v_head_dim"] != spec.get("head_dim"):
        # Values narrower than keys outside MLA (MiMo-V2-Flash: vLLM's MiMoV2Attention v_head_dim).
        spec["v_head_dim"] = config["v_head_dim"]
    spec.update(_moe_fields(config, model_type, layers, ffn, warnings))
    spec.update(_mla_fields(config))
    spec.update(_dsa_fields(config, layers))
    spec.update(_linear_fields(config, layers, "layer_types" in spec))
    if declared == "kimi_linear" and isinstance(layers, int):
        spec.update(kimi_delta_layers(config, layers, warnings))
    if pattern is not None:
        spec.update(_mamba_fields(config, pattern))
    _mtp_warning(config, warnings)
    if compressed:
        spec.update(compressed_attention_quantisation(config, spec, warnings))
    elif isinstance(layers, int):
        spec.update(quantisation_fields(config, spec, warnings))
    if warnings:
        spec["warnings"] = _deduplicated(warnings)
    return spec


def _deduplicated(warnings: list[str]) -> list[str]:
    """Each distinct warning once, in first-seen order, with a count where it repeats."""
    counts: dict[str, int] = {}
    for line in warnings:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line} ({n} times)" for line, n in counts.items()]
