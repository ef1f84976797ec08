"""Operators of DeepSeek-V4's compressed attention and manifold-constrained hyper-connections, and the work each does.

Split from :mod:`simulator.model.operators` (which would pass 600 lines with them), as
:mod:`simulator.model.sparse_linear_operators` is; that module's ``Operator`` union includes these. Formulas and
sources are collected in docs/time-model.md ("Compressed attention (DeepSeek-V4)"). Sources: the DeepSeek-V4
technical report (DeepSeek_V4.pdf in the deepseek-ai/DeepSeek-V4-Pro repository: section 2.2 mHC, 2.3.1 CSA, 2.3.2
HCA), the reference implementation in the checkpoint repository (inference/model.py: ``Compressor``, ``Indexer``,
``Attention``, ``Block.hc_pre``/``hc_post``), transformers' ``modeling_deepseek_v4.py``, and vLLM's
``deepseek_v4_attention.py``, ``deepseek_compressor.py`` and ``deepseek_v4.py``.

**Attention.** Every layer projects one key that is also its value (K = V, one head of ``head_dim`` d, shared by all
n query heads: MQA) and keeps the last W = ``sliding_window`` of them raw. A layer with a compression ratio r > 0
also pools every r consecutive tokens into one compressed entry of the same width (a softmax-gated sum of their
projections; with r = 4 the windows overlap, each entry pooling 2r tokens), so its cache grows by 1/r entry per
token. A query at position T attends

- ratio 0 (window only): min(T, W) raw keys;
- ratio 4, compressed sparse attention (CSA): min(T, W) raw keys and the ``index_topk`` k compressed entries a
  lightning indexer picks among the floor(T / 4) visible ones, min(T / 4, k);
- ratio 128, heavily compressed attention (HCA): min(T, W) raw keys and all floor(T / 128) compressed entries.

Per (query, key) pair and head: scores over d and the weighted sum over d (the value is the key): 4 d FLOPs, plus
the softmax. The kernel is FlashMLA's sparse one (vLLM: ``flash_mla_with_kvcache`` for decode,
``flash_mla_sparse_fwd`` for prefill), which runs 64 or 128 query heads whatever a GPU holds: vLLM pads the query
heads to 64 (or 128) with zeros, so a GPU holding 8 heads (64 heads over tensor parallelism 8) does the work of 64
(``padding_flops``).

**Cache entries.** vLLM runs DeepSeek-V4 with an FP8 cache only (``fp8_ds_mla``): an entry holds the d - d_r
non-rotary values in FP8, the d_r rotary ones in bf16, one scale byte per 64 FP8 values and a pad byte
(``head_bytes``: 448 + 128 + 7 + 1 = 584 bytes for d = 512, d_r = 64). With a 16-bit KV dtype an entry is d values
at that width (the reference's bf16 ``kv_cache``). The indexer's compressed keys are DSA's FP8 index keys
(d_i + 4 bytes). Each compressor keeps a state per sequence: the projections and gate scores of the tokens whose
window has not closed, coff r tokens of 2 coff d fp32 values (coff = 2 with overlapping windows, else 1; the
reference's ``kv_state`` and ``score_state``, vLLM's ``CompressorStateCache``).

**Hyper-connections** (mHC; Xie et al. 2026, report section 2.2): the residual stream is N = ``hc_mult`` copies of
the hidden state. Before each block (attention, MoE) the N H values of a token are RMS-normed and projected by a
(2 + N) N x N H fp32 matrix to the ``pre`` (N), ``post`` (N) and ``comb`` (N x N) weights, ``comb`` made doubly
stochastic by ``hc_sinkhorn_iters`` Sinkhorn-Knopp iterations; ``pre`` collapses the streams to the block's input.
After the block, ``post`` spreads its output over the streams and ``comb`` mixes the old streams in. vLLM runs the
post of one block and the pre of the next as one kernel (``mhc_fused_post_pre``), which is how a site is costed
here; the embedding's copy into N streams takes the place of the first post, and the last post is fused with the
final collapse (``hc_head``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from simulator.model.sparse_linear_operators import compressed_step, topk_step, windowed_step
from simulator.model.step import Number, Step
from simulator.model.work import (
    NORM_FLOPS_PER_ELEMENT,
    ROTARY_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_SCORE,
    Work,
    active,
)

# The compression ratio whose layers have the lightning indexer and overlapping windows (DeepSeek-V4's
# inference/model.py: ``self.indexer = Indexer(...) if compress_ratio == 4``, ``Compressor.overlap = compress_ratio
# == 4``; vLLM: "Only C4A uses sparse attention and hence has indexer").
INDEXED_RATIO = 4
COMPRESS_RATIOS = (0, INDEXED_RATIO, 128)
"""ratios DeepSeek-V4's reference code and vLLM build (0: window only; 4: CSA; 128: HCA)"""

