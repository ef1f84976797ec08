"""Memory: weights and KV cache per GPU, activation workspace, and whether a run fits.

All sizes in bytes. ``kv_bytes_per_token`` is the logical size for the whole model
(2 * layers * kv_heads * head_dim * bytes per element, each layer kind with its own heads and widths:
:meth:`ModelSpec.attention_shape`); per GPU, KV heads are split across
the tensor-parallel group (and replicated when there are fewer KV heads than GPUs).
An MLA model (DeepSeek-V2/V3) caches one latent per token and layer, (kv_lora_rank +
qk_rope_head_dim) * layers * bytes per element, which every GPU of the group holds whole
(heads are split, the latent is not; vLLM and SGLang replicate it under tensor parallelism).

A layer with a sliding window of W keeps at most W tokens of a sequence (the older ones are
never read again, and paged engines free their blocks: vLLM's sliding-window and hybrid KV
cache managers), so a sequence of T tokens holds min(T, W) tokens in such layers
(:func:`kv_bytes_per_sequence`).

Sparse attention (DSA) caches, beside the latent, each token's index key in every layer (FP8 plus scales,
:func:`simulator.model.sparse_linear_operators.indexer_key_bytes`), whole on every GPU like the latent; MiniMax-M3's
block-sparse layers cache one index key per token at the model dtype beside their keys and values, whole on every GPU
too (:func:`simulator.model.sparse_linear_operators.block_index_key_bytes`).
A hybrid model's linear-attention (Gated DeltaNet) layers cache no tokens: KV bytes per token count the
attention layers only, and each sequence holds a fixed state per linear layer whatever its length
(:func:`linear_state_bytes_per_sequence`), split by heads over the tensor-parallel group. A Nemotron-H
model's Mamba-2 layers hold such a state too (the P x N SSM state of each head and the convolution
window, :func:`simulator.model.state_space_operators.mamba2_state_bytes`), counted in the same function
and held in the same state pool.
:func:`kv_bytes_per_sequence` includes that state; the paged cache sets aside a pool of such states
(:func:`simulator.engine.kvcache.kv_capacity`).

DeepSeek-V4's compressed attention caches, per token, one entry per r tokens in each layer of compression ratio r
and one index key per 4 tokens in its CSA layers; each sequence also holds every layer's raw window of the latest W
keys and its compressors' states, a fixed amount counted with the linear-attention state
(:func:`compressed_attention_state_bytes`). All of it is whole on every GPU (one K = V head, as MLA's latent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.compressed_attention_operators import INDEXED_RATIO, compressed_entry_bytes, compressor_state_bytes
from simulator.model.gpu import GPUSpec
from simulator.model.layers import build_operators
from simulator.model.operators import Operator
from simulator.model.parallelism import kv_heads_per_gpu
from simulator.model.precision import Precision
from simulator.model.sparse_linear_operators import (
    block_index_key_bytes,
    gated_delta_state_bytes,
    indexer_key_bytes,
    state_bytes_per_element,
)
from simulator.model.state_space_operators import mamba2_state_bytes

GIB = 2**30

# CUDA context, cuBLAS and NCCL workspaces of a serving process: 0.5-1.5 GiB per GPU as
# nvidia-smi shows for an idle PyTorch/vLLM worker. A named assumption, not a measurement.
RUNTIME_RESERVED_BYTES_PER_GPU = 1 * GIB

# Activation workspace is sized for a prefill chunk of this many tokens (vLLM's default
# max_num_batched_tokens is of this order); a larger prefill runs in chunks of this size.
WORKSPACE_TOKENS = 8192


def _kv_bytes_per_token_per_layer(model: ModelSpec, precision: Precision, kind: Literal["full", "sliding"],
                                  split: int | None) -> float:
    """KV bytes one token adds in one attention layer of ``kind``: the MLA latent, or the keys and values of its KV
    heads (whole, ``split`` None; else those one GPU of ``split`` holds), each head d + d_v wide.

    Keys and values are cached apart even where a layer computes its values from its keys (Gemma 4's K = V global
    layers: transformers and vLLM cache the rotated, normed keys and the normed values as two tensors)."""
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * precision.kv_bytes_per_element
    shape = model.attention_shape(kind)
    heads = shape.kv_heads if split is None else kv_heads_per_gpu(model, split, kind)
    return heads * (shape.head_dim + shape.value_dim) * precision.kv_bytes_per_element


def _index_key_bytes_per_token(model: ModelSpec, precision: Precision) -> float:
    """Index-key bytes one token adds over all layers (whole on every GPU): DSA's FP8 keys, the block-sparse layers'
    at the model dtype."""
    return (model.index_layers * indexer_key_bytes(model.index_head_dim) + model.block_sparse_layers
            * block_index_key_bytes(model.index_head_dim, precision.activation_bytes_per_element))


def _kv_rates(model: ModelSpec, precision: Precision, split: int | None) -> tuple[float, float]:
    """KV bytes one token adds in the layers that hold every token (full and block-sparse attention, index keys
    included) and in the sliding-window layers, which hold at most their window (module docstring)."""
    if model.compress_ratios:
        return _compressed_kv_bytes_per_token(model, precision), 0.0  # DeepSeek-V4: windows are per-sequence state
    sliding = model.sliding_layers
    full = (model.attention_layers - sliding) * _kv_bytes_per_token_per_layer(model, precision, "full", split)
    windowed = sliding * _kv_bytes_per_token_per_layer(model, precision, "sliding", split) if sliding else 0.0
    return full + _index_key_bytes_per_token(model, precision), windowed


def _split(tp: int, dp_attention: bool) -> int:
    """GPUs a token's KV heads are split over: tp, or 1 under attention data parallelism."""
    return 1 if dp_attention else tp


