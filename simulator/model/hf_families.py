"""Which ``config.json`` layouts the loader reads, which it refuses, and which fields change nothing.

Split from :mod:`simulator.model.hf_config` (the mapping of fields onto ModelSpec) because these are
tables, not logic: a model is recognised by its fields, not by its name. A ``model_type`` the loader
has not met is read by the same rules when its fields are ones it understands (Kimi-K2's ``kimi_k2``
is DeepSeek-V3's MLA + MoE field for field), and every field it does not understand is named in one
warning line; a field that changes the computation in a way the cost model cannot represent refuses
the whole file with one line naming the feature and the field.
"""

from __future__ import annotations

from typing import Any

# model_type -> the family whose transformers modelling code its decoder layers follow, for the family
# rules that a field cannot tell (tying default, norms, gating). Each entry says why.
FAMILY_OF = {
    "kimi_k2": "deepseek_v3",  # Kimi-K2's config.json names DeepseekV3ForCausalLM (configuration_deepseek.py)
    "kimi_k25": "deepseek_v3",  # Kimi-K2.5's text_config: the same decoder
    "qwen3_vl_text": "qwen3",  # Qwen3-VL's text decoder is Qwen3's (Qwen3VLTextDecoderLayer)
    "qwen3_vl_moe_text": "qwen3_moe",  # ... and Qwen3-MoE's
    "mimo": "qwen2",  # MiMoForCausalLM: Qwen2 layers plus multi-token-prediction layers
    "minimax_m2": "mixtral",  # MiniMaxM2: Mixtral's block_sparse_moe (all layers MoE) with per-layer q/k norms
    "step3p7": "deepseek_v3",  # Step-3.x-Flash: DeepSeek-style MoE (first_k_dense_replace, shared expert), GQA
    "deepseek_v32": "deepseek_v3",  # DeepSeek-V3.2: V3's MLA + MoE with a DSA indexer (index_topk etc.)
    "glm_moe_dsa": "deepseek_v3",  # GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3-style MLA + MoE with a DSA indexer
    "qwen3_next": "qwen3_moe",  # Qwen3-Next: Qwen3-MoE layers (q/k norms) with Gated DeltaNet layers between
    "qwen3_5_text": "qwen3",  # Qwen3.5 dense: Qwen3 layers (q/k norms) with Gated DeltaNet layers between
    "qwen3_5_moe_text": "qwen3_moe",  # ... and Qwen3.5-MoE
    # DeepSeek-V4 (DeepseekV4ForCausalLM; deepseek_ref: SGLang's FP8 copies name it so): V3's untied embeddings,
    # RMSNorm and gated MoE, with compressed attention and hyper-connections read from their own fields.
    "deepseek_v4": "deepseek_v3",
    "deepseek_ref": "deepseek_v3",
    # Llama-Nemotron (DeciLMForCausalLM): Llama's attention and MLP (vLLM's nemotron_nas.py: DeciLMAttention is a
    # LlamaAttention, the MLP a LlamaMLP), per layer as block_configs says (simulator.model.hf_layouts)
    "nemotron-nas": "llama",
    # Kimi Linear / Kimi-K3's text model (KimiLinearForCausalLM): DeepSeek-V3's MLA and MoE ("adapted from
    # deepseek-v3", modeling_kimi_linear.py) with Kimi Delta Attention layers between (linear_attn_config)
    "kimi_linear": "deepseek_v3",
    # Gemma 4 (Gemma4TextDecoderLayer): Gemma 3's four norms per layer, q/k norms, GeGLU and tied embeddings; its
    # global layers' own widths (global_head_dim), K = V, v_norm and the MoE beside the MLP are read by their fields.
    "gemma4_text": "gemma3_text",
    "gemma4": "gemma3_text",
    # MiMo-V2-Flash (vLLM's MiMoV2FlashForCausalLM): Llama's attention (no q/k norms) and gated MLP, DeepSeek-style
    # MoE layers (moe_layer_freq), untied; its sliding layers are read from hybrid_layer_pattern and swa_* fields.
    "mimo_v2_flash": "llama",
    # MiniMax-M3 (TensorRT-LLM's MiniMaxM3DecoderLayer): MiniMax-M2's per-head q/k norms and experts with a shared
    # expert and leading dense layers; its block-sparse layers are read from sparse_attention_config.
    "minimax_m3": "mixtral",
    "minimax_m3_vl": "mixtral",  # ... its multimodal checkpoint's text_config (vision encoder warned of, not costed)
}