# vLLM's fp8_ds_mla entry (DeepseekV4MultiHeadLatentAttentionWrapper.head_bytes): FP8 non-rotary values with one
# ue8m0 scale byte per 64 of them, bf16 rotary values, one pad byte.
FP8_ENTRY_SCALE_BLOCK = 64
FP8_ENTRY_ROPE_BYTES_PER_ELEMENT = 2.0
FP8_ENTRY_PAD_BYTES = 1.0

# The compressors' states and their absolute-position biases (ape) are fp32 (reference: ``kv_state``,
# ``score_state`` and ``ape`` dtype float32; vLLM's CompressorStateCache asserts float32); so are the
# hyper-connection matrices (``hc_attn_fn`` etc. dtype float32 in both).
FP32_BYTES = 4.0


def overlap_factor(ratio: int) -> int:
    """coff: 2 where the compression windows overlap (each entry pools 2 r tokens, ratio 4), else 1."""
    return 2 if ratio == INDEXED_RATIO else 1


def compressed_entry_bytes(head_dim: int, rope_dim: int, kv_bytes: float) -> float:
    """Bytes of one cached key (raw or compressed): vLLM's fp8_ds_mla layout for a 1-byte KV dtype, else d values."""
    if kv_bytes >= 2:
        return head_dim * kv_bytes
    nope = head_dim - rope_dim
    return nope * kv_bytes + rope_dim * FP8_ENTRY_ROPE_BYTES_PER_ELEMENT + math.ceil(nope / FP8_ENTRY_SCALE_BLOCK) \
        + FP8_ENTRY_PAD_BYTES


def compressor_state_bytes(ratio: int, head_dim: int) -> float:
    """Bytes one sequence keeps in one compressor: coff r tokens x (kv and score) x coff d fp32 values."""
    coff = overlap_factor(ratio)
    return coff * ratio * 2 * coff * head_dim * FP32_BYTES


def padded_query_heads(heads: int) -> int:
    """Query heads FlashMLA's sparse kernels run for ``heads`` real ones: 64 or 128 (vLLM pads with zero heads;
    DeepseekV4MLAAttention.padded_heads), and a multiple of 64 beyond, which vLLM does not run."""
    return 64 * max(1, math.ceil(heads / 64))


