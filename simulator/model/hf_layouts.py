"""Per-layer layouts of a ``config.json``: which layers keep a DSA indexer (GLM-5.2's ``indexer_types``), what
each NAS-pruned block holds (DeciLM's ``block_configs``), which layers are Kimi Delta Attention (Kimi-K3's
``linear_attn_config``), how Gemma 4's global layers are shaped apart from its sliding ones (``global_head_dim``)
and which layers are MiniMax-M3's block-sparse ones (``sparse_attention_config``).

Split from :mod:`simulator.model.hf_config` (the mapping of fields onto ModelSpec), which would pass 600 lines with
these readers. Each reads a per-layer list the way the family's reference code does (cited per function) and
answers with ModelSpec fields; a value the cost model cannot represent is one InputError naming the field, the layer
and what is allowed.
"""

from __future__ import annotations

from typing import Any

from simulator.errors import InputError


def indexer_types(config: dict[str, Any], layers: int) -> list[str]:
    """'full' or 'shared' per layer (IndexShare, arXiv:2603.12201: a 'shared' layer attends the top-k of the nearest
    earlier 'full' layer and has no indexer of its own).

    transformers' GlmMoeDsaConfig: ``indexer_types`` as given, else ``index_topk_pattern`` (F/S per layer), else
    layer i is full when max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (defaults offset 2, freq 1:
    every layer full). vLLM builds its indexers from that last rule alone (DeepseekV2MLAAttention: skip_topk), so a
    file whose list and rule disagree is refused rather than read one way.
    """
    pattern = config.get("index_topk_pattern")
    if isinstance(pattern, str):
        odd = sorted(set(pattern) - {"F", "S"})
        if odd:
            raise InputError(f"index_topk_pattern: characters {''.join(odd)} are not indexer kinds (allowed: F full, "
                             "S shared)")
        if len(pattern) != layers:
            raise InputError(f"index_topk_pattern has {len(pattern)} characters for {layers} layers; allowed: one per "
                             "layer")
        rule = ["full" if c == "F" else "shared" for c in pattern]
    else:
        freq = max(int(config.get("index_topk_freq") or 1), 1)
        offset = int(config.get("index_skip_topk_offset", 2))
        rule = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    given = config.get("indexer_types")
    if given is None:
        types = rule
    else:
        if not isinstance(given, list) or any(kind not in ("full", "shared") for kind in given):
            raise InputError("indexer_types: each entry must be 'full' or 'shared'")
        types = [str(kind) for kind in given]
        schedule = "index_topk_pattern" if isinstance(pattern, str) else "index_topk_freq / index_skip_topk_offset"
        stated = isinstance(pattern, str) or "index_topk_freq" in config
        if stated and types != rule:
            layer = next((i for i, (a, b) in enumerate(zip(types, rule)) if a != b), min(len(types), len(rule)))
            raise InputError(f"indexer_types disagrees with {schedule} at layer {layer} (vLLM builds the indexers from "
                             "the latter); allowed: the same schedule in both")
    if len(types) != layers:
        raise InputError(f"indexer_types has {len(types)} entries for {layers} layers; allowed: one per layer")
    if types and types[0] != "full":
        raise InputError("indexer_types: layer 0 is 'shared' but no earlier layer has an indexer to share; allowed: "
                         "'full' first (GlmMoeDsaAttention needs a previous full layer's top-k)")
    return types


# DeciLM block options that change the layer in ways not modelled, at the value that leaves them off
# (modeling_decilm.py's AttentionConfig / FFNConfig): a linear replacement of the block, sparsified weights, a window
# or attention sinks. use_prefill_window_in_sink_attention and unshifted_sink only act with sinks.
DECILM_OFF = {
    "attention": {"replace_with_linear": False, "sparsify": None, "window_length": None, "num_sink_tokens": None,
                  "unshifted_sink": False, "use_prefill_window_in_sink_attention": False},
    "ffn": {"replace_with_linear": False, "sparsify": None},
}
# Block keys read: attention no_op and n_heads_in_group; ffn no_op, ffn_mult (or intermediate_size) and hidden_act
# (an activation of the gated MLP: LlamaMLP is gated whatever it is).
DECILM_READ = {"attention": {"no_op", "n_heads_in_group"}, "ffn": {"no_op", "ffn_mult", "intermediate_size",
                                                                     "hidden_act"}}