# Layouts the cost model cannot represent, by field: (field, feature). The first present refuses the file.
# Nemotron-H's hybrid_override_pattern / layers_block_type are read for model_type nemotron_h (Mamba-2, attention,
# MLP and MoE blocks: simulator.model.hf_config), DeciLM's block_configs for nemotron-nas, Kimi's linear_attn_config
# for kimi_linear; any other model_type with them stays refused (READ_BY_TYPE).
REFUSED_FIELDS: tuple[tuple[str, str], ...] = (
    ("linear_attn_config", "linear attention (Kimi Delta Attention layers) outside model_type kimi_linear"),
    ("hybrid_override_pattern", "state-space (Mamba-2) layers"),
    ("layers_block_type", "state-space (Mamba-2) layers"),
    ("mamba_d_state", "state-space (Mamba) layers"),
    ("ssm_cfg", "state-space (Mamba) layers"),
    ("attn_layer_period", "state-space (Mamba) layers"),
    ("block_configs", "per-layer block_configs (NAS-pruned layers of differing widths) outside model_type "
                      "nemotron-nas"),
    ("cross_attention_layers", "cross-attention (vision) layers"),
)

# Fields of REFUSED_FIELDS read, not refused, for these model_types: the blocks of transformers' NemotronHBlock, the
# NAS-pruned layers of DeciLM (vLLM's DeciLMDecoderLayer) and Kimi's KDA layers (KimiLinearConfig).
READ_BY_TYPE = {
    "hybrid_override_pattern": frozenset({"nemotron_h"}),
    "layers_block_type": frozenset({"nemotron_h"}),
    "block_configs": frozenset({"nemotron-nas"}),
    "linear_attn_config": frozenset({"kimi_linear"}),
}

# Fields read by the mapping (simulator.model.hf_config and hf_quantisation).
READ = frozenset({
    "model_type", "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_hidden_layers", "n_layer",
    "num_layers", "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query", "new_decoder_architecture",
    "head_dim", "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "vocab_size", "max_position_embeddings",
    "n_positions", "max_seq_len", "tie_word_embeddings", "hidden_act", "hidden_activation", "activation_function",
    "activation", "bias", "attention_bias", "qkv_bias", "mlp_bias", "sliding_window", "layer_types",
    "use_sliding_window", "max_window_layers", "sliding_window_pattern", "attention_chunk_size", "no_rope_layers",
    "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "intermediate_size_mlp", "n_shared_experts", "shared_expert_intermediate_size",
    "share_expert_dim", "shared_intermediate_size", "first_k_dense_replace", "decoder_sparse_step",
    "interleave_moe_layer_step", "mlp_only_layers", "moe_layer_freq", "moe_layers", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "query_pre_attn_scalar", "quantization_config",
    "torch_dtype", "dtype", "use_qk_norm", "qk_norm_type", "attn_type_list", "parallel_attn", "alibi",
    "num_nextn_predict_layers", "use_mtp", "num_mtp_modules", "mtp_transformer_layers", "text_config",
    "vision_config", "audio_config", "index_topk", "index_n_heads", "index_head_dim", "indexer_types",
    "mlp_layer_types", "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
    "full_attention_interval", "mamba_ssm_dtype", "attn_output_gate", "mtp_num_hidden_layers",
    "hybrid_override_pattern", "layers_block_type", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "conv_kernel", "chunk_size", "mamba_ssm_cache_dtype", "moe_shared_expert_intermediate_size", "moe_latent_size",
    "attention_head_dim", "mlp_hidden_act",
    # DeepSeek-V4: compressed attention, grouped output projection, hyper-connections, expert format.
    "compress_ratios", "o_groups", "o_lora_rank", "hc_mult", "hc_sinkhorn_iters", "expert_dtype",
    # DeciLM's per-layer blocks; Kimi-K3: its delta attention layers, latent MoE and Attention Residuals.
    "block_configs", "linear_attn_config", "num_experts_per_token", "num_shared_experts", "routed_expert_hidden_size", "latent_moe_use_norm", "mla_use_output_gate", "mla_use_nope",
    "attn_res_block_size",
    # Gemma 4: the global layers' widths, K = V and MoE block; MiMo-V2-Flash: its sliding layers; MiniMax-M3: its
    # block-sparse layers and the leading dense layers' MLP.
    "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "enable_moe_block", "top_k_experts",
    "expert_intermediate_size", "hybrid_layer_pattern", "sliding_window_size", "swa_num_attention_heads",
    "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim", "add_swa_attention_sink_bias",
    "sparse_attention_config", "dense_intermediate_size",
})

