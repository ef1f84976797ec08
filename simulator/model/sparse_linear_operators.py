"""Operators of sparse attention (DSA's indexer) and linear attention (Gated DeltaNet, Kimi Delta Attention), and the
work each does.

Split from :mod:`simulator.model.operators` (which would pass 600 lines with them); that module's
``Operator`` union includes these, and :class:`~simulator.model.operators.LatentAttention` uses
:func:`topk_step` for a DSA layer. The step views of restricted attention live here too (a sliding window:
:func:`windowed_step`; compressed keys: :func:`compressed_step`; selected keys: :func:`topk_step`), shared with
:mod:`simulator.model.compressed_attention_operators` (DeepSeek-V4), whose CSA layers run this ``Indexer`` over
compressed keys. Formulas and sources are collected in docs/time-model.md
("Sparse and linear attention").

**DeepSeek Sparse Attention (DSA)** (DeepSeek-V3.2-Exp technical report, section 2.1; GLM-5): in each
layer a lightning indexer of ``n_i`` heads of width ``d_i`` scores a query against every earlier key,
I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s)), and the MLA attention then runs over the ``index_topk``
keys with the highest scores only. The indexer keeps a key of its own per token and layer, stored
in FP8 with one fp32 scale per 128 elements (vLLM's ``DeepseekV32IndexerCache`` and SGLang's NSA
index-key buffer: ``d_i + d_i / 128 * 4`` bytes), beside the MLA latent; the latent cache still holds
every token. Per query the indexer costs ~2 n_i d_i T FLOPs over T keys (FP8 tensor cores: DeepGEMM's
``fp8_mqa_logits``), and the latent attention runs over min(T, k) keys instead of T.

**Block-sparse attention** (MiniMax-M3's MiniMax Sparse Attention, MSA; ``sparse_attention_config``): in each
'sparse' layer one index head per KV head scores a query against every earlier index key, the score of a block of
``block_size`` keys is the largest of its keys' (score type 'max'), and that KV head's queries attend only the
``topk_blocks`` best blocks, the query's own block always among them. The index keys are one head of ``d_i`` per token
and layer at the model dtype (vLLM's ``MiniMaxM3IndexerCache``; TensorRT-LLM's bf16 ``MiniMaxM3CacheManager`` side
pool), whole on every GPU; the KV cache still holds every token. Per query the selection costs ~2 n_i d_i T FLOPs
over T keys, and the attention runs over min(T, topk_blocks x block_size) keys (TensorRT-LLM
``minimax_m3_kernels``, after SGLang's ``minimax_sparse_ops``).

**Gated DeltaNet** (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025; Qwen3-Next, Qwen3.5):
per value head a state S of d_k x d_v values, updated per token as S <- a S (I - b k k^T) + b v k^T and
read out as o = S q; q and k have their own (fewer) heads, shared by groups of value heads. The state
does not grow with the context; each sequence also keeps the last ``K - 1`` inputs of the short causal
convolution over the q, k, v channels. Both are read and written once per step by every sequence in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from simulator.model.step import Number, Step
from simulator.model.work import Work, active, maximum, minimum

# The index keys are FP8 (1 byte per element) with one fp32 scale (4 bytes) per block of 128 elements
# (vLLM: DeepseekV32IndexerCache, head_dim + head_dim // quant_block_size * 4 bytes; DeepSeek's inference code
# act_quant with block_size 128).
INDEXER_KEY_BYTES_PER_ELEMENT = 1.0
INDEXER_SCALE_BLOCK = 128
INDEXER_SCALE_BYTES = 4.0

# The indexer's scores are fp32 logits written by the scoring kernel and read back by the top-k kernel
# (vLLM: fp8_mqa_logits / fp8_paged_mqa_logits, then top_k), and the selected positions are int32.
INDEXER_LOGIT_BYTES = 4.0
INDEXER_INDEX_BYTES = 4.0

# Gated DeltaNet's chunked prefill runs in chunks of 64 tokens (fla's chunk_gated_delta_rule, BT = 64).
DELTA_CHUNK_TOKENS = 64

# Bytes per element of the recurrent state by the dtype a config names (Qwen3.5: mamba_ssm_dtype float32).
STATE_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


def indexer_key_bytes(head_dim: int) -> float:
    """Bytes of one token's index key in one DSA layer: FP8 elements plus an fp32 scale per 128 of them."""
    return head_dim * INDEXER_KEY_BYTES_PER_ELEMENT + math.ceil(head_dim / INDEXER_SCALE_BLOCK) * INDEXER_SCALE_BYTES