def _compressed_kv_bytes_per_token(model: ModelSpec, precision: Precision) -> float:
    """DeepSeek-V4: bytes of the compressed entries one token adds, all layers: an entry per r tokens in each layer of
    ratio r, and on the CSA layers an index key per 4 tokens. The raw windows and the compressors' states are a fixed
    amount per sequence (:func:`compressed_attention_state_bytes`)."""
    entry = compressed_entry_bytes(model.head_dim, model.qk_rope_head_dim, precision.kv_bytes_per_element)
    entries_per_token = sum(1.0 / ratio for ratio in model.compress_ratios if ratio)
    return entry * entries_per_token + model.index_layers * indexer_key_bytes(model.index_head_dim) / INDEXED_RATIO


def compressed_attention_state_bytes(model: ModelSpec, precision: Precision) -> float:
    """DeepSeek-V4: bytes one sequence keeps whatever its length, whole on every GPU: each layer's raw window of W
    keys, each compressor's state (:func:`simulator.model.compressed_attention_operators.compressor_state_bytes`)
    and each CSA layer's index-key compressor's (0 for other models).

    The window is counted whole, as for a sequence past its first W tokens (a shorter one holds fewer: the
    reference's ``kv_cache`` is W + max_seq_len / r entries per layer, vLLM's SWA cache pages them by token).
    """
    if not model.compress_ratios:
        return 0.0
    entry = compressed_entry_bytes(model.head_dim, model.qk_rope_head_dim, precision.kv_bytes_per_element)
    states = sum(compressor_state_bytes(ratio, model.head_dim) for ratio in model.compress_ratios if ratio)
    index_states = model.index_layers * compressor_state_bytes(INDEXED_RATIO, model.index_head_dim)
    return model.num_layers * model.compress_window * entry + states + index_states


def kv_bytes_per_token(model: ModelSpec, precision: Precision) -> float:
    """KV-cache bytes one token adds, all attention layers, all GPUs (logical, no replication; windows not applied)."""
    return sum(_kv_rates(model, precision, None))


def kv_bytes_per_token_per_gpu(model: ModelSpec, precision: Precision, tp: int, dp_attention: bool = False) -> float:
    """KV-cache bytes one token adds on each GPU of a tensor-parallel group (an MLA latent is held whole).

    Under attention data parallelism a token's whole KV lives on one GPU of the ``tp``: on average
    1/tp of it per GPU (the group's sequences split evenly).
    """
    per_token = sum(_kv_rates(model, precision, _split(tp, dp_attention)))
    return per_token / tp if dp_attention else per_token