def decilm_ffn_width(ffn_mult: float, hidden: int) -> int:
    """DeciLM's MLP width from its ``ffn_mult``: int(2 ffn_mult H / 3) rounded up to a multiple of 256 (modeling_decilm.py
    and vLLM's nemotron_nas.py, ``_ffn_mult_to_intermediate_size``: a SwiGLU MLP of ffn_mult x H parameters' worth)."""
    width = int(2 * ffn_mult * hidden / 3)
    return width if width % 256 == 0 else width + 256 - width % 256


def _block_part(block: Any, index: int, part: str, odd: set[str]) -> dict[str, Any]:
    """``block_configs[index][part]``, its options checked against DECILM_OFF; keys neither read nor known go in
    ``odd``."""
    fields = block.get(part) if isinstance(block, dict) else None
    if not isinstance(fields, dict):
        raise InputError(f"block_configs[{index}].{part}: missing; allowed: a mapping of the block's fields")
    for key, value in fields.items():
        if key in DECILM_OFF[part] and value != DECILM_OFF[part][key]:
            raise InputError(f"block_configs[{index}].{part}.{key} = {value}: not modelled (allowed: "
                             f"{DECILM_OFF[part][key]})")
        if key not in DECILM_OFF[part] and key not in DECILM_READ[part]:
            odd.add(f"{part}.{key}")
    return fields