def block_index_key_bytes(head_dim: int, bytes_per_element: float) -> float:
    """Bytes of one token's index key in one block-sparse layer: one head of ``head_dim`` at the model dtype."""
    return head_dim * bytes_per_element


def state_bytes_per_element(dtype: str | None, activation_bytes: float) -> float:
    """Bytes per element of a linear-attention state: the config's state dtype, else the model's (activation) dtype.

    vLLM's ``MambaStateDtypeCalculator``: the temporal state takes ``mamba_ssm_cache_dtype`` where set, else the
    model dtype; the convolution state the model dtype.
    """
    return activation_bytes if dtype is None else STATE_DTYPE_BYTES[dtype]


def gated_delta_state_bytes(value_heads: int, key_head_dim: int, value_head_dim: int, conv_channels: int,
                            conv_kernel: int, state_bytes: float, conv_bytes: float) -> float:
    """Bytes one sequence keeps in one Gated DeltaNet layer: the d_k x d_v state of each value head, and the last
    ``conv_kernel - 1`` inputs of the causal convolution over ``conv_channels`` channels (vLLM's
    ``gated_delta_net_state_shape``: (conv_kernel - 1, conv_dim) and (value heads, d_k, d_v))."""
    return value_heads * key_head_dim * value_head_dim * state_bytes + (conv_kernel - 1) * conv_channels * conv_bytes


def windowed_step(step: Step, window: int) -> Step:
    """``step`` as a layer with a sliding window of ``window`` keys sees it.

    Each query attends at most ``window`` keys, so pairs <= tokens * window; a sequence reads at most
    ``window`` cached keys plus its new tokens, so keys <= sequences * window + prefill tokens.
    Exact when every sequence is past (or within) the window by the same amount, as in a decode
    batch of equal contexts; otherwise an upper bound (a step keeps only sums over its sequences,
    and sum(min(c_i, W)) <= min(sum(c_i), n W)). The naive kernel's score block shrinks with the
    keys (tokens x keys per sequence).
    """
    pairs = minimum(step.attention_pairs, step.tokens * window)
    prefill_pairs = minimum(step.prefill_attention_pairs, step.prefill_tokens * window)
    keys = minimum(step.context_tokens, step.sequences * window + step.prefill_tokens)
    per_sequence = keys / maximum(step.sequences, 1.0)
    scores = minimum(step.score_elements, step.tokens * per_sequence)
    return replace(step, attention_pairs=pairs, prefill_attention_pairs=prefill_pairs, context_tokens=keys,
                   score_elements=scores)


def compressed_step(step: Step, ratio: int) -> Step:
    """``step`` as attention over compressed keys sees it: one key per ``ratio`` tokens (DeepSeek-V4's compressed
    KV entries, :mod:`simulator.model.compressed_attention_operators`).

    A query at position T (T keys dense, itself included) sees the floor(T / ratio) entries of the windows
    that have closed (DeepSeek-V4's inference/model.py, ``get_compress_topk_idxs``: entry w is visible to query t
    when w < (t + 1) // ratio), and a sequence of k tokens holds floor(k / ratio) entries. Taken as T / ratio and
    k / ratio: the sums a step keeps cannot carry the floor, which is at most one entry per query and sequence
    high. The new tokens stay queries: ``tokens``, ``prefill_tokens`` and ``sequences`` are unchanged.
    """
    return replace(step, attention_pairs=step.attention_pairs / ratio,
                   prefill_attention_pairs=step.prefill_attention_pairs / ratio,
                   context_tokens=step.context_tokens / ratio, score_elements=step.score_elements / ratio)