def linear_state_bytes_per_sequence(model: ModelSpec, precision: Precision, tp: int | None = None,
                                    dp_attention: bool = False) -> float:
    """Bytes of the fixed state one sequence keeps in the linear-attention (Gated DeltaNet) and Mamba-2 layers (per
    GPU of ``tp``; None: logical), and DeepSeek-V4's raw windows and compressor states.

    Per Gated DeltaNet layer: the d_k x d_v state of each value head at the state dtype, and the convolution window
    (K - 1) x (2 n_k d_k + n_v d_v) at the model dtype. Per Mamba-2 layer: the P x N state of each head at the state
    dtype, and the window (K - 1) x (I + 2 G N) at the model dtype. Heads, groups and channels are split over ``tp``.
    DeepSeek-V4's raw windows and compressor states are such a state too, whole on every GPU
    (:func:`compressed_attention_state_bytes`). Under attention data parallelism a sequence lives on one GPU: on
    average 1/tp of it per GPU.
    """
    state = compressed_attention_state_bytes(model, precision)
    if not (model.linear_layers or model.mamba_layers or state):
        return 0.0
    split = 1 if tp is None or dp_attention else tp
    b_a = precision.activation_bytes_per_element
    if model.linear_layers:
        n_k, n_v = model.linear_key_heads // split, model.linear_value_heads // split
        d_k, d_v = model.linear_key_head_dim, model.linear_value_head_dim
        per_layer = gated_delta_state_bytes(n_v, d_k, d_v, 2 * n_k * d_k + n_v * d_v, model.linear_conv_kernel,
                                            state_bytes_per_element(model.linear_state_dtype, b_a), b_a)
        state += model.linear_layers * per_layer
    if model.mamba_layers:
        heads, groups = model.mamba_heads // split, model.mamba_groups // split
        P, N = model.mamba_head_dim, model.mamba_state_size
        per_layer = mamba2_state_bytes(heads, P, N, heads * P + 2 * groups * N, model.mamba_conv_kernel,
                                       state_bytes_per_element(model.mamba_state_dtype, b_a), b_a)
        state += model.mamba_layers * per_layer
    return state / tp if dp_attention and tp else state


def kv_bytes_per_sequence(model: ModelSpec, precision: Precision, tokens: float, tp: int | None = None,
                          dp_attention: bool = False) -> float:
    """KV-cache bytes of one sequence of ``tokens`` tokens, windows applied (a sliding layer holds min(tokens, W)),
    with its linear-attention state (per GPU of ``tp``; None: logical)."""
    full, sliding = _kv_rates(model, precision, None if tp is None else _split(tp, dp_attention))
    held = full * tokens + (sliding * min(tokens, model.sliding_window) if sliding and model.sliding_window else 0.0)
    if tp is not None and dp_attention:
        held /= tp
    return held + linear_state_bytes_per_sequence(model, precision, tp, dp_attention)


def weight_bytes(operators: tuple[Operator, ...]) -> float:
    """Weight bytes resident on one GPU (scales and biases included)."""
    return float(sum(op.count * op.resident_bytes for op in operators))


def model_weight_bytes(model: ModelSpec, precision: Precision, gpu: GPUSpec) -> float:
    """Weight bytes of the whole model (stored once; tp = 1 layout)."""
    return weight_bytes(build_operators(model, precision, gpu, tp=1))