# Fields that change nothing the cost model sees: generation and training settings of PretrainedConfig,
# token ids, norm epsilons, rotary settings (rotary work is costed on the whole head whatever part rotates),
# dropout, router scoring and load-balancing (a softmax or sigmoid over E logits either way), activation
# clamps, logit softcapping (inside the kernels' epilogues), the expert-parallel size used in training.
INERT = frozenset({
    "_name_or_path", "_attn_implementation", "add_cross_attention", "architectures", "auto_map", "bad_words_ids",
    "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
    "eos_token_id", "exponential_decay_length_penalty", "finetuning_task", "forced_bos_token_id",
    "forced_eos_token_id", "id2label", "initializer_range", "is_decoder", "is_encoder_decoder", "label2id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "pad_token_id", "prefix",
    "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
    "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params", "temperature",
    "tf_legacy_loss", "tie_encoder_decoder", "tokenizer_class", "top_k", "top_p", "torchscript",
    "transformers_version", "typical_p", "use_bfloat16", "use_cache", "pretraining_tp", "ignore_index",
    "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
    "rms_norm_eps", "layer_norm_epsilon", "layernorm_epsilon", "layer_norm_eps", "norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "rope_interleave", "partial_rotary_factor", "rotary_dim",
    "initial_context_length", "use_mrope", "floor_scale", "attn_scale", "attn_temperature_tuning",
    "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "router_jitter_noise",
    "n_group", "topk_group", "topk_method", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
    "use_routing_bias", "use_moe_router_bias", "moe_router_scaling_factor", "moe_router_dtype", "ep_size",
    "swiglu_limit", "swiglu_alpha", "final_logit_softcapping", "attn_logit_softcapping", "router_dtype",
    "num_logits_to_keep", "moe_renormalize", "use_grouped_topk", "num_expert_group", "image_token_id",
    "video_token_id", "vision_start_token_id", "vision_end_token_id",
    # DSA: the indexer's rotary layout; GLM-5's q/k head width (= qk_nope_head_dim + qk_rope_head_dim, read there);
    # GLM-5.2: whether the MTP layer reuses the main model's top-k (the MTP module is not modelled either way).
    "indexer_rope_interleave", "qk_head_dim", "index_share_for_mtp_iteration",
    # Qwen3.5: whether the MTP module has embeddings of its own (the MTP module is not modelled either way).
    "mtp_use_dedicated_embeddings",
    # Nemotron-H: the time-step initialisation and clamp (training settings; the clamp is inside the scan kernel),
    # the Mamba kernels switch, initialisation and residual-precision flags, the MTP layers' own pattern (the MTP
    # module is warned of by num_nextn_predict_layers), whether the shared experts overlap the routed ones (a
    # scheduling choice), and the scan's SiLU (an elementwise op like any activation). ``expand`` does not set the
    # width: NemotronHMamba2Mixer.intermediate_size is mamba_num_heads x mamba_head_dim.
    "time_step_min", "time_step_max", "time_step_floor", "time_step_limit", "time_step_rank", "use_mamba_kernels",
    "rescale_prenorm_residual", "residual_in_fp32", "mtp_hybrid_override_pattern", "mtp_layers_block_type",
    "moe_shared_expert_overlap", "mamba_hidden_act", "expand",
    # DeepSeek-V4: the hyper-connections' epsilon, the compressed layers' rotary base, and num_hash_layers: its first
    # layers pick experts by a table of token ids (tid2eid) instead of the top-k of the router's scores, which the
    # router GEMM still computes for the weights (inference/model.py Gate) — the same work either way.
    "hc_eps", "compress_rope_theta", "num_hash_layers",
    # Kimi-K3: SiTU's two scales (the activation is one elementwise op whatever they are) and the router's scoring.
    "activation_situ_beta", "activation_situ_linear_beta", "moe_router_activation_func",
    # Gemma 4: the per-layer-input table's vocabulary, used only with hidden_size_per_layer_input (refused unless
    # 0). MiMo-V2-Flash: a constant scale of the values and its sliding layers' rotary base. MiniMax-M3: RMSNorm
    # weights stored as offsets from 1 (Gemma's norm), the same work.
    "vocab_size_per_layer_input", "attention_value_scale", "swa_rope_theta", "use_gemma_norm",
})