def prefill_keys(step: Step) -> Number:
    """Keys the prefilling sequences of ``step`` read: all keys read less the decoding queries' pairs.

    That difference is exact where each decoding sequence has one query (its pairs are its keys). A speculative
    verification step decodes k + 1 queries per sequence (simulator.cost.speculation.verification_step), whose
    pairs are k + 1 times its keys, so the difference falls short of the prefill's keys and below zero without a
    prefill: it is held between the prefill's new tokens (each reads at least its own key) and the fewer of the
    prefill's pairs and the keys the decoding queries leave (each reads at least itself).
    """
    decode_tokens = step.tokens - step.prefill_tokens
    difference = step.context_tokens - (step.attention_pairs - step.prefill_attention_pairs)
    upper = minimum(step.prefill_attention_pairs, step.context_tokens - decode_tokens)
    return minimum(maximum(difference, step.prefill_tokens), upper)


def topk_step(step: Step, k: int) -> Step:
    """``step`` as the latent attention of a DSA layer sees it: each query attends at most ``k`` selected keys.

    Pairs: a decode token at context T attends min(T, k), so decode pairs <= decode tokens * k, and likewise
    for prefill tokens (exact for equal contexts, else an upper bound, as in ``windowed_step``). Keys read: a decode
    token reads its own selected latents (one per pair); a prefill chunk reads no more of its keys than it has,
    nor more than its selected pairs. Score elements follow the pairs (only the flash-style kernel applies to MLA).
    """
    dense_decode_pairs = step.attention_pairs - step.prefill_attention_pairs
    decode_pairs = minimum(dense_decode_pairs, (step.tokens - step.prefill_tokens) * k)
    prefill_pairs = minimum(step.prefill_attention_pairs, step.prefill_tokens * k)
    keys = minimum(prefill_keys(step), prefill_pairs)
    return replace(step, attention_pairs=decode_pairs + prefill_pairs, prefill_attention_pairs=prefill_pairs,
                   context_tokens=decode_pairs + keys, score_elements=decode_pairs + prefill_pairs)


@dataclass(frozen=True)
class Indexer:
    """DSA's lightning indexer of one layer: scores every (query, earlier key) pair and selects the top ``topk``.

    Its projections (wq_b from the query latent, wk and weights_proj from the hidden state) are GEMMs of their
    own (:mod:`simulator.model.layers`). The indexer is replicated on every GPU of a tensor-parallel group (vLLM's
    ``Indexer``: ReplicatedLinear; its key cache, like the MLA latent, is whole on every GPU).

    Per pair: ``heads`` dot products of ``head_dim`` (2 n_i d_i FLOPs) and the ReLU-weighted sum over the heads
    (2 n_i): 2 n_i (d_i + 1) FLOPs, on FP8 tensor cores (``compute_dtype``). Keys: every key of a sequence read once
    per step at :func:`indexer_key_bytes`, every new token's key written. Activations: the fp32 logits, one per
    pair, written and read back by the top-k kernel, and ``topk`` int32 positions written per query.
    """

    name: str
    count: int
    heads: int
    head_dim: int
    topk: int
    activation_bytes_per_element: float
    compute_dtype: str
    params: int = 0
    resident_bytes: float = 0.0
    data_parallel: int = 1
    """attention data parallelism: this GPU scores 1/data_parallel of the step's sequences"""
    cache_write_kernel: bool = False
    """the new tokens' index keys go into the cache by a kernel of their own (fusion none and kernels)"""
    compress_ratio: int = 1
    """DeepSeek-V4's CSA: the keys scored are compressed entries, one per ``compress_ratio`` tokens
    (:func:`compressed_step`), made and written by the layer's index-key compressor (its ``KVCompressor``), so none
    is written here; 1: one key per token (DSA), written here"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the context and the attention pairs of the step"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    @property
    def key_bytes(self) -> float:
        """Bytes of one token's index key (FP8 plus scales)."""
        return indexer_key_bytes(self.head_dim)

    def work(self, step: Step) -> Work:
        compressed = self.compress_ratio > 1
        if compressed:
            step = compressed_step(step, self.compress_ratio)
        pairs = step.attention_pairs
        n, d = self.heads, self.head_dim
        share = 1.0 / self.data_parallel
        logits = 2.0 * pairs * INDEXER_LOGIT_BYTES
        queries = step.tokens * (n * d * INDEXER_KEY_BYTES_PER_ELEMENT + n * INDEXER_LOGIT_BYTES)  # FP8 q, fp32 weights
        launches = 2.0 * active(step.tokens)  # the scoring kernel and the top-k kernel
        if self.cache_write_kernel and not compressed:
            launches = launches + active(step.tokens)
        return Work(
            flops=2.0 * n * (d + 1) * pairs * share,
            kv_read_bytes=self.key_bytes * step.context_tokens * share,
            kv_write_bytes=0.0 * step.tokens if compressed else self.key_bytes * step.tokens * share,
            activation_bytes=(logits + queries + step.tokens * self.topk * INDEXER_INDEX_BYTES) * share,
            launches=launches,
        )