@dataclass(frozen=True)
class CompressedAttention:
    """DeepSeek-V4 attention of one kind of layer (ratio 0, 4 or 128) over its raw window and compressed entries.

    Keys attended (module docstring): the window (``windowed_step``), and with ``compress_ratio`` r > 0 the
    compressed entries (``compressed_step``), capped at ``topk`` selected ones where the indexer selects
    (``topk_step``; 0: all). FLOPs per pair and real head 4 d plus the softmax; the zero heads FlashMLA is padded
    with are ``padding_flops``. Cache reads: a decode query reads its window and selected entries once each for all
    heads (one K = V head); a prefill chunk's entries are read once by vLLM's gather
    (``dequantize_and_gather_k_cache``), which writes them to a bf16 workspace that the sparse kernel reads: two
    activation passes over the chunk's keys. The sparse kernel's per-query re-reads of the workspace (one row per
    selected key) are taken to hit L2, as FlashMLA's compute-bound sparse prefill implies. The new token's raw key
    is written once (vLLM fuses it with the query's norm and rotary: ``fused_deepseek_v4_qnorm_rope_kv_insert``).
    Activations: q read and the output written, n d each per token.
    """

    name: str
    count: int
    q_heads: int
    padded_heads: int
    head_dim: int
    window: int
    compress_ratio: int
    topk: int
    entry_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    params: int = 0
    """the attention sinks, one logit per head (reference ``attn_sink``)"""
    resident_bytes: float = 0.0
    data_parallel: int = 1
    """attention data parallelism: this GPU holds and attends 1/data_parallel of the step's sequences, all heads"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the context and attention pairs of the step"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def attended(self, step: Step) -> tuple[Number, Number, Number]:
        """(pairs, prefill pairs, keys read) over the window and the compressed entries of one layer."""
        window = windowed_step(step, self.window)
        pairs, prefill_pairs, keys = window.attention_pairs, window.prefill_attention_pairs, window.context_tokens
        if self.compress_ratio:
            compressed = compressed_step(step, self.compress_ratio)
            if self.topk:
                compressed = topk_step(compressed, self.topk)
            pairs = pairs + compressed.attention_pairs
            prefill_pairs = prefill_pairs + compressed.prefill_attention_pairs
            keys = keys + compressed.context_tokens
        return pairs, prefill_pairs, keys

    def work(self, step: Step) -> Work:
        n, d, b_a = self.q_heads, self.head_dim, self.activation_bytes_per_element
        pairs, prefill_pairs, keys = self.attended(step)
        # A decode query's keys are its pairs (one read each); the rest of the keys belong to prefill chunks.
        prefill_keys = keys - (pairs - prefill_pairs)
        flops = (4.0 * d + SOFTMAX_FLOPS_PER_SCORE) * n * pairs
        share = 1.0 / self.data_parallel
        decode, prefill = step.tokens - step.prefill_tokens, step.prefill_tokens
        # decode: one sparse kernel; prefill: the gather of the window (and of the compressed entries), the merge of
        # the selected and window positions, and the sparse kernel
        launches = active(decode) + (3.0 + (1.0 if self.compress_ratio else 0.0)) * active(prefill)
        return Work(
            flops=flops * share,
            kv_read_bytes=self.entry_bytes * keys * share,
            kv_write_bytes=self.entry_bytes * step.tokens * share,
            activation_bytes=(2.0 * step.tokens * n * d + 2.0 * prefill_keys * d) * b_a * share,
            launches=launches,
            padding_flops=flops * (self.padded_heads - n) / n * share,
        )


@dataclass(frozen=True)
class KVCompressor:
    """One layer's compressor (DeepSeek-V4's ``Compressor``): pools every ``ratio`` tokens into one cached entry.

    Its projection (wkv and wgate, hidden -> 2 coff d, fp32 out) is a GEMM of its own. Per token this kernel adds
    the absolute-position bias to the coff d gate scores and stores the coff d projections and scores in the
    sequence's fp32 state; per closed window (1/ratio of the tokens) it reads the coff ratio slots of d projections
    and scores, takes a softmax over them and the weighted sum (7 FLOPs per value), RMS-norms and rotates the d
    values and writes the entry to the cache at ``entry_bytes`` (vLLM: ``_save_partial_states_kernel``, then
    ``_fused_kv_compress_norm_rope_insert_*``). The state traffic is counted with the KV cache's (it is paged with
    it, vLLM's ``CompressorStateCache``).
    """

    name: str
    count: int
    ratio: int
    head_dim: int
    rope_dim: int
    entry_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    params: int
    resident_bytes: float
    data_parallel: int = 1
    """attention data parallelism: this GPU compresses 1/data_parallel of the step's sequences"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        coff, d = overlap_factor(self.ratio), self.head_dim
        tokens = self.tokens(step)
        entries = tokens / self.ratio
        share = 1.0 / self.data_parallel
        state = 2.0 * coff * d * FP32_BYTES  # one token's projections and scores
        flops = tokens * coff * d * (1.0 + SOFTMAX_FLOPS_PER_SCORE + 2.0) + entries * (NORM_FLOPS_PER_ELEMENT * d
                                                                              + ROTARY_FLOPS_PER_ELEMENT * self.rope_dim)
        return Work(
            flops=flops * share,
            # every token's state is written once and read once when its window closes (each half of an
            # overlapping window's slot by one entry)
            kv_read_bytes=tokens * state * share,
            kv_write_bytes=(tokens * state + entries * self.entry_bytes) * share,
            activation_bytes=tokens * state * share,  # the projection's fp32 output
            launches=2.0 * active(tokens),
        )


@dataclass(frozen=True)
class HyperConnection:
    """One hyper-connection site per layer block (module docstring), for ``streams`` N copies of width H.

    Per token: the post of the previous block, N H (2 N + 2) FLOPs (post x output, comb^T x streams, the add), and
    the pre of this one: the RMS norm over N H values, the projection to ``mixes`` M weights (2 N H M), the
    Sinkhorn iterations on the N x N ``comb`` (4 N^2 per iteration, the softmax 5 N^2 first) and the collapse
    (2 N H). Traffic per token: the block's output (H) and the N streams read, the new streams (N H) and the next
    block's input (H) written; ``final`` (the head's collapse after the last block): no streams written, sigmoid
    weights only (M = N, no Sinkhorn). The fp32 projection matrix is read once per step. Replicated on every GPU.
    """

    name: str
    count: int
    streams: int
    width: int
    mixes: int
    sinkhorn_iters: int
    activation_bytes_per_element: float
    compute_dtype: str
    params: int
    resident_bytes: float
    final: bool = False
    kind: str = "elementwise"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        N, H, M = self.streams, self.width, self.mixes
        tokens = self.tokens(step)
        post = N * H * (2.0 * N + 2.0)
        pre = NORM_FLOPS_PER_ELEMENT * N * H + 2.0 * N * H * M + 2.0 * N * H
        sinkhorn = 0.0 if self.final else (4.0 * self.sinkhorn_iters + SOFTMAX_FLOPS_PER_SCORE) * N * N
        written = H if self.final else (N + 1) * H
        return Work(
            flops=tokens * (post + pre + sinkhorn),
            weight_bytes=M * N * H * FP32_BYTES * active(tokens),
            activation_bytes=tokens * ((N + 1) * H + written) * self.activation_bytes_per_element,
            launches=active(tokens),
        )