# Fields inert only at the value given (a different value changes the layers in a way not modelled).
INERT_AT = {
    "attention_output_gate": False,
    "output_gate_type": "swish",  # Qwen3.6: the gated norm's gate is SiLU, as Gated DeltaNet's always is
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "use_double_wide_mlp": False,
    "add_full_attention_sink_bias": False,  # MiMo-V2-Flash: sinks in its full layers too
    # Gemma 4: bidirectional attention among a prompt's image tokens only; the text stays causal.
    "use_bidirectional_attention": "vision",
    # Nemotron-H: no biases on the Mamba-2 projections (use_bias, mamba_proj_bias); the convolution has its bias
    # (use_conv_bias, counted by the Mamba-2 operator).
    "use_bias": False,
    "mamba_proj_bias": False,
    "use_conv_bias": True,
}


def refusal(config: dict[str, Any], model_type: str) -> str | None:
    """The feature this config uses that cannot be costed, naming its field and value (None: none)."""
    for field, feature in REFUSED_FIELDS:
        if model_type in READ_BY_TYPE.get(field, ()):
            continue
        if config.get(field) not in (None, [], {}):
            value = config[field]
            shown = value if isinstance(value, (int, float, str)) and len(str(value)) < 40 else type(value).__name__
            return f"{feature}: not modelled (config.json field {field} = {shown})"
    # Gemma 4's small models (E2B, E4B): the last layers reuse an earlier layer's KV cache and every layer adds a
    # per-layer input embedding (transformers' Gemma4TextAttention.is_kv_shared_layer, Gemma4TextModel PLE).
    for field, feature in (("num_kv_shared_layers", "layers that reuse an earlier layer's KV cache"),
                           ("hidden_size_per_layer_input", "per-layer input embeddings")):
        if config.get(field):
            return f"{feature} (Gemma 4 E2B/E4B): not modelled (config.json field {field} = {config[field]}; allowed: 0)"
    types = config.get("attn_type_list")
    if isinstance(types, list) and any(t != 1 for t in types):
        return "linear (lightning) attention layers: not modelled (config.json field attn_type_list has 0s; " \
            "allowed: all 1, full attention)"
    return None


def fields_not_understood(config: dict[str, Any]) -> list[str]:
    """Fields of the decoder's config that are neither read nor known to change nothing (with odd values)."""
    odd = []
    for key, value in config.items():
        if key in READ or key in INERT:
            continue
        if key in INERT_AT and value == INERT_AT[key]:
            continue
        odd.append(key if key not in INERT_AT else f"{key} = {value}")
    return odd