@dataclass(frozen=True)
class BlockIndexer(Indexer):
    """The block selection of one block-sparse layer (MiniMax-M3): scores every (query, earlier key) pair with each of
    ``heads`` index heads, keeps each block's largest score and selects the best ``topk`` blocks of ``block_size``
    keys per head (the fields it shares with DSA's :class:`Indexer` mean the same, ``topk`` counting blocks).

    Its projections (index_q_proj split by index heads, index_k_proj replicated, TensorRT-LLM ``MiniMaxM3Attention``)
    are GEMMs of their own. Per pair: one dot product of ``head_dim`` per head and a comparison for the block's
    maximum, (2 d_i + 1) n_i FLOPs. Keys: every index key of a sequence read once per step at the model dtype, every
    new token's written. Activations: the index queries read, one fp32 score per (head, query, block) written by the
    scoring kernel and read back by the top-k kernel, and ``topk`` int32 block ids per head and query written
    (TensorRT-LLM ``minimax_m3_kernels``: ``_index_block_score_decode_kernel`` then ``_select_topk_blocks``).
    """

    block_size: int = 1

    @property
    def key_bytes(self) -> float:
        """Bytes of one token's index key (one head at the model dtype)."""
        return block_index_key_bytes(self.head_dim, self.activation_bytes_per_element)

    def work(self, step: Step) -> Work:
        pairs = step.attention_pairs
        n, d, b_a = self.heads, self.head_dim, self.activation_bytes_per_element
        share = 1.0 / self.data_parallel
        scores = 2.0 * n * pairs / self.block_size * INDEXER_LOGIT_BYTES
        queries = step.tokens * n * (d * b_a + self.topk * INDEXER_INDEX_BYTES)
        launches = 2.0 * active(step.tokens)  # the scoring kernel and the top-k kernel
        if self.cache_write_kernel:
            launches = launches + active(step.tokens)
        return Work(
            flops=n * (2.0 * d + 1.0) * pairs * share,
            kv_read_bytes=self.key_bytes * step.context_tokens * share,
            kv_write_bytes=self.key_bytes * step.tokens * share,
            activation_bytes=(scores + queries) * share,
            launches=launches,
        )