def workspace_bytes_per_gpu(model: ModelSpec, precision: Precision, tp: int, step_tokens: int, sequences: int) -> float:
    """Activation workspace of the largest step on one GPU.

    Live at once: the residual stream and its normed copy, the QKV output and the attention
    output (~4 H wide), the MLP intermediate (gate and up, 2 F / tp, plus the activated F / tp),
    and fp32 logits for the sequences that emit a token.
    """
    tokens = min(step_tokens, WORKSPACE_TOKENS)
    matrices = 3 if model.gated_mlp else 2
    mlp = matrices * model.ffn_size // tp
    if model.is_moe:
        # Routed rows: k per token, split over the GPUs (by expert under EP, by columns without); plus shared experts.
        routed = model.moe_top_k * model.expert_ffn_size + model.moe_shared_experts * model.shared_expert_ffn_size
        routed_width = matrices * routed // tp
        # Gemma 4 runs its dense MLP beside the experts, both live at once; elsewhere a layer has one or the other.
        mlp = mlp + routed_width if model.moe_parallel_mlp else max(mlp if model.dense_mlp_layers else 0, routed_width)
    # Hyper-connections keep hc_mult copies of the residual stream (one without them).
    streams = (model.hc_mult - 1) * model.hidden_size
    # Attention Residuals (Kimi-K3) keep every block snapshot of every token in flight, whole on each GPU (vLLM's
    # Kimi-K3 model: a block_residual buffer of ceil(L / B) x hidden per token).
    snapshots = -(-(model.attention_residual_offset + model.num_layers) // model.attention_residual_block) \
        if model.attention_residual_block else 0
    activations = tokens * ((4 + snapshots) * model.hidden_size + streams + mlp) * precision.activation_bytes_per_element
    logits = min(sequences, tokens) * (model.vocab_size / tp) * 4.0
    return activations + logits


@dataclass(frozen=True)
class MemoryPlan:
    """Where one GPU's memory goes, and whether it fits. Totals are for all GPUs."""

    tp: int
    hbm_bytes_per_gpu: float
    weights_bytes: float
    weights_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_bytes: float
    kv_bytes_per_gpu: float
    workspace_bytes_per_gpu: float
    reserved_bytes_per_gpu: float
    sequences: int = 0
    """sequences the plan holds at once (the KV cache above is theirs)"""
    context_tokens: int = 0
    """tokens each of those sequences reaches"""
    state_bytes_per_sequence: float = 0.0
    """fixed linear-attention state of one sequence, all GPUs (in ``kv_bytes`` beside its tokens' KV)"""

    @property
    def needed_bytes_per_gpu(self) -> float:
        return self.weights_bytes_per_gpu + self.kv_bytes_per_gpu + self.workspace_bytes_per_gpu + self.reserved_bytes_per_gpu

    @property
    def capacity_bytes(self) -> float:
        return self.hbm_bytes_per_gpu * self.tp

    @property
    def fits(self) -> bool:
        return self.needed_bytes_per_gpu <= self.hbm_bytes_per_gpu

    def shortfall_message(self) -> str:
        return (
            f"needs {self.needed_bytes_per_gpu / GIB:.1f} GiB per GPU "
            f"(weights {self.weights_bytes_per_gpu / GIB:.1f} + KV cache {self.kv_bytes_per_gpu / GIB:.1f} + "
            f"workspace {self.workspace_bytes_per_gpu / GIB:.1f} + runtime {self.reserved_bytes_per_gpu / GIB:.1f}) "
            f"but each GPU has {self.hbm_bytes_per_gpu / GIB:.1f} GiB"
        )


def plan_memory(
    model: ModelSpec,
    precision: Precision,
    gpu: GPUSpec,
    tp: int,
    batch: int,
    context_tokens: int,
    operators: tuple[Operator, ...],
    prefill_tokens: int | None = None,
    dp_attention: bool = False,
) -> MemoryPlan:
    """Memory of ``batch`` sequences of ``context_tokens`` each on ``tp`` GPUs (``operators`` built for that tp).

    Sliding-window layers hold at most their window of each sequence (module docstring).
    """
    per_token = kv_bytes_per_token(model, precision)
    step_tokens = batch * context_tokens if prefill_tokens is None else prefill_tokens
    return MemoryPlan(
        tp=tp,
        hbm_bytes_per_gpu=gpu.hbm_bytes,
        weights_bytes=model_weight_bytes(model, precision, gpu),
        weights_bytes_per_gpu=weight_bytes(operators),
        kv_bytes_per_token=per_token,
        kv_bytes=batch * kv_bytes_per_sequence(model, precision, context_tokens),
        kv_bytes_per_gpu=batch * kv_bytes_per_sequence(model, precision, context_tokens, tp, dp_attention),
        workspace_bytes_per_gpu=workspace_bytes_per_gpu(model, precision, tp, step_tokens, batch),
        reserved_bytes_per_gpu=RUNTIME_RESERVED_BYTES_PER_GPU,
        sequences=batch,
        context_tokens=context_tokens,
        state_bytes_per_sequence=linear_state_bytes_per_sequence(model, precision),
    )


def tensor_parallel_candidates(model: ModelSpec, gpu: GPUSpec, ep: int = 1, dp_attention: bool = False) -> list[int]:
    """Powers of two up to the GPUs in a node that divide the heads, the KV heads and the FFN widths.

    With ``ep`` > 1 the experts are split over the tensor-parallel GPUs, so tp = ep is the only candidate. With
    ``dp_attention`` only degrees of 2 or more (attention data parallelism splits the sequences over the GPUs),
    unless there is none, when the degrees are left for the deployment's checks to refuse.
    """
    candidates = []
    tp = 1
    while tp <= gpu.max_gpus_per_node:
        widths = list(model.dense_mlp_widths)
        if model.is_moe:
            widths.append(model.moe_shared_experts * model.shared_expert_ffn_size)
            if ep == 1:
                widths.append(model.expert_ffn_size)
        # MLA's latent and DeepSeek-V4's one K = V head are held whole on every GPU.
        kv_heads = {model.num_kv_heads, model.attention_shape("sliding").kv_heads}
        kv_ok = (model.is_mla or bool(model.compress_ratios) or all(g % tp == 0 for g in kv_heads)) \
            and model.linear_key_heads % tp == 0 and model.mamba_heads % tp == 0 and model.mamba_groups % tp == 0 \
            and model.o_groups % tp == 0
        fits_widths = all(width % tp == 0 for width in widths)
        if model.num_heads % tp == 0 and kv_ok and fits_widths and (ep == 1 or tp == ep):
            candidates.append(tp)
        tp *= 2
    if dp_attention:
        return [degree for degree in candidates if degree >= 2] or candidates
    return candidates


def no_fit_error(model: ModelSpec, gpu: GPUSpec, plan: MemoryPlan, tried: list[int]) -> InputError:
    return InputError(
        f"{model.name} does not fit on {gpu.name} at any tensor-parallel degree tried "
        f"({', '.join(map(str, tried))}); at tp={plan.tp} it {plan.shortfall_message()}"
    )
