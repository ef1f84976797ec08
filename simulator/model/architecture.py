"""Model architecture specs: our YAML files and HuggingFace ``config.json`` files.

Why this module is over 600 lines: ModelSpec is one pydantic model whose fields (each with its bound and meaning)
and cross-field checks describe every layer layout the cost model reads (attention of each kind and shape, windows,
MLA and DSA, DeepSeek-V4's compressed attention, block-sparse attention, Gated DeltaNet and KDA layers, Mamba-2
blocks, per-layer MLP widths, experts, hyper-connections, attention residuals), and the per-layer properties that read
those fields belong beside them: one concept, kept in one place.

A ``config.json`` is read from a local path only; nothing is ever fetched from a hub.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from simulator.errors import InputError
from simulator.files import is_file, is_folder
from simulator.model.hf_config import MAX_LAYERS, from_hf_config
from simulator.model.loader import (
    load_validated,
    looks_like_path,
    read_mapping,
    suggest,
    validate,
)
from simulator.model.precision import parse_precision
from simulator.model.registry import config_files, find_named

# Upper bounds on a model's sizes: far above any published model, low enough that a unit slip
# (a context in bytes, a width of 1e12) is caught and products of them (weights = layers x
# width^2, KV bytes = layers x heads x head_dim x context) stay far inside float64's range. Largest published
# values: 126 layers (Llama-3.1-405B), hidden 16384 / FFN 53248 (405B), 128 heads, vocab
# 256k (Gemma), context 10M tokens (Llama 4 Scout), 256 routed experts (DeepSeek-V3).
# MAX_LAYERS (4096) is hf_config's: it checks it before building any per-layer list from a config.json.
MAX_WIDTH = 2**20
MAX_HEADS = 2**14
MAX_VOCAB = 2**24
MAX_CONTEXT = 2**27
MAX_EXPERTS = 2**16


class AttentionShape(NamedTuple):
    """The widths of one kind of attention layer (:meth:`ModelSpec.attention_shape`), element counts."""

    kv_heads: int
    head_dim: int
    """width of each query and key head"""
    value_dim: int
    """width of each value head (and of each head's output)"""
    k_eq_v: bool
    """no v_proj: the values are k_proj's output, normed apart (Gemma 4's attention_k_eq_v)"""


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are element counts; ``max_context`` is in tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_as_a_count(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for an int field; in a config a flag where a size belongs is a mistake.
        if isinstance(value, bool) and info.field_name is not None:
            if cls.model_fields[info.field_name].annotation in (int, int | None):
                raise ValueError("expected a whole number, not a true/false flag")
        return value

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    hf_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="the Hugging Face repository of the checkpoint (owner/name), for launch commands; None: none known",
    )
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    num_kv_heads: int = Field(default=0, ge=0, le=MAX_HEADS, description="0 means = num_heads (MHA)")
    head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="0 means hidden_size // num_heads")
    ffn_size: int = Field(ge=1, le=MAX_WIDTH)
    ffn_sizes: list[int] = Field(
        default_factory=list,
        description="per layer, its dense MLP's width, 0 for none (DeciLM's NAS-pruned blocks: ffn_mult, ffn no_op); "
        "ffn_size is then the widest; empty: every dense MLP is ffn_size wide",
    )
    gated_mlp: bool = Field(default=True, description="SwiGLU (3 matrices) vs ungated (2)")
    activation: Literal["silu", "gelu", "relu", "situ"] = Field(
        default="silu", description="'situ': Kimi-K3's SiTU, beta tanh(g / beta) sigmoid(g) x up (an elementwise op "
        "like SiLU's; its MLP is gated)",
    )
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    max_context: int = Field(ge=1, le=MAX_CONTEXT)
    tied_embeddings: bool = False
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=1, le=4, description="1 (Falcon), 2, or 4 (Gemma 2/3: pre- and post-norms)")
    linear_bias: bool = False
    position_embedding: Literal["rotary", "learned", "alibi", "none"] = Field(
        default="rotary", description="'none': no positional encoding in attention (Nemotron-H: NoPE, the SSM layers "
        "carry position)",
    )
    learned_position_rows: int = Field(default=0, ge=0, le=MAX_CONTEXT + 2, description="0 means max_context")
    parallel_attention: bool = Field(default=False, description="attention and MLP read one norm (Falcon)")
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    layer_types: list[Literal["full", "sliding", "linear", "none", "sparse"]] = Field(
        default_factory=list,
        description="per layer; empty: every layer 'sliding' when sliding_window is set (Mistral v0.1), else 'full'; "
        "'linear': a Gated DeltaNet layer (linear_* fields) instead of attention; 'none': no token mixer, the layer is "
        "its MLP alone (DeciLM's attention no_op); 'sparse': full-shaped attention over the key blocks its index heads "
        "select (MiniMax-M3's sparse attention: block_sparse_* fields)",
    )
    sliding_window_pattern: int = Field(
        default=0, ge=0, le=MAX_LAYERS,
        description="instead of layer_types: layer i (from 0) is full when (i + 1) % pattern == 0, else sliding "
        "(Gemma 2: 2, Gemma 3: 6)",
    )
    sliding_kv_heads: int = Field(
        default=0, ge=0, le=MAX_HEADS, description="KV heads of the sliding-window layers where they differ from the "
        "full layers' num_kv_heads (MiMo-V2-Flash: 8 beside 4; Gemma 4 26B-A4B: 8 beside 2); 0: num_kv_heads",
    )
    sliding_head_dim: int = Field(
        default=0, ge=0, le=MAX_WIDTH, description="query/key/value head width of the sliding-window layers where it "
        "differs from the full layers' head_dim (Gemma 4: 256 beside its global layers' 512); 0: head_dim",
    )
    full_layers_k_eq_v: bool = Field(
        default=False, description="the full-attention layers have no v_proj: their values are k_proj's output "
        "normed without rotary (Gemma 4's attention_k_eq_v); the cache still holds keys and values apart",
    )
    v_norm: bool = Field(default=False, description="a weightless RMSNorm on every value head (Gemma 4's v_norm)")
    attention_sinks: bool = Field(default=False, description="a learned sink logit per head (gpt-oss)")
    sliding_attention_sinks: bool = Field(
        default=False, description="a learned sink logit per head in the sliding-window layers only (MiMo-V2-Flash's "
        "add_swa_attention_sink_bias)",
    )
    qk_norm: bool = Field(default=False, description="per-head RMSNorm on q and k (Qwen3, Gemma 3)")
    query_pre_attn_scalar: float | None = Field(default=None, gt=0, description="score scale 1/sqrt(this) (Gemma); no cost")
    moe_experts: int = Field(default=1, ge=1, le=MAX_EXPERTS, description="routed experts E; 1 means a dense model")
    moe_top_k: int = Field(default=1, ge=1, le=MAX_EXPERTS, description="routed experts per token k")
    moe_ffn_size: int = Field(default=0, ge=0, le=MAX_WIDTH, description="FFN width of one routed expert; 0 means ffn_size")
    moe_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS, description="shared experts every token uses")
    moe_shared_ffn_size: int = Field(
        default=0, ge=0, le=MAX_WIDTH, description="FFN width of one shared expert; 0 means the routed expert's"
    )
    moe_first_dense_layers: int = Field(
        default=0, ge=0, le=MAX_LAYERS, description="leading layers with a dense MLP of ffn_size (first_k_dense_replace)"
    )
    moe_layer_step: int = Field(
        default=1, ge=1, le=MAX_LAYERS, description="after those, layer i (from 0) is MoE when (i + 1) % step == 0"
    )
    moe_dense_layer_indices: list[int] = Field(
        default_factory=list, description="further layers with a dense MLP (Qwen's mlp_only_layers)"
    )
    kv_lora_rank: int = Field(default=0, ge=0, le=MAX_WIDTH, description="MLA latent KV width; 0: not MLA")
    q_lora_rank: int = Field(default=0, ge=0, le=MAX_WIDTH, description="MLA query compression width; 0: none")
    qk_rope_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="MLA rotary part of q/k per head")
    qk_nope_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="MLA non-rotary part of q/k per head")
    v_head_dim: int = Field(
        default=0, ge=0, le=MAX_WIDTH, description="value width per head: MLA's, or outside MLA where it is narrower "
        "than the keys' head_dim (MiMo-V2-Flash: 128 beside 192); 0 outside MLA: head_dim",
    )
    index_topk: int = Field(
        default=0, ge=0, le=MAX_CONTEXT,
        description="DSA (DeepSeek-V3.2, GLM-5): keys each query attends, chosen by an indexer; 0: dense attention",
    )
    index_heads: int = Field(default=0, ge=0, le=MAX_HEADS,
                             description="indexer heads n_i: DSA's, or the index heads of block-sparse layers")
    index_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="indexer head width d_i (and its key's)")
    indexer_types: list[Literal["full", "shared"]] = Field(
        default_factory=list,
        description="DSA per layer (GLM-5.2's indexer_types): 'full' runs an indexer of its own (its weights, index-key "
        "cache and scoring), 'shared' reuses the top-k of the nearest earlier 'full' layer and attends those keys; "
        "empty: every attention layer 'full'",
    )
    block_sparse_topk_blocks: int = Field(
        default=0, ge=0, le=MAX_CONTEXT, description="'sparse' layers: key blocks each query attends, the local one "
        "included (MiniMax-M3's sparse_topk_blocks: 16); 0: no block-sparse layers",
    )
    block_sparse_block_size: int = Field(
        default=0, ge=0, le=MAX_CONTEXT, description="'sparse' layers: tokens per key block (MiniMax-M3's "
        "sparse_block_size: 128)",
    )
    linear_key_heads: int = Field(default=0, ge=0, le=MAX_HEADS, description="Gated DeltaNet q/k heads")
    linear_value_heads: int = Field(default=0, ge=0, le=MAX_HEADS, description="Gated DeltaNet value heads")
    linear_key_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="Gated DeltaNet q/k head width d_k")
    linear_value_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="Gated DeltaNet value head width d_v")
    linear_conv_kernel: int = Field(default=0, ge=0, le=1024, description="Gated DeltaNet short convolution width K")
    linear_state_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="dtype of the Gated DeltaNet state (Qwen3.5's mamba_ssm_dtype); None: the model's"
    )
    linear_kind: Literal["gated_deltanet", "kda"] = Field(
        default="gated_deltanet",
        description="the 'linear' layers' recurrence: 'gated_deltanet' (one decay per value head; Qwen3.5) or 'kda' "
        "(Kimi Delta Attention: one decay per key channel through a rank-d_k projection, q/k/v each convolved; "
        "Kimi Linear, Kimi-K3)",
    )
    linear_gate_rank: int = Field(
        default=0, ge=0, le=MAX_WIDTH,
        description="KDA's output gate through a rank-r bottleneck (Kimi Linear: g_a_proj, g_b_proj with r = head "
        "dim); 0: one full-rank projection (Kimi-K3: use_full_rank_gate)",
    )
    attention_output_gate: bool = Field(
        default=False, description="a sigmoid gate of the attention output: q_proj yields it (Qwen3-Next, Qwen3.5) or, "
        "with MLA, a g_proj of its own (Kimi-K3: mla_use_output_gate)"
    )
    attention_residual_block: int = Field(
        default=0, ge=0, le=MAX_LAYERS,
        description="Attention Residuals (Kimi-K3's attn_res_block_size): before each mixer, each FFN and the final "
        "norm a softmax over the block snapshots taken every this many layers and the running sum replaces the plain "
        "residual input; 0: none",
    )
    attention_residual_offset: int = Field(
        default=0, ge=0, le=MAX_LAYERS,
        description="layers of the whole model before this one's first (a pipeline stage of an Attention Residuals "
        "model: its block boundaries count from the whole model's layer 0)",
    )
    block_pattern: str = Field(
        default="", pattern=r"^[M*\-E]*$",
        description="Nemotron-H's hybrid_override_pattern, one character per layer; each layer is then one block of "
        "one mixer or one FFN: 'M' a Mamba-2 mixer (mamba_* fields), '*' attention, '-' a dense MLP, 'E' MoE; empty: "
        "every layer is attention then an MLP (or MoE)",
    )
    mamba_heads: int = Field(default=0, ge=0, le=MAX_HEADS, description="Mamba-2 heads (mamba_num_heads)")
    mamba_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH, description="Mamba-2 head width P (mamba_head_dim)")
    mamba_state_size: int = Field(default=0, ge=0, le=MAX_WIDTH, description="Mamba-2 state width N (ssm_state_size)")
    mamba_groups: int = Field(default=0, ge=0, le=MAX_HEADS, description="Mamba-2 B/C groups G (n_groups)")
    mamba_conv_kernel: int = Field(default=0, ge=0, le=1024, description="Mamba-2 causal convolution width K")
    mamba_chunk_size: int = Field(
        default=256, ge=1, le=MAX_CONTEXT, description="tokens per chunk of the SSD prefill scan (chunk_size; "
        "state-spaces/mamba Mamba2's default 256)",
    )
    mamba_state_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="dtype of the Mamba-2 SSM state (mamba_ssm_cache_dtype); None: the model's"
    )
    moe_parallel_mlp: bool = Field(
        default=False, description="each MoE layer also runs the dense MLP of ffn_size beside its experts, on the same "
        "input, each branch normed apart (Gemma 4's enable_moe_block)",
    )
    moe_latent_size: int = Field(
        default=0, ge=0, le=MAX_WIDTH,
        description="routed experts work in a latent of this width, projected from and back to hidden_size "
        "(Nemotron-3 Super/Ultra: fc1_latent_proj, fc2_latent_proj); 0: the experts read the hidden state",
    )
    compress_ratios: list[Literal[0, 4, 128]] = Field(
        default_factory=list,
        description="DeepSeek-V4, one per layer: tokens pooled into one compressed KV entry; 0: the layer attends its "
        "raw window only, 4: compressed sparse attention (CSA: the lightning indexer picks index_topk entries), 128: "
        "heavily compressed attention (HCA: all entries); empty: not DeepSeek-V4's attention",
    )
    compress_window: int = Field(
        default=0, ge=0, le=MAX_CONTEXT,
        description="DeepSeek-V4: the latest tokens every layer keeps and attends uncompressed (its sliding_window)",
    )
    o_groups: int = Field(
        default=0, ge=0, le=MAX_HEADS,
        description="DeepSeek-V4's grouped output projection: groups of heads, each projected to o_lora_rank; 0: none",
    )
    o_lora_rank: int = Field(default=0, ge=0, le=MAX_WIDTH, description="DeepSeek-V4: each output group's width")
    hc_mult: int = Field(
        default=1, ge=1, le=64,
        description="manifold-constrained hyper-connections (DeepSeek-V4's mHC): copies of the residual stream; 1: a "
        "plain residual",
    )
    hc_sinkhorn_iters: int = Field(
        default=0, ge=0, le=1000, description="Sinkhorn-Knopp iterations making each hyper-connection's mixing matrix "
        "doubly stochastic",
    )
    moe_latent_norm: bool = Field(
        default=False, description="an RMSNorm on the experts' combined latent before it is projected back "
        "(Kimi-K3: latent_moe_use_norm, routed_expert_norm)",
    )
    shared_expert_module: Literal["experts", "mlp"] = Field(
        default="experts",
        description="the precision module whose weight format the shared experts take: 'experts' (as the routed "
        "ones), or 'mlp' where the checkpoint stores them like the dense MLP (Kimi-K2.5: int4 routed, bf16 shared)",
    )
    default_weights: str | None = Field(
        default=None, description="the checkpoint's weight formats as --weights text (from quantization_config)"
    )
    quantization: str = Field(default="", description="the checkpoint's quantization method, for the report")
    warnings: list[str] = Field(
        default_factory=list, description="architecture keys of the source config that are not modelled"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.kv_lora_rank and self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
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
        self._check_layouts()
        return self

    def _check_layouts(self) -> None:
        if self.norms_per_layer == 3:
            raise ValueError("norms_per_layer must be 1, 2 or 4")
        if self.kv_lora_rank:
            if not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
                raise ValueError("an MLA model (kv_lora_rank > 0) needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        elif self.compress_ratios:
            self._check_compressed_attention()
        elif self.q_lora_rank or self.qk_rope_head_dim or self.qk_nope_head_dim:
            raise ValueError("q_lora_rank / qk_*_head_dim describe MLA: give kv_lora_rank too")
        elif self.compress_window or self.o_groups or self.o_lora_rank:
            raise ValueError("compress_window / o_groups / o_lora_rank describe DeepSeek-V4's attention: give "
                             "compress_ratios too")
        if self.hc_mult > 1 and (self.parallel_attention or self.block_pattern or self.norms_per_layer != 2):
            raise ValueError("hyper-connections (hc_mult > 1) are modelled around one attention and one MLP block per "
                             "layer with a norm before each: no parallel_attention, block_pattern or norms_per_layer "
                             f"{self.norms_per_layer}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        if self.layer_types and self.sliding_window_pattern:
            raise ValueError("give layer_types or sliding_window_pattern, not both")
        if (self.sliding_window_pattern or "sliding" in self.layer_types) and self.sliding_window is None:
            raise ValueError("sliding layers need sliding_window")
        if (self.sliding_kv_heads or self.sliding_head_dim or self.sliding_attention_sinks) and \
                self.sliding_window is None:
            raise ValueError("sliding_kv_heads / sliding_head_dim / sliding_attention_sinks describe sliding-window "
                             "layers: give sliding_window too")
        if self.sliding_kv_heads and self.num_heads % self.sliding_kv_heads:
            raise ValueError(f"sliding_kv_heads {self.sliding_kv_heads} must divide num_heads {self.num_heads}")
        if self.is_mla and (self.sliding_kv_heads or self.sliding_head_dim or self.full_layers_k_eq_v or self.v_norm):
            raise ValueError("sliding_kv_heads / sliding_head_dim / full_layers_k_eq_v / v_norm describe attention "
                             "heads, which an MLA model (kv_lora_rank) does not cache")
        if self.sliding_head_dim and self.v_head_dim:
            raise ValueError("sliding_head_dim with v_head_dim: values narrower than keys in layers of two widths are "
                             "not modelled")
        if self.moe_parallel_mlp and not self.is_moe:
            raise ValueError("moe_parallel_mlp runs the dense MLP beside the experts: give moe_experts > 1")
        self._check_block_sparse()
        if self.moe_experts == 1:
            moe_keys = (self.moe_ffn_size, self.moe_shared_experts, self.moe_first_dense_layers,
                        self.moe_dense_layer_indices, self.moe_layer_step != 1, self.moe_top_k != 1,
                        self.moe_latent_size, self.moe_latent_norm)
            if any(moe_keys):
                raise ValueError("moe_* fields describe a mixture of experts: give moe_experts > 1")
        if self.index_topk and not ((self.kv_lora_rank or self.compress_ratios) and self.index_heads
                                    and self.index_head_dim):
            raise ValueError("sparse attention (index_topk) is modelled on MLA or DeepSeek-V4's compressed attention: "
                             "give kv_lora_rank or compress_ratios, and index_heads and index_head_dim")
        if self.indexer_types and not self.index_topk:
            raise ValueError("indexer_types describe DSA's indexers: give index_topk too")
        if self.indexer_types and len(self.indexer_types) != self.num_layers:
            raise ValueError(f"indexer_types has {len(self.indexer_types)} entries for {self.num_layers} layers")
        linear = (self.linear_key_heads, self.linear_value_heads, self.linear_key_head_dim, self.linear_value_head_dim,
                  self.linear_conv_kernel)
        if "linear" in self.layer_types and not all(linear):
            raise ValueError("'linear' layers need linear_key_heads, linear_value_heads, linear_key_head_dim, "
                             "linear_value_head_dim and linear_conv_kernel")
        if any(linear) and "linear" not in self.layer_types:
            raise ValueError("linear_* fields describe Gated DeltaNet layers: mark them 'linear' in layer_types")
        if self.linear_kind == "kda" and self.linear_key_heads != self.linear_value_heads:
            raise ValueError("KDA layers have one q/k head per value head: linear_key_heads must equal "
                             "linear_value_heads")
        if self.linear_gate_rank and self.linear_kind != "kda":
            raise ValueError("linear_gate_rank is KDA's low-rank output gate: give linear_kind 'kda'")
        if self.moe_latent_norm and not self.moe_latent_size:
            raise ValueError("moe_latent_norm normalises the experts' latent: give moe_latent_size")
        if self.attention_residual_offset and not self.attention_residual_block:
            raise ValueError("attention_residual_offset places a stage among Attention Residuals blocks: give "
                             "attention_residual_block")
        if not self.block_pattern and self.attention_layers == 0:
            raise ValueError("every layer is 'linear' or 'none': a model needs at least one attention layer")
        self._check_ffn_sizes()
        if self.linear_value_heads % max(self.linear_key_heads, 1):
            raise ValueError(f"linear_key_heads {self.linear_key_heads} must divide linear_value_heads "
                             f"{self.linear_value_heads}")
        self._check_blocks()
        bad = [i for i in self.moe_dense_layer_indices if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"moe_dense_layer_indices {bad} outside layers 0..{self.num_layers - 1}")
        if self.default_weights is not None:
            try:
                parse_precision(self.default_weights, "fp16")
            except InputError as exc:
                raise ValueError(f"default_weights: {exc}") from None

    def _check_compressed_attention(self) -> None:
        """DeepSeek-V4's attention: one K = V head of head_dim with a rotary part, a query latent, grouped outputs."""
        if len(self.compress_ratios) != self.num_layers:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries for {self.num_layers} layers")
        needed = {"q_lora_rank": self.q_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim,
                  "compress_window (a config.json's sliding_window)": self.compress_window, "o_groups": self.o_groups,
                  "o_lora_rank": self.o_lora_rank}
        if 4 in self.compress_ratios:
            needed.update(index_topk=self.index_topk, index_heads=self.index_heads, index_head_dim=self.index_head_dim)
        missing = [name for name, value in needed.items() if not value]
        if missing:
            raise ValueError(f"compress_ratios (DeepSeek-V4's compressed attention) needs {', '.join(missing)}")
        if self.num_kv_heads != 1:
            raise ValueError(f"compress_ratios: DeepSeek-V4's attention has one key-value head (got num_kv_heads "
                             f"{self.num_kv_heads})")
        if self.num_heads % self.o_groups:
            raise ValueError(f"o_groups {self.o_groups} must divide num_heads {self.num_heads}")
        if self.qk_rope_head_dim > self.head_dim:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim} exceeds head_dim {self.head_dim}")
        if self.index_topk and 4 not in self.compress_ratios:
            raise ValueError("index_topk: DeepSeek-V4's indexer runs on the ratio-4 layers, and compress_ratios has none")
        if self.sliding_window is not None or self.layer_types or self.sliding_window_pattern or self.block_pattern:
            raise ValueError("compress_ratios: DeepSeek-V4's layers keep their own window (compress_window); no "
                             "sliding_window, layer_types, sliding_window_pattern or block_pattern")

    def _check_ffn_sizes(self) -> None:
        if not self.ffn_sizes:
            return
        if len(self.ffn_sizes) != self.num_layers:
            raise ValueError(f"ffn_sizes has {len(self.ffn_sizes)} entries for {self.num_layers} layers")
        if any(not 0 <= width <= MAX_WIDTH for width in self.ffn_sizes):
            raise ValueError(f"ffn_sizes: each width must be in [0, {MAX_WIDTH}] (0: no MLP in that layer)")
        if max(self.ffn_sizes) not in (0, self.ffn_size):
            raise ValueError(f"ffn_size {self.ffn_size} must be the widest of ffn_sizes ({max(self.ffn_sizes)})")
        if self.is_moe or self.block_pattern or self.parallel_attention:
            raise ValueError("ffn_sizes (per-layer MLP widths) are modelled for dense, sequential layers only: no "
                             "moe_experts, block_pattern or parallel_attention")

    def _check_block_sparse(self) -> None:
        """'sparse' layers (MiniMax-M3) need their block fields and index heads, one per full layer's KV head."""
        fields = (self.block_sparse_topk_blocks, self.block_sparse_block_size)
        if "sparse" not in self.layer_types:
            if any(fields):
                raise ValueError("block_sparse_* fields describe block-sparse attention: mark its layers 'sparse' in "
                                 "layer_types")
            return
        if not (all(fields) and self.index_heads and self.index_head_dim):
            raise ValueError("'sparse' layers need block_sparse_topk_blocks, block_sparse_block_size, index_heads and "
                             "index_head_dim")
        if self.is_mla or self.index_topk:
            raise ValueError("'sparse' layers are block-sparse GQA attention: not with MLA or DSA (index_topk)")
        if self.index_heads != self.num_kv_heads:
            # MiniMax-M3's kernels select blocks per KV head, one index head each (TensorRT-LLM minimax_m3_kernels).
            raise ValueError(f"index_heads {self.index_heads} must equal num_kv_heads {self.num_kv_heads}: each KV "
                             "head attends the blocks its own index head selects")

    def _check_blocks(self) -> None:
        mamba = (self.mamba_heads, self.mamba_head_dim, self.mamba_state_size, self.mamba_groups, self.mamba_conv_kernel)
        pattern = self.block_pattern
        if not pattern:
            if any(mamba):
                raise ValueError("mamba_* fields describe Mamba-2 layers: mark them 'M' in block_pattern")
            return
        if len(pattern) != self.num_layers:
            raise ValueError(f"block_pattern has {len(pattern)} characters for {self.num_layers} layers")
        if self.layer_types or self.sliding_window_pattern or self.sliding_window is not None or self.is_mla:
            raise ValueError("block_pattern (Nemotron-H blocks) is modelled with full GQA attention only: no "
                             "layer_types, sliding window or MLA")
        if "*" not in pattern:
            raise ValueError("block_pattern has no attention layer ('*'): a model needs at least one")
        if "M" in pattern and not all(mamba):
            raise ValueError("'M' layers need mamba_heads, mamba_head_dim, mamba_state_size, mamba_groups and "
                             "mamba_conv_kernel")
        if "E" in pattern and not self.is_moe:
            raise ValueError("'E' layers are MoE: give moe_experts > 1")
        if self.mamba_heads % max(self.mamba_groups, 1):
            raise ValueError(f"mamba_groups {self.mamba_groups} must divide mamba_heads {self.mamba_heads}")
        if self.moe_first_dense_layers or self.moe_layer_step != 1 or self.moe_dense_layer_indices:
            raise ValueError("with block_pattern the MoE layers are its 'E' characters: no moe_first_dense_layers, "
                             "moe_layer_step or moe_dense_layer_indices")

    @property
    def is_moe(self) -> bool:
        return self.moe_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one latent per token and layer."""
        return self.kv_lora_rank > 0

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet (linear-attention) layers: a fixed state per sequence, no KV cache."""
        return self.layer_types.count("linear")

    @property
    def mamba_layers(self) -> int:
        """Mamba-2 mixer layers ('M' in block_pattern): a fixed state per sequence, no KV cache."""
        return self.block_pattern.count("M")

    @property
    def mamba_inner_size(self) -> int:
        """Mamba-2's inner width I = heads x head width (NemotronHMamba2Mixer.intermediate_size)."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_channels(self) -> int:
        """Channels of Mamba-2's causal convolution, over x, B and C: I + 2 G N (Mamba2.conv_dim)."""
        return self.mamba_inner_size + 2 * self.mamba_groups * self.mamba_state_size

    @property
    def attention_layers(self) -> int:
        """Layers with (full, sliding or latent) attention and a KV cache: all but the linear and mixer-less ones
        (with a block_pattern: its '*' layers)."""
        if self.block_pattern:
            return self.block_pattern.count("*")
        return self.num_layers - self.linear_layers - self.layer_types.count("none")

    @property
    def mixer_layers(self) -> int:
        """Layers with a token mixer (attention, linear attention or Mamba-2), each behind a norm and a residual add:
        every layer but the 'none' ones, or with a block_pattern its '*' and 'M' blocks."""
        if self.block_pattern:
            return self.attention_layers + self.mamba_layers
        return self.num_layers - self.layer_types.count("none")

    @property
    def ffn_layers(self) -> int:
        """Layers with an MLP or MoE, each behind a norm and a residual add: every layer (with ffn_sizes, those of
        width > 0), or with a block_pattern its '-' and 'E' blocks."""
        if self.block_pattern:
            return self.block_pattern.count("-") + self.block_pattern.count("E")
        if self.ffn_sizes:
            return sum(width > 0 for width in self.ffn_sizes)
        return self.num_layers

    @property
    def dense_mlp_layers(self) -> int:
        """Layers with a dense MLP (of ``ffn_size``, or of their own ``ffn_sizes`` width): those without experts, or
        every one with moe_parallel_mlp."""
        return self.ffn_layers if self.moe_parallel_mlp else self.ffn_layers - self.moe_layers

    @property
    def dense_mlp_widths(self) -> dict[int, int]:
        """Dense MLP width -> layers with an MLP that wide, widest first (one entry unless ffn_sizes differ)."""
        if not self.ffn_sizes:
            return {self.ffn_size: self.dense_mlp_layers} if self.dense_mlp_layers else {}
        counts: dict[int, int] = {}
        for width in sorted((w for w in self.ffn_sizes if w), reverse=True):
            counts[width] = counts.get(width, 0) + 1
        return counts

    @property
    def index_layers(self) -> int:
        """Layers with a DSA indexer (and its key cache): every attention layer of a sparse-attention model, or those
        of them that ``indexer_types`` marks 'full' (the 'shared' ones reuse an earlier layer's top-k); with
        DeepSeek-V4's compressed attention, its ratio-4 (CSA) layers."""
        if self.compress_ratios:
            return self.compress_ratio_layers(4)
        if not self.index_topk:
            return 0
        if not self.indexer_types:
            return self.attention_layers
        return sum(kind == "full" and self.layer_kind(i) != "linear" for i, kind in enumerate(self.indexer_types))

    def compress_ratio_layers(self, ratio: int) -> int:
        """DeepSeek-V4: layers whose compression ratio is ``ratio`` (0: window only)."""
        return sum(r == ratio for r in self.compress_ratios)

    @property
    def block_sparse_layers(self) -> int:
        """Layers of block-sparse attention ('sparse' in layer_types), each with its index heads and index-key cache."""
        return self.layer_types.count("sparse")

    @property
    def block_sparse_keys(self) -> int:
        """Keys a query of a 'sparse' layer attends at most: its selected blocks times the block size."""
        return self.block_sparse_topk_blocks * self.block_sparse_block_size

    def layer_kind(self, index: int) -> Literal["full", "sliding", "linear", "none", "sparse"]:
        """What layer ``index`` (from 0) is: 'linear' (Gated DeltaNet), 'none' (no mixer), 'sparse' (block-sparse),
        'sliding' (a window) or 'full'."""
        if self.layer_types and self.layer_types[index] in ("linear", "none", "sparse"):
            return self.layer_types[index]
        return "full" if self.layer_window(index) is None else "sliding"

    def attention_shape(self, kind: Literal["full", "sliding"]) -> AttentionShape:
        """KV heads, head widths and K = V of the full-attention layers ('sparse' ones are shaped so) or the
        sliding-window layers: the one place the per-kind overrides (sliding_*, full_layers_k_eq_v) are read."""
        if kind == "sliding":
            head_dim = self.sliding_head_dim or self.head_dim
            value_dim = head_dim if self.sliding_head_dim else self.value_head_dim
            return AttentionShape(self.sliding_kv_heads or self.num_kv_heads, head_dim, value_dim, False)
        return AttentionShape(self.num_kv_heads, self.head_dim, self.value_head_dim, self.full_layers_k_eq_v)

    @property
    def value_head_dim(self) -> int:
        """Width of a value head of a full-attention layer: v_head_dim (MLA's, or MiMo-V2-Flash's), else head_dim."""
        return self.v_head_dim or self.head_dim

    @property
    def per_kind_attention(self) -> bool:
        """Do the sliding-window layers have widths or sinks of their own (sliding_*), or the full layers K = V?"""
        return bool(self.sliding_kv_heads or self.sliding_head_dim or self.sliding_attention_sinks
                    or self.full_layers_k_eq_v)

    @property
    def expert_ffn_size(self) -> int:
        """FFN width of one routed expert."""
        return self.moe_ffn_size or self.ffn_size

    @property
    def shared_expert_ffn_size(self) -> int:
        """FFN width of one shared expert."""
        return self.moe_shared_ffn_size or self.expert_ffn_size

    def layer_is_moe(self, index: int) -> bool:
        """Layer ``index`` (from 0) has routed experts (see the moe_* fields; with a block_pattern its 'E' layers)."""
        if self.block_pattern:
            return self.is_moe and self.block_pattern[index] == "E"
        if not self.is_moe or index < self.moe_first_dense_layers or index in self.moe_dense_layer_indices:
            return False
        return (index + 1) % self.moe_layer_step == 0

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (the rest have a dense MLP of ``ffn_size``)."""
        return sum(self.layer_is_moe(i) for i in range(self.num_layers))

    def layer_window(self, index: int) -> int | None:
        """Keys layer ``index`` attends at most: the sliding window, or None (the whole context)."""
        if self.sliding_window is None:
            return None
        if self.layer_types:
            return self.sliding_window if self.layer_types[index] == "sliding" else None
        if self.sliding_window_pattern:
            return None if (index + 1) % self.sliding_window_pattern == 0 else self.sliding_window
        return self.sliding_window

    @property
    def sliding_layers(self) -> int:
        """Layers with a sliding window."""
        return sum(self.layer_window(i) is not None for i in range(self.num_layers))

    def describe_architecture(self) -> str:
        """One line: attention kind, windows, experts (for `simulate models` and the run report)."""
        parts = [self.attention_kind]
        if self.is_mla:
            parts[0] = f"MLA (latent {self.kv_lora_rank} + rope {self.qk_rope_head_dim})"
        if self.compress_ratios:
            parts[0] = self._describe_compressed_attention()
        elif self.index_topk:
            shared = "" if self.index_layers == self.attention_layers else \
                f" on {self.index_layers} of {self.attention_layers} layers, the rest reusing their top-k"
            parts.append(f"DSA top-{self.index_topk} (indexer {self.index_heads} x {self.index_head_dim}{shared})")
        if self.hc_mult > 1:
            parts.append(f"hyper-connections x{self.hc_mult}")
        if self.v_head_dim and not self.is_mla:
            parts[0] += f" (head {self.head_dim}, values {self.v_head_dim})"
        if self.block_sparse_layers:
            parts.append(f"block-sparse attention on {self.block_sparse_layers} of {self.num_layers} layers (top "
                         f"{self.block_sparse_topk_blocks} blocks of {self.block_sparse_block_size}, index "
                         f"{self.index_heads} x {self.index_head_dim})")
        if self.linear_layers:
            kind = "Kimi Delta Attention" if self.linear_kind == "kda" else "Gated DeltaNet"
            parts.append(f"{kind} on {self.linear_layers} of {self.num_layers} layers")
        if self.block_pattern or "none" in self.layer_types:
            parts[0] += f" on {self.attention_layers} of {self.num_layers} layers"
        if self.block_pattern:
            parts.append(f"Mamba-2 on {self.mamba_layers} (state {self.mamba_state_size}, {self.mamba_heads} heads "
                         f"x {self.mamba_head_dim})")
            if self.dense_mlp_layers:
                parts.append(f"MLP on {self.dense_mlp_layers}")
        if len(self.dense_mlp_widths) > 1:
            widths = self.dense_mlp_widths
            parts.append(f"MLP {min(widths)} to {max(widths)} wide on {self.dense_mlp_layers} of {self.num_layers} "
                         "layers")
        if self.sliding_window is not None and self.sliding_layers:
            share = "all layers" if self.sliding_layers == self.num_layers else \
                f"{self.sliding_layers} of {self.num_layers} layers"
            parts.append(f"sliding window {self.sliding_window} on {share}")
            sliding = self.attention_shape("sliding")
            if sliding[:2] != (self.num_kv_heads, self.head_dim):
                parts.append(f"sliding layers {sliding.kv_heads} KV heads x {sliding.head_dim}")
        if self.full_layers_k_eq_v:
            parts.append("full layers K = V (no v_proj)")
        if self.attention_sinks or self.sliding_attention_sinks:
            parts.append("attention sinks" + ("" if self.attention_sinks else " (sliding layers)"))
        if self.attention_residual_block:
            parts.append(f"attention residuals over blocks of {self.attention_residual_block} layers")
        if self.is_moe:
            shared = f" + {self.moe_shared_experts} shared" if self.moe_shared_experts else ""
            layers = "" if self.moe_layers == self.num_layers else f" on {self.moe_layers} of {self.num_layers} layers"
            latent = f" in a {self.moe_latent_size} latent" if self.moe_latent_size else ""
            beside = f" beside a dense MLP of {self.ffn_size}" if self.moe_parallel_mlp else ""
            parts.append(f"MoE {self.moe_experts} experts top-{self.moe_top_k}{shared}{latent}{beside}{layers}")
        if self.quantization:
            parts.append(f"checkpoint {self.quantization}")
        return ", ".join(parts)

    def _describe_compressed_attention(self) -> str:
        kinds = []
        csa, hca, window = (self.compress_ratio_layers(r) for r in (4, 128, 0))
        if csa:
            kinds.append(f"CSA 1/4 top-{self.index_topk} (indexer {self.index_heads} x {self.index_head_dim}) on {csa}")
        if hca:
            kinds.append(f"HCA 1/128 on {hca}")
        if window:
            kinds.append(f"window only on {window}")
        return (f"compressed MQA ({self.head_dim}-wide K = V, window {self.compress_window}; {', '.join(kinds)} of "
                f"{self.num_layers} layers)")

    @property
    def attention_kind(self) -> str:
        """'MLA', 'MHA', 'MQA' or 'GQA-g'."""
        if self.is_mla:
            return "MLA"
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
    if spec.is_mla:
        raise InputError(f"--attention: {spec.name} uses multi-head latent attention (MLA); its KV cache is a "
                         "latent, not heads, so it has no MHA/MQA/GQA variant")
    if spec.compress_ratios:
        raise InputError(f"--attention: {spec.name} uses DeepSeek-V4's compressed attention, whose one key-value head "
                         "is also compressed over tokens; it has no MHA/MQA/GQA variant")
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
    if kv_heads == spec.num_kv_heads and not spec.sliding_kv_heads:
        return spec
    # The variant gives every layer, sliding ones too, the same KV heads; block-sparse layers keep one index head per
    # KV head (each KV head attends the blocks its own index head selects).
    update: dict[str, Any] = {"num_kv_heads": kv_heads, "sliding_kv_heads": 0, "name": f"{spec.name} ({text})"}
    if spec.block_sparse_layers:
        update["index_heads"] = kv_heads
    return spec.model_copy(update=update)


def with_full_attention(spec: ModelSpec) -> ModelSpec:
    """``spec`` attending (and caching) the whole context in every layer: as an engine that ignores its sliding window runs it."""
    if spec.sliding_window is None:
        return spec
    name = f"{spec.name} (full attention)"
    if spec.per_kind_attention:
        # The sliding layers keep their own widths: a window as long as the longest context is no window.
        return spec.model_copy(update={"sliding_window": spec.max_context, "name": name})
    other = any(kind in ("linear", "sparse", "none") for kind in spec.layer_types)  # kinds that stay what they are
    layer_types = ["full" if kind == "sliding" else kind for kind in spec.layer_types] if other else []
    return spec.model_copy(update={"sliding_window": None, "layer_types": layer_types, "sliding_window_pattern": 0,
                                   "name": name})


def _model_files() -> list[Path]:
    return config_files("models")


def list_models() -> list[ModelSpec]:
    """Every model config: $MEMWALL_CONFIG_DIR's first, then the shipped ones (registry.config_files)."""
    return [_load_model_config(path) for path in _model_files()]


def _load_model_config(path: Path) -> ModelSpec:
    return load_validated(ModelSpec, path)


def load_model_file(path: Path) -> ModelSpec:
    """Our model YAML, a HuggingFace config.json (recognised by its field names), or a model folder holding one."""
    if is_folder(path, "--model"):
        if not is_file(path / "config.json", "--model"):
            raise InputError(f"--model: folder {path} has no config.json (a model folder needs its HuggingFace config)")
        path = path / "config.json"
    data, non_finite = _read_config(path)
    if "num_layers" not in data and ("num_hidden_layers" in data or "n_layer" in data or "model_type" in data
                                     or "text_config" in data):
        # A folder's config.json is named after its folder; a loose file after itself.
        fallback = path.parent.name if path.name == "config.json" else path.stem
        name = data.get("_name_or_path") or fallback or path.stem
        try:
            data = from_hf_config(data, str(name))
        except InputError as exc:
            read_as = (f" ({', '.join(non_finite)} in the file: NaN or Infinity, read as missing)" if non_finite
                       else "")
            if str(exc).startswith(f"{fallback}:"):
                raise InputError(f"{exc}{read_as}") from None
            raise InputError(f"{path}: {exc}{read_as}") from None  # name the file, not only the model's own name
        except (TypeError, ValueError, AttributeError, ArithmeticError) as exc:
            # The mapping does arithmetic on the file's fields; a field of the wrong type lands here.
            raise InputError(f"{path}: a config.json field has a value of the wrong type or range ({exc})") from None
    return validate(ModelSpec, data, str(path), plausible=True)


def _read_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """A model file's mapping, and the top-level keys whose values were NaN or Infinity; a HuggingFace config.json
    with a ModelOpt ``hf_quant_config.json`` beside it gets that file's ``quantization`` as its
    ``quantization_config`` (NVIDIA's quantised checkpoints keep it there).

    Python's json module writes a non-finite float as ``Infinity`` (Nemotron-H's ``time_step_limit``), which
    strict JSON refuses; such a config.json is read with those values as None (no field the cost model reads
    is ever infinite, so nothing is lost and the file gets its real answer, not a parse error), and the keys
    are named where the file is then refused.
    """
    non_finite: list[str] = []
    try:
        data = read_mapping(path)
    except InputError as exc:
        if path.suffix.lower() != ".json" or not any(word in str(exc) for word in ("Infinity", "NaN")):
            raise
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text, parse_constant=lambda _: None)
            loose = json.loads(text)  # Python's reader takes NaN and Infinity as floats: which keys held them
        except (OSError, ValueError):
            raise exc from None
        if not isinstance(data, dict):
            raise exc from None
        non_finite = [key for key, value in loose.items() if isinstance(value, float) and not math.isfinite(value)]
    sibling = _quant_config_path(path)
    if sibling is not None and "quantization_config" not in data and isinstance(data.get("model_type"), str):
        quant = read_mapping(sibling)
        section = quant.get("quantization")
        if isinstance(section, dict):
            data = {**data, "quantization_config": {"producer": quant.get("producer") or {"name": "modelopt"},
                                                    "quant_method": "modelopt", **section}}
    return data, non_finite


def _quant_config_path(path: Path) -> Path | None:
    """``hf_quant_config.json`` beside ``config.json``, or ``X_hf_quant_config.json`` beside ``X_config.json``."""
    if path.name == "config.json":
        candidate = path.with_name("hf_quant_config.json")
    elif path.name.endswith("_config.json") and not path.name.endswith("hf_quant_config.json"):
        candidate = path.with_name(path.name.removesuffix("config.json") + "hf_quant_config.json")
    else:
        return None
    return candidate if is_file(candidate, "--model") else None


def _names_a_folder(name: str) -> bool:
    """A bare name (no separator, no config suffix) is a model folder only when one is there; a name the
    file system refuses (over 255 bytes) is none, so it gets the "unknown model" answer with the known names."""
    try:
        return is_folder(name, "--model")
    except InputError:
        return False


def load_model(name_or_path: str) -> ModelSpec:
    """A shipped model by name or alias (case-insensitive), or a YAML / config.json / model folder by path."""
    if looks_like_path(name_or_path) or _names_a_folder(name_or_path):
        return load_model_file(Path(name_or_path))
    found = find_named("models", name_or_path, _load_model_config, lambda model: [model.name, *model.aliases])
    if found is not None:
        return found
    known = [n for model in list_models() for n in (model.name, *model.aliases)]
    raise InputError(
        f"--model: unknown model '{name_or_path}'{suggest(name_or_path, known)}; "
        f"known: {', '.join(m.name for m in list_models())} (or a path to a YAML, a config.json or a model folder)"
    )