@dataclass(frozen=True)
class GatedDeltaNet:
    """The gated delta rule of one linear-attention layer, for the heads on one GPU (projections are GEMMs).

    Per token and value head (q/k heads are shared by groups of value heads):

    - decode (recurrent, fla's ``fused_recurrent_gated_delta_rule``): decay a S (d_k d_v), prediction S k
      (2 d_k d_v), the rank-one correction b (v - S k) k^T (2 d_k d_v), read-out S q (2 d_k d_v): 7 d_k d_v FLOPs.
    - prefill (chunkwise, fla's ``chunk_gated_delta_rule``, chunks of C = 64; Yang et al. 2025, section 3.3):
      within a chunk K K^T and Q K^T (2 C d_k each per token), the WY factors W = T (b K) and U = T (b V)
      (2 C d_k, 2 C d_v) and the masked attention times U - W S (2 C d_v): 2 C (3 d_k + 2 d_v); across chunks
      W S, Q S and the state update K^T (U - W S): 6 d_k d_v. The triangular solve (C^2 / 3 per token) is left out.
      The kernel writes each chunk's state to HBM and reads it back for the outputs (fla's ``chunk_fwd_h`` then
      ``chunk_fwd_o``): 2 d_k d_v activation elements per head per chunk.

    Plus the depthwise causal convolution, 2 K FLOPs per q/k/v channel. Every sequence in the step reads its
    state (and convolution window) once and writes it once, whatever its token count (``state_bytes``, counted
    as KV-cache traffic). Activation traffic per token: the convolution reads and writes the q, k, v channels,
    the recurrence reads them with the decay and the write strength b and writes the output, the gated RMSNorm
    reads the output and its gate z and writes the result: 3 c + n_v (1 + e) + 4 n_v d_v elements (c the
    convolution channels, e = ``decay_channels``).

    **Kimi Delta Attention** (Kimi Linear, arXiv:2510.26692; Kimi-K3) is this recurrence with the decay a
    diagonal of d_k channels per head, S <- (I - b k k^T) Diag(a) S + b k v^T (fla's ``chunk_kda`` /
    ``fused_recurrent_kda``): scaling S by Diag(a) costs what scaling it by a scalar does (d_k d_v per head), so
    the decode FLOPs above hold. The chunked kernel folds the cumulative channel decays into q and k before the same
    K K^T, Q K^T and WY products, and those counts are taken for it too; the extra work its sub-chunks spend on the
    per-channel decays' numerical range (Kimi Linear, section 3) is left out, as is the gate math itself (softplus or
    sigmoid and exp per decay value) and the triangular solve. The decay is e = d_k values per head instead of 1,
    and q and k have one head per value head (n_k = n_v).
    """

    name: str
    count: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_bytes_per_element: float
    activation_bytes_per_element: float
    compute_dtype: str
    params: int
    resident_bytes: float
    chunk_tokens: int = DELTA_CHUNK_TOKENS
    data_parallel: int = 1
    """attention data parallelism: this GPU holds and runs 1/data_parallel of the step's sequences"""
    decay_channels: int = 1
    """decay values per value head and token: 1 (Gated DeltaNet's scalar) or d_k (KDA's per key channel)"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the step's sequences and prefill tokens"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    @property
    def conv_channels(self) -> int:
        """Channels of the short convolution: q and k (key heads x d_k each) and v (value heads x d_v)."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def state_bytes(self) -> float:
        """Bytes one sequence keeps in this layer on this GPU (recurrent state and convolution window)."""
        return gated_delta_state_bytes(self.value_heads, self.key_head_dim, self.value_head_dim, self.conv_channels,
                                       self.conv_kernel, self.state_bytes_per_element,
                                       self.activation_bytes_per_element)

    def work(self, step: Step) -> Work:
        d_k, d_v, n_v, C = self.key_head_dim, self.value_head_dim, self.value_heads, self.chunk_tokens
        b_a = self.activation_bytes_per_element
        prefill = step.prefill_tokens
        decode = step.tokens - prefill
        matrix = d_k * d_v
        flops = (decode * n_v * 7.0 * matrix
                 + prefill * n_v * (6.0 * matrix + 2.0 * C * (3 * d_k + 2 * d_v))
                 + step.tokens * 2.0 * self.conv_kernel * self.conv_channels)
        chunk_states = 2.0 * prefill / C * n_v * matrix * b_a
        per_token = 3 * self.conv_channels + n_v * (1 + self.decay_channels) + 4 * n_v * d_v
        sequences = step.sequences * active(step.tokens)
        share = 1.0 / self.data_parallel
        return Work(
            flops=flops * share,
            kv_read_bytes=sequences * self.state_bytes * share,
            kv_write_bytes=sequences * self.state_bytes * share,
            activation_bytes=(step.tokens * per_token * b_a + chunk_states) * share,
            # decode: convolution update, gated recurrence, gated norm; prefill: the convolution, the gating, fla's
            # six chunk kernels (cumsum, K K^T, triangular solve, W/U, chunk states, outputs) and the gated norm
            launches=3.0 * active(decode) + 9.0 * active(prefill),
        )