def decilm_blocks(config: dict[str, Any], layers: int, heads: int, hidden: int,
                  warnings: list[str]) -> dict[str, Any]:
    """DeciLM's (Llama-Nemotron's) NAS-pruned layers as ModelSpec fields: per layer an attention of
    heads / ``n_heads_in_group`` KV heads or none (``no_op``), and a gated MLP of its own width or none.

    vLLM's ``DeciLMDecoderLayer`` (nemotron_nas.py): a no-op attention has neither attention nor input_layernorm, a
    no-op FFN neither MLP nor post_attention_layernorm; the rest are Llama's LlamaAttention and LlamaMLP.
    """
    blocks = config.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != layers:
        count = len(blocks) if isinstance(blocks, list) else 0
        raise InputError(f"block_configs: {count} blocks for {layers} layers; allowed: one per layer")
    kinds: list[str] = []
    widths: list[int] = []
    kv_heads: set[int] = set()
    odd: set[str] = set()
    for i, block in enumerate(blocks):
        attention, ffn = (_block_part(block, i, part, odd) for part in ("attention", "ffn"))
        if attention.get("no_op"):
            kinds.append("none")
        else:
            group = attention.get("n_heads_in_group")
            if not isinstance(group, int) or group < 1 or heads % group:
                raise InputError(f"block_configs[{i}].attention.n_heads_in_group = {group}: allowed: a whole number "
                                 f"that divides the {heads} heads")
            kinds.append("full")
            kv_heads.add(heads // group)
        if ffn.get("no_op"):
            widths.append(0)
        elif isinstance(ffn.get("ffn_mult"), (int, float)) and not isinstance(ffn["ffn_mult"], bool) \
                and ffn["ffn_mult"] > 0:
            widths.append(decilm_ffn_width(ffn["ffn_mult"], hidden))
        elif isinstance(ffn.get("intermediate_size"), int) and ffn["intermediate_size"] > 0:
            widths.append(ffn["intermediate_size"])
        else:
            raise InputError(f"block_configs[{i}].ffn: no ffn_mult or intermediate_size; allowed: a positive width, "
                             "or no_op true")
    if len(kv_heads) > 1:
        raise InputError(f"block_configs: attention layers with {', '.join(map(str, sorted(kv_heads)))} KV heads: "
                         "not modelled (allowed: one n_heads_in_group for every attention layer)")
    if odd:
        warnings.append(f"block_configs fields not understood, taken to change nothing the cost model sees: "
                        f"{', '.join(sorted(odd))}")
    spec: dict[str, Any] = {"layer_types": kinds, "ffn_sizes": widths, "ffn_size": max(widths) or 1}
    if kv_heads:
        spec["num_kv_heads"] = kv_heads.pop()
    return spec


# linear_attn_config keys read; gate_lower_bound bounds KDA's decay (a sigmoid of it in place of softplus: the same
# elementwise work per decay value, which the operator leaves out either way).
KDA_READ = {"kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size", "use_full_rank_gate"}
KDA_INERT = {"gate_lower_bound"}


def kimi_delta_layers(config: dict[str, Any], layers: int, warnings: list[str]) -> dict[str, Any]:
    """Kimi Linear's and Kimi-K3's ``linear_attn_config`` as ModelSpec fields: which layers are Kimi Delta Attention
    (the rest MLA), its heads, head width, short convolution and output gate.

    Layer numbers in ``kda_layers`` and ``full_attn_layers`` count from 1 (KimiLinearConfig.is_kda_layer: layer_idx + 1
    in kda_layers). q, k and v have ``num_heads`` heads of ``head_dim`` each (vLLM's KimiDeltaAttention); the output
    gate is full rank where ``use_full_rank_gate``, else through g_a_proj of ``head_dim``. The recurrent state is fp32
    whatever the model's dtype (vLLM's MambaStateDtypeCalculator.kda_state_dtype: the convolution windows at the cache
    dtype, the state float32).
    """
    attn = config.get("linear_attn_config")
    if not isinstance(attn, dict):
        raise InputError("linear_attn_config: allowed: a mapping (kda_layers, full_attn_layers, num_heads, head_dim, "
                         "short_conv_kernel_size)")
    kda, full = attn.get("kda_layers"), attn.get("full_attn_layers") or []
    numbers = [n for n in (kda or []) + list(full) if isinstance(n, int) and not isinstance(n, bool)]
    if not isinstance(kda, list) or len(numbers) != len(kda) + len(full) or sorted(numbers) != list(range(1, layers + 1)):
        raise InputError(f"linear_attn_config: kda_layers and full_attn_layers must number the {layers} layers 1 to "
                         f"{layers}, each once")
    sizes = {key: attn.get(key) for key in ("num_heads", "head_dim", "short_conv_kernel_size")}
    bad = [key for key, value in sizes.items() if not isinstance(value, int) or value < 1]
    if bad:
        raise InputError(f"linear_attn_config: {', '.join(bad)} must be whole numbers >= 1")
    odd = sorted(set(attn) - KDA_READ - KDA_INERT)
    if odd:
        warnings.append(f"linear_attn_config fields not understood, taken to change nothing the cost model sees: "
                        f"{', '.join(odd)}")
    chosen = set(kda)
    heads, width = sizes["num_heads"], sizes["head_dim"]
    return {
        "layer_types": ["linear" if i + 1 in chosen else "full" for i in range(layers)],
        "linear_kind": "kda",
        "linear_key_heads": heads,
        "linear_value_heads": heads,
        "linear_key_head_dim": width,
        "linear_value_head_dim": width,
        "linear_conv_kernel": sizes["short_conv_kernel_size"],
        "linear_state_dtype": "fp32",
        "linear_gate_rank": 0 if attn.get("use_full_rank_gate") else width,
    }


def gemma4_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's global (full-attention) layers, shaped apart from its sliding ones (transformers'
    Gemma4TextAttention): head width ``global_head_dim``; with ``attention_k_eq_v`` no v_proj (the values are k_proj's
    output) and ``num_global_key_value_heads`` KV heads, else ``num_key_value_heads``. Every layer norms its value
    heads without a weight (v_norm)."""
    full_dim = config.get("global_head_dim")
    if not full_dim:
        return {}
    head_dim, kv_heads = config.get("head_dim"), config.get("num_key_value_heads")
    k_eq_v = bool(config.get("attention_k_eq_v"))
    full_kv = config.get("num_global_key_value_heads") if k_eq_v else kv_heads
    spec: dict[str, Any] = {"head_dim": full_dim, "num_kv_heads": full_kv or kv_heads, "full_layers_k_eq_v": k_eq_v,
                            "v_norm": True}
    if head_dim and head_dim != full_dim:
        spec["sliding_head_dim"] = head_dim
    if kv_heads and kv_heads != spec["num_kv_heads"]:
        spec["sliding_kv_heads"] = kv_heads
    return spec


# MiniMax-M3's sparse_attention_config keys (TensorRT-LLM's MiniMaxM3Params mirrors them).
BLOCK_SPARSE_KEYS = frozenset({"use_sparse_attention", "sparse_index_dim", "sparse_num_index_heads",
                               "sparse_topk_blocks", "sparse_block_size", "sparse_disable_index_value",
                               "sparse_score_type", "sparse_init_block", "sparse_local_block", "sparse_attention_freq"})


def block_sparse_fields(config: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """MiniMax-M3's block-sparse layers (``sparse_attention_config``; TensorRT-LLM's modeling_minimaxm3 and
    minimax_m3_kernels): the layers ``sparse_attention_freq`` marks, the index heads and the blocks they select.

    Modelled as the released checkpoint has them: blocks scored by their best key (``sparse_score_type`` 'max'), a
    K-only index branch (``sparse_disable_index_value`` set in every sparse layer), and the always-kept leading and
    trailing blocks counted inside ``sparse_topk_blocks`` (their scores are forced to the top of the same top-k).
    """
    sac = config.get("sparse_attention_config")
    if not isinstance(sac, dict) or not sac.get("use_sparse_attention"):
        return {}
    odd = sorted(set(sac) - BLOCK_SPARSE_KEYS)
    if odd:
        warnings.append(f"sparse_attention_config fields not understood, taken to change nothing the cost model "
                        f"sees: {', '.join(odd)}")
    freq = sac.get("sparse_attention_freq")
    if not isinstance(freq, list):
        raise InputError("sparse_attention_config.sparse_attention_freq: needs one 0/1 per layer (which layers are "
                         f"sparse); got {type(freq).__name__}")
    score = sac.get("sparse_score_type", "max")
    if score != "max":
        raise InputError(f"block-sparse attention scored by '{score}': not modelled (config.json field "
                         "sparse_attention_config.sparse_score_type; allowed: max)")
    if list(sac.get("sparse_disable_index_value") or []) != list(freq):
        raise InputError("block-sparse layers with an index value branch: not modelled (config.json field "
                         "sparse_attention_config.sparse_disable_index_value must equal sparse_attention_freq)")
    topk = sac.get("sparse_topk_blocks") or 0
    kept = (sac.get("sparse_init_block") or 0) + (sac.get("sparse_local_block") or 0)
    if kept > topk:
        raise InputError(f"block-sparse attention keeping {kept} leading and trailing blocks beside the top "
                         f"{topk}: not modelled (config.json fields sparse_attention_config.sparse_init_block, "
                         "sparse_local_block; allowed: at most sparse_topk_blocks together)")
    return {"layer_types": ["sparse" if flag else "full" for flag in freq], "block_sparse_topk_blocks": topk,
            "block_sparse_block_size": sac.get("sparse_block_size") or 0,
            "index_heads": sac.get("sparse_num_index_heads") or 0, "index_head_dim": sac.get("sparse_index_dim") or 0}
