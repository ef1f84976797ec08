"""Layer specs: the operators of one forward pass, with weight shapes per GPU.

``build_operators`` turns a ModelSpec + Precision + tensor-parallel degree into a tuple of
operators. Each operator knows *what it does* for a :class:`~simulator.model.step.Step`
(``work``: FLOPs and bytes by kind); :mod:`simulator.cost.step_cost` alone turns that into seconds.

Tensor parallelism follows Megatron-LM: QKV and gate/up projections are split by columns,
output and down projections by rows, heads are split across GPUs, the LM head and the
embedding are split by vocabulary, norms are replicated. When the model has fewer KV heads
than GPUs, each GPU keeps one KV head (replicated), as vLLM does.

Activation traffic is counted per producer/consumer edge: a tensor that goes through HBM
costs its producer a write and its consumer a read; a tensor kept on chip costs neither.

Fusion levels (``fusion``; kernels and activation elements per token per layer for a
LLaMA layer at tp = 1 are worked out in docs/readme-effects.md):
- ``none``: every norm, rotary embedding, activation and residual add is its own kernel that
  reads and writes activations in HBM and pays a kernel launch, and so is the write of the new
  tokens' K/V into the cache (12 kernels per LLaMA layer with flash attention, 14 with naive).
- ``kernels``: the PyTorch engines' own elementwise kernels (vLLM, SGLang, TGI: their
  ``fused_add_rms_norm``, ``rotary_embedding`` and ``silu_and_mul`` CUDA ops, or the Triton
  kernels torch.compile makes of the same code in vLLM V1): each norm, rotary embedding and
  activation is a kernel of its own, and each residual add runs inside the next norm's kernel
  (which reads the residual and writes the updated one: 2H more elements per add) or rides on
  the all-reduce. cuBLAS GEMMs take no epilogue of theirs, so gate/up writes 2F wide. The new
  tokens' K and V go into the paged cache by a kernel of their own before attention reads it
  (vLLM's ``reshape_and_cache(_flash)``, TGI's ``reshape_and_cache``, SGLang's
  ``set_kv_buffer``; its bytes are the attention operator's ``kv_write_bytes``, only the
  launch is the kernel's own): 10 kernels per LLaMA layer with flash attention.
- ``elementwise``: those chains run in the neighbouring GEMM's prologue/epilogue (5 kernels; the
  cache write rides with rotary in the QKV epilogue, as TensorRT-LLM's attention preprocessing does):
  a norm folds into the next GEMM (its per-row 1/rms scales the GEMM's output rows), rotary
  into the QKV epilogue, SiLU(gate) * up into the gate/up epilogue (which then writes F
  wide instead of 2F), and a residual add into the epilogue of the GEMM before it (which
  still reads the H-wide residual; charged to the fused add so GEMM intensities stay the
  textbook ones). Their FLOPs remain; the rest of their traffic and their launches vanish.
  With tp > 1 the add rides on the all-reduce (as TensorRT-LLM fuses them); same bytes.
  Per token per layer this saves 8H + 2(n+g)d + 4F activation elements (LLaMA, tp = 1).
- ``full``: as ``elementwise``, and the attention block (QKV projection, attention, output
  projection) is one fused kernel: q and the attention output never reach HBM, k and v
  go straight into the KV cache. An idealised limit (as a megakernel would), and it needs
  ``flash`` attention: a naive kernel materialises the scores, so it cannot be fused.

Attention kernels (``attention_kernel``):
- ``naive``: three kernels (QK^T, softmax, PV); the score matrix S and the probabilities P
  (one element per query, key and head, the full p x k block) are written to HBM and read
  back: 4 n p k activation elements. Softmax is its own kernel whatever ``fusion`` says.
- ``flash``: one kernel; scores stay in SRAM. Queries are processed in row tiles of ``B_r``
  rows, and K/V are streamed once per row tile, so prefill K/V traffic is
  ~ (pairs / B_r) * 2*g*d*b_kv, on top of one read of every key. The tile rule is
  FlashAttention's (Dao et al. 2022, Algorithm 1): with M the shared memory per SM in
  elements of the activation dtype, B_c = ceil(M / (4 d)) and B_r = min(B_c, d), so tiles
  shrink when the head dimension grows or SRAM is small, giving HBM traffic
  Theta(T^2 d^2 / M) per KV head (= the paper's n T^2 d^2 / M for MHA) while B_r < d.
  The heads of a GQA group share one K/V stream (GQA-packed kernels such as FlashInfer
  and FlashAttention-3). Those per-tile re-reads are the paper's count for the L2-less
  case: the row tiles of one head run at the same time and find each other's K/V in L2
  while it holds the K/V of the heads being worked on (``Attention.l2_reuse``), so a
  prefill whose keys fit reads each key once from HBM and is compute-bound, as measured
  for FlashAttention-2/3. The operators are built without it (the paper's upper bound);
  the shape-aware time model gives them the GPU's L2 size and SM count
  (simulator/cost/system.py).
- ``per-head``: ``flash`` for prefill; decode by a masked multi-head attention kernel with one
  thread block per (query head, sequence) that does not group the query heads sharing a K/V head
  (TensorRT-LLM's masked MHA, ``mmha_launch_kernel_ex``: grid (num_heads, batch_size); the docs'
  "vanilla implementation that uses a single CUDA thread-block per head", gpt-attention.md).
  Each of the n/g query heads of a GQA group loads the group's K/V, converts it (FP8 or INT8 to
  FP16/FP32) and runs its dot products on the CUDA cores by itself, so the K/V work of a decode
  step is n/g times a grouped kernel's. Charged as n/g passes over the step's K/V at the memory
  rate: a roofline stand-in for work the sources time but do not break down (the repeated loads
  mostly hit L2, next to each other in the grid; the conversions and CUDA-core math do not). XQA,
  the grouped kernel of TensorRT-LLM 0.8, "reducing data loading and conversion", gives "2.4x more
  Llama-70B throughput" on one H200 at 128/2048 (TensorRT-LLM blog, January 2024).
- Decode (one query row per sequence) reads the KV cache once with ``flash`` and ``naive``: the
  heads of a GQA group share one K/V stream.

Weight-only quantisation (int8/int4 weights, fp16 compute): every weight is dequantised
once per ``dequant_tile_tokens`` row tile, ``dequant_ops_per_weight`` integer/vector
operations each (simulator/model/precision.py). That work is ``Work.dequant_ops``, kept
apart from the model's FLOPs: :mod:`simulator.cost.step_cost` charges it to the CUDA cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, NamedTuple

import numpy as np

from simulator.errors import InputError
from simulator.model.architecture import ModelSpec
from simulator.model.gpu import GPUSpec
from simulator.model.precision import Precision
from simulator.model.routing import (
    busiest_share,
    expected_touched,
    expert_probabilities,
    local_probabilities,
    remote_gpus_per_token,
    row_tile,
    row_tiles,
)
from simulator.model.step import Number, Step, ceil_div

AttentionKernel = Literal["flash", "naive", "per-head"]
Fusion = Literal["none", "kernels", "elementwise", "full"]
ATTENTION_KERNELS: tuple[str, ...] = ("flash", "naive", "per-head")
FUSIONS: tuple[str, ...] = ("none", "kernels", "elementwise", "full")

# Approximate vector FLOPs per element of the elementwise operators (they are always
# memory-bound, so these only matter for FLOP totals): RMSNorm/LayerNorm ~4 (square,
# sum, scale, weight), rotary 3 (two multiplies and an add), residual add 1,
# activation 4 (SiLU/GELU: exp, add, divide, multiply), softmax 5 (max, subtract, exp, sum, divide).
NORM_FLOPS_PER_ELEMENT = 4.0
ROTARY_FLOPS_PER_ELEMENT = 3.0
ADD_FLOPS_PER_ELEMENT = 1.0
ACTIVATION_FLOPS_PER_ELEMENT = 4.0
SOFTMAX_FLOPS_PER_SCORE = 5.0


class Work(NamedTuple):
    """What an operator computes and moves in one step, on one GPU, per instance.

    A NamedTuple rather than a dataclass: the engine builds ~15 of these per simulated
    iteration, and tuple construction is several times cheaper.
    """

    flops: Number
    weight_bytes: Number = 0.0
    kv_read_bytes: Number = 0.0
    kv_write_bytes: Number = 0.0
    activation_bytes: Number = 0.0
    link_bytes: Number = 0.0
    launches: Number = 0.0
    dequant_ops: Number = 0.0
    """weight-only dequantisation operations (CUDA-core work, not model FLOPs)"""
    padding_flops: Number = 0.0
    """tensor-core FLOPs spent on the padding rows of grouped GEMMs (time, not model FLOPs)"""


def _max(a: Number, b: Number) -> Number:
    """np.maximum, without its per-call overhead (~1 us) when both are plain numbers (the engine's scalar steps)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b or a != a else b


def _min(a: Number, b: Number) -> Number:
    """np.minimum, without its per-call overhead when both are plain numbers."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a <= b or a != a else b


def _active(tokens: Number) -> Number:
    """1 where a step has tokens for this operator, else 0 (a kernel that does not run costs nothing)."""
    return 1.0 * (tokens > 0)


@dataclass(frozen=True)
class Gemm:
    """A weight matrix multiply: (tokens x in_features) @ (in_features x out_features), per GPU.

    ``token_source`` is 'all' (every new token) or 'logits' (LM head: one row per emitting sequence).
    Routed experts are :class:`ExpertGemm`. ``active_params``: parameters a token multiplies with
    when they differ from ``params`` (a tied LM head reads the embedding's H x V; None: ``params``).

    Activation traffic per routed token: ``input_read_elements`` read (None: ``in_features``;
    0 when the input is on chip) and ``output_write_elements`` written (None: ``out_features``;
    less when an epilogue shrinks it, 0 when it stays on chip). ``launches_per_step`` is 0
    when the GEMM runs inside a fused block whose launch is counted elsewhere.
    """

    name: str
    count: int
    in_features: int
    out_features: int
    params: int
    resident_bytes: float
    weight_bytes_per_element: float
    scale_bytes_per_weight: float
    bias_elements: int
    activation_bytes_per_element: float
    compute_dtype: str
    dequant_ops_per_weight: float = 0.0
    dequant_tile_tokens: int = 16
    data_parallel: int = 1
    """attention data parallelism: this GPU runs 1/data_parallel of the step's tokens with the whole matrix"""
    token_source: Literal["all", "logits"] = "all"
    active_params: int | None = None
    input_read_elements: int | None = None
    output_write_elements: int | None = None
    launches_per_step: float = 1.0
    expand_above_tokens: int = 0
    """weight-only quantised weights: above this many rows a kernel of its own expands them to the activation
    dtype in HBM and a dense GEMM reads that copy (EngineProfile.dequantize_above_tokens); 0: never"""
    kind: str = "gemm"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        tokens = step.logit_tokens if self.token_source == "logits" else step.tokens
        return tokens / self.data_parallel if self.data_parallel > 1 else tokens

    def work(self, step: Step) -> Work:
        tokens = self.tokens(step)
        active = _active(tokens)
        matrix = self.in_features * self.out_features
        weights_read = matrix * active
        dequant: Number = 0.0
        b_a = self.activation_bytes_per_element
        expanded: Number = 0.0  # bytes of the dense copy: written once, read by the GEMM
        launches: Number = self.launches_per_step * active
        if self.dequant_ops_per_weight:
            in_kernel: Number = weights_read * ceil_div(tokens, self.dequant_tile_tokens) * self.dequant_ops_per_weight
            if self.expand_above_tokens:
                # The quantised weights are still read once (by the expanding kernel); each weight is then
                # dequantised once, not once per row tile.
                expand: Number = 1.0 * (tokens > self.expand_above_tokens)
                in_kernel = in_kernel * (1.0 - expand) + weights_read * self.dequant_ops_per_weight * expand
                expanded = 2.0 * weights_read * b_a * expand
                launches = launches + expand
            dequant = in_kernel
        read = self.in_features if self.input_read_elements is None else self.input_read_elements
        write = self.out_features if self.output_write_elements is None else self.output_write_elements
        return Work(
            flops=2.0 * tokens * matrix,
            weight_bytes=weights_read * (self.weight_bytes_per_element + self.scale_bytes_per_weight)
            + self.bias_elements * b_a * active + expanded,
            activation_bytes=tokens * (read + write) * b_a,
            launches=launches,
            dequant_ops=dequant,
        )


@dataclass(frozen=True)
class ExpertGemm:
    """One GEMM of the routed experts of an MoE layer, on the GPU holding the hottest experts.

    The GPU holds ``len(probabilities)`` experts (E / ep under expert parallelism), each an
    ``in_features x out_features`` matrix (an expert's full width when ep = tp, its 1/tp column or
    row slice when ep = 1). ``probabilities`` are the q_i of those experts (simulator.model.routing):
    a step of t tokens sends t * sum(q_i) (token, expert) rows to this GPU, 2 * in * out FLOPs each,
    and reads the weights of the expected distinct experts touched, sum_i 1 - (1 - q_i)^t.
    Rows are padded per expert to the grouped-GEMM row tile (``padding_flops``). ``params`` counts
    all ``experts`` of the model, ``active_params`` the ``top_k`` a token uses.
    """

    name: str
    count: int
    in_features: int
    out_features: int
    params: int
    active_params: int
    resident_bytes: float
    weight_bytes_per_element: float
    scale_bytes_per_weight: float
    bias_elements: int
    activation_bytes_per_element: float
    compute_dtype: str
    experts: int
    top_k: int
    probabilities: tuple[float, ...]
    dequant_ops_per_weight: float = 0.0
    dequant_tile_tokens: int = 16
    output_write_elements: int | None = None
    kind: str = "gemm"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def experts_touched(self, tokens: Number) -> Number:
        """Expected distinct experts of this GPU that ``tokens`` tokens route to."""
        return expected_touched(np.asarray(self.probabilities), tokens)

    def work(self, step: Step) -> Work:
        tokens = self.tokens(step)
        q = np.asarray(self.probabilities)
        matrix = self.in_features * self.out_features
        rows = tokens * float(q.sum())
        touched = expected_touched(q, tokens)
        tile = row_tile(tokens, self.experts)
        padded_rows = tile * row_tiles(q, tokens, tile)
        dequant: Number = 0.0
        if self.dequant_ops_per_weight:
            dequant = matrix * row_tiles(q, tokens, self.dequant_tile_tokens) * self.dequant_ops_per_weight
        write = self.out_features if self.output_write_elements is None else self.output_write_elements
        b_a = self.activation_bytes_per_element
        return Work(
            flops=2.0 * rows * matrix,
            weight_bytes=touched * (matrix * (self.weight_bytes_per_element + self.scale_bytes_per_weight)
                                    + self.bias_elements * b_a),
            activation_bytes=rows * (self.in_features + write) * b_a,
            launches=_active(tokens),
            dequant_ops=dequant,
            padding_flops=2.0 * (padded_rows - rows) * matrix,
        )


@dataclass(frozen=True)
class Attention:
    """Scaled dot-product attention over the KV cache for the heads on one GPU."""

    name: str
    count: int
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_element: float
    activation_bytes_per_element: float
    compute_dtype: str
    kernel: AttentionKernel
    query_tile_rows: int
    io_fused: bool
    """q arrives on chip from the QKV projection and the output stays on chip for o_proj (fusion 'full')"""
    params: int = 0
    resident_bytes: float = 0.0
    window: int | None = None
    """sliding window: each query attends at most this many keys (None: the whole context)"""
    data_parallel: int = 1
    """attention data parallelism: this GPU holds and attends 1/data_parallel of the step's sequences, all heads"""
    l2_bytes: float = 0.0
    """the GPU's L2, where the row tiles of one head find the K/V an earlier tile read (0: no reuse)"""
    sm_count: int = 0
    """SMs, one query row tile resident on each"""
    score_bytes_per_element: float = 0.0
    """the naive kernel's bytes per materialised score (EngineProfile.naive_score_bytes); 0: the activation dtype's"""
    cache_write_kernel: bool = False
    """the new tokens' K/V go into the cache by a kernel of their own (fusion none and kernels; module docstring)"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads other fields of the step than ``tokens(step)`` (the context, attention pairs)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def l2_reuse(self, step: Step) -> Number:
        """Share of the flash kernel's K/V re-reads (one per query row tile) that hit L2 rather than HBM.

        FlashAttention-2/3 launch one thread block per (query row tile, head, sequence) with the row
        tiles of one head next to each other in launch order (Dao 2023, section 3.2), so the
        ``sm_count`` tiles resident at once cover ``sm_count * B_r`` query rows: about
        ``max(1, sm_count * B_r / p)`` (sequence, head) pairs for prefill chunks of ``p`` tokens,
        each streaming its sequence's keys (``c + p`` for a chunk on ``c`` cached tokens). While that
        working set of K/V fits the L2, only the first tile of a head reads from HBM; beyond, the
        share that fits: ``reuse = min(1, L2 / working set)``. From the step's sums: prefilling
        sequences = sequences - decode tokens, ``p`` = prefill tokens / prefilling sequences, and the
        keys per chunk ``c + p`` ~= prefill pairs / prefill tokens + p / 2 (exact for p >> 1).
        """
        if not self.l2_bytes or not self.sm_count:
            return 0.0
        prefill = step.prefill_tokens
        decoders = step.tokens - prefill
        chunks = _max(step.sequences - decoders, 1.0)
        chunk_tokens = _max(prefill / chunks, 1.0)
        keys = step.prefill_attention_pairs / _max(prefill, 1.0) + chunk_tokens / 2.0
        heads_at_once = _max(1.0, self.sm_count * self.query_tile_rows / chunk_tokens)
        working_set = heads_at_once * keys * 2.0 * self.head_dim * self.kv_bytes_per_element
        return _min(1.0, self.l2_bytes / _max(working_set, 1.0))

    def group_rereads(self, step: Step) -> Number:
        """Keys the ``per-head`` decode kernel works through again (module docstring): every query head of a GQA
        group after the first repeats the group's K/V work for each decode key."""
        return (self.q_heads / self.kv_heads - 1.0) * (step.attention_pairs - step.prefill_attention_pairs)

    def work(self, step: Step) -> Work:
        if self.window is not None:
            step = windowed_step(step, self.window)
        n, g, d = self.q_heads, self.kv_heads, self.head_dim
        b_a, b_kv = self.activation_bytes_per_element, self.kv_bytes_per_element
        kv_token_bytes = 2.0 * g * d * b_kv
        io = 0.0 if self.io_fused else 2.0 * step.tokens * n * d * b_a
        if self.kernel != "naive":
            scores = step.attention_pairs
            rereads = step.prefill_attention_pairs / self.query_tile_rows
            if isinstance(rereads, np.ndarray) or rereads:
                rereads = rereads * (1.0 - self.l2_reuse(step))
            kv_reads = step.context_tokens + rereads
            if self.kernel == "per-head":
                kv_reads = kv_reads + self.group_rereads(step)
            score_traffic: Number = 0.0  # bytes
            # Under full fusion the kernel is part of the fused attention block launched by qkv_proj.
            launches = 0.0 * step.tokens if self.io_fused else _active(step.tokens)
        else:
            scores = step.score_elements
            kv_reads = step.context_tokens
            score_traffic = 4.0 * n * scores * (self.score_bytes_per_element or b_a)
            launches = 3.0 * _active(step.tokens)
        if self.cache_write_kernel:
            launches = launches + _active(step.tokens)
        share = 1.0 / self.data_parallel  # attention data parallelism: this GPU's share of the sequences
        return Work(
            flops=(4.0 * n * d * scores + SOFTMAX_FLOPS_PER_SCORE * n * scores) * share,
            kv_read_bytes=kv_token_bytes * kv_reads * share,
            kv_write_bytes=kv_token_bytes * step.tokens * share,
            activation_bytes=(io + score_traffic) * share,
            launches=launches,
        )


def windowed_step(step: Step, window: int) -> Step:
    """``step`` as a layer with a sliding window of ``window`` keys sees it.

    Each query attends at most ``window`` keys, so pairs <= tokens * window; a sequence reads at most
    ``window`` cached keys plus its new tokens, so keys <= sequences * window + prefill tokens.
    Exact when every sequence is past (or within) the window by the same amount, as in a decode
    batch of equal contexts; otherwise an upper bound (a step keeps only sums over its sequences,
    and sum(min(c_i, W)) <= min(sum(c_i), n W)). The naive kernel's score block shrinks with the
    keys (tokens x keys per sequence).
    """
    pairs = _min(step.attention_pairs, step.tokens * window)
    prefill_pairs = _min(step.prefill_attention_pairs, step.prefill_tokens * window)
    keys = _min(step.context_tokens, step.sequences * window + step.prefill_tokens)
    per_sequence = keys / _max(step.sequences, 1.0)
    scores = _min(step.score_elements, step.tokens * per_sequence)
    return replace(step, attention_pairs=pairs, prefill_attention_pairs=prefill_pairs, context_tokens=keys,
                   score_elements=scores)


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (MLA) over the latent KV cache, for the heads on one GPU.

    The cache holds, per token and layer, the compressed KV latent c (``kv_lora_rank`` r values)
    and the shared rotary key (``qk_rope_head_dim`` d_r values): (r + d_r) * b_kv bytes, whatever
    the head count (DeepSeek-V2 paper, section 2.1). ``kv_b_proj`` (r -> n (d_nope + d_v)) lives
    inside this operator (``params``, ``resident_bytes``) because the two phases use it differently:

    - Decode tokens, absorbed (DeepSeek-V2 section 2.1.3; FlashMLA and vLLM/SGLang's MLA decode):
      W_UK is folded into the query (2 n d_nope r FLOPs per token) and W_UV into the output
      (2 n r d_v), so attention runs over the latent itself: per (query, key) pair and head,
      scores over r + d_r values and the weighted sum over r: 2 n (2 r + d_r) FLOPs; each key's
      latent is read once for all heads ((r + d_r) b_kv bytes).
    - Prefill tokens, decompressed (vLLM's and SGLang's MLA prefill): kv_b_proj expands every
      key of a prefilling sequence into per-head keys and values (2 r n (d_nope + d_v) FLOPs per key,
      written to HBM as n (d_nope + d_r + d_v) activations), then FlashAttention runs with q/k head
      dimension d_nope + d_r and v head dimension d_v: 2 n (d_nope + d_r + d_v) FLOPs per pair, the
      expanded K/V streamed once per row tile of ``query_tile_rows`` queries.

    A decode token's pairs equal its keys, so decode keys = attention pairs - prefill pairs and
    prefill keys = context tokens - decode keys. Under tensor parallelism heads are split but the
    latent is not: every GPU reads (and stores) the whole latent.
    """

    name: str
    count: int
    q_heads: int
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    kv_bytes_per_element: float
    activation_bytes_per_element: float
    weight_bytes_per_element: float
    scale_bytes_per_weight: float
    compute_dtype: str
    query_tile_rows: int
    io_fused: bool
    params: int
    resident_bytes: float
    data_parallel: int = 1
    """attention data parallelism: this GPU holds and attends 1/data_parallel of the step's sequences, all heads"""
    cache_write_kernel: bool = False
    """the new tokens' latent goes into the cache by a kernel of their own (vLLM's ``concat_and_cache_mla``, SGLang's
    ``set_kv_buffer``; fusion none and kernels)"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the context and attention pairs of the step"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        n, r, d_r, d_n, d_v = self.q_heads, self.kv_lora_rank, self.rope_dim, self.nope_dim, self.v_dim
        b_a, b_kv = self.activation_bytes_per_element, self.kv_bytes_per_element
        decode_tokens = step.tokens - step.prefill_tokens
        decode_pairs = step.attention_pairs - step.prefill_attention_pairs
        prefill_keys = step.context_tokens - decode_pairs
        latent_bytes = (r + d_r) * b_kv
        expanded = n * (d_n + d_r + d_v)
        flops = (
            decode_pairs * 2.0 * n * (2 * r + d_r)
            + decode_tokens * 2.0 * n * r * (d_n + d_v)
            + prefill_keys * 2.0 * r * n * (d_n + d_v)
            + step.prefill_attention_pairs * 2.0 * n * (d_n + d_r + d_v)
            + SOFTMAX_FLOPS_PER_SCORE * n * step.attention_pairs
        )
        expanded_traffic = (2.0 * prefill_keys + step.prefill_attention_pairs / self.query_tile_rows) * expanded * b_a
        io = 0.0 if self.io_fused else step.tokens * n * (d_n + d_r + d_v) * b_a
        kv_b = r * n * (d_n + d_v) * (self.weight_bytes_per_element + self.scale_bytes_per_weight)
        share = 1.0 / self.data_parallel  # attention data parallelism: this GPU's share of the sequences
        return Work(
            flops=flops * share,
            weight_bytes=kv_b * _active(step.tokens),
            kv_read_bytes=latent_bytes * step.context_tokens * share,
            kv_write_bytes=latent_bytes * step.tokens * share,
            activation_bytes=(io + expanded_traffic) * share,
            # decode: the W_UK bmm, the latent attention kernel, the W_UV bmm; prefill: kv_b GEMM, attention
            launches=3.0 * _active(decode_tokens) + 2.0 * _active(step.prefill_tokens)
            + (_active(step.tokens) if self.cache_write_kernel else 0.0 * step.tokens),
        )


@dataclass(frozen=True)
class Elementwise:
    """A norm, rotary embedding, activation or residual add: reads and writes activations.

    When ``fused`` it runs inside a neighbouring GEMM: its FLOPs remain, its launch and its
    traffic vanish except ``fused_read_elements_per_token``, the operand the fused epilogue
    still reads from HBM (a residual add reads the H-wide residual stream).
    """

    name: str
    count: int
    read_elements_per_token: float
    write_elements_per_token: float
    flops_per_token: float
    weight_elements: int
    params: int
    resident_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    fused: bool
    fused_read_elements_per_token: int = 0
    kind: str = "elementwise"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        flops = step.tokens * self.flops_per_token
        b_a = self.activation_bytes_per_element
        if self.fused:
            return Work(flops=flops, activation_bytes=step.tokens * self.fused_read_elements_per_token * b_a)
        return Work(
            flops=flops,
            weight_bytes=self.weight_elements * b_a * _active(step.tokens),
            activation_bytes=step.tokens * (self.read_elements_per_token + self.write_elements_per_token) * b_a,
            launches=_active(step.tokens),
        )


@dataclass(frozen=True)
class Embedding:
    """Token (and learned position) embedding lookup: reads one table row per token per table."""

    name: str
    count: int
    width: int
    tables: int
    params: int
    resident_bytes: float
    activation_bytes_per_element: float
    compute_dtype: str
    kind: str = "embedding"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        b_a = self.activation_bytes_per_element
        return Work(
            flops=step.tokens * self.width * (self.tables - 1),
            weight_bytes=step.tokens * self.width * self.tables * b_a,
            activation_bytes=step.tokens * self.width * b_a,
            launches=_active(step.tokens),
        )


@dataclass(frozen=True)
class AllReduce:
    """Tensor-parallel all-reduce of the hidden state (tokens x hidden) across ``tp`` GPUs.

    ``link_bytes`` is the message each GPU holds; :mod:`simulator.cost.collectives` alone turns it
    into seconds (ring, tree, one-shot or two-shot by the engine's policy, the group size and the
    interconnect's latencies and bandwidth).
    """

    name: str
    count: int
    width: int
    tp: int
    activation_bytes_per_element: float
    params: int = 0
    resident_bytes: float = 0.0
    compute_dtype: str = "fp16"
    kind: str = "allreduce"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        return Work(
            flops=0.0 * step.tokens,
            link_bytes=step.tokens * self.width * self.activation_bytes_per_element,
            launches=_active(step.tokens),
        )


@dataclass(frozen=True)
class AllToAll:
    """Expert-parallel dispatch (or combine) of one MoE layer across ``ep`` GPUs.

    Attention is tensor-parallel, so after it every GPU holds all t tokens; each dispatches its
    t / tp share to the GPUs holding the tokens' experts, and the combine returns the expert
    outputs the same way (the DeepEP pattern SGLang uses with --tp N --ep N). ``remote_share``
    is the expected number of other GPUs one token travels to, for the busiest GPU
    (simulator.model.routing.busiest_share); ``link_bytes`` is what that GPU sends or receives:
    t / tp * remote_share * width * bytes per element.
    """

    name: str
    count: int
    width: int
    tp: int
    ep: int
    remote_share: float
    activation_bytes_per_element: float
    params: int = 0
    resident_bytes: float = 0.0
    compute_dtype: str = "fp16"
    kind: str = "alltoall"
    works_from_tokens: ClassVar[bool] = True
    """True: ``work(step)`` depends on the step only through ``tokens(step)`` (the cost model memoises on it)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        return Work(
            flops=0.0 * step.tokens,
            link_bytes=step.tokens / self.tp * self.remote_share * self.width * self.activation_bytes_per_element,
            launches=_active(step.tokens),
        )


Operator = Gemm | ExpertGemm | Attention | LatentAttention | Elementwise | Embedding | AllReduce | AllToAll


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU holds: g / tp, or 1 (replicated) when there are fewer KV heads than GPUs."""
    return max(1, model.num_kv_heads // tp)


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """TP must divide the heads, and divide or be a multiple of the KV heads."""
    if tp < 1:
        raise InputError(f"--tp: must be >= 1 (got {tp})")
    if model.num_heads % tp:
        divisors = [d for d in range(1, model.num_heads + 1) if model.num_heads % d == 0 and d <= 64]
        raise InputError(
            f"--tp: {tp} does not divide the {model.num_heads} attention heads of {model.name}; "
            f"allowed: {', '.join(map(str, divisors))}"
        )
    g = model.num_kv_heads
    if g % tp and tp % g:
        raise InputError(
            f"--tp: {tp} neither divides nor is a multiple of the {g} KV heads of {model.name}"
        )


def flash_query_tile_rows(gpu: GPUSpec, head_dim: int, activation_bytes: float) -> int:
    """FlashAttention row tile B_r = min(ceil(M / (4 d)), d), M = SRAM per SM in elements."""
    sram_elements = gpu.sram_bytes_per_sm / activation_bytes
    column_tile = math.ceil(sram_elements / (4 * head_dim))
    return max(1, min(column_tile, head_dim))


def check_expert_parallel(model: ModelSpec, tp: int, ep: int) -> None:
    """EP splits the routed experts over the ``tp`` GPUs that run attention tensor-parallel: ep is 1 or tp."""
    if ep < 1:
        raise InputError(f"--ep: must be >= 1 (got {ep})")
    if ep == 1:
        return
    if not model.is_moe:
        raise InputError(f"--ep: {model.name} has no routed experts; expert parallelism needs a mixture-of-experts model")
    if ep != tp:
        raise InputError(
            f"--ep: {ep} must be 1 or equal --tp {tp} (attention tensor-parallel and the experts split over the "
            "same GPUs, as SGLang's --tp N --ep N and vLLM's --enable-expert-parallel deploy them)"
        )
    if model.moe_experts % ep:
        raise InputError(f"--ep: {ep} does not divide the {model.moe_experts} routed experts of {model.name}")


def check_attention_data_parallel(model: ModelSpec, tp: int, dp_attention: bool) -> None:
    """Attention data parallelism runs attention on 1/tp of the sequences per GPU; the MoE layers see every token,
    their experts split over the same GPUs (``--ep`` tp: whole experts, all-to-all) or sliced (``--ep`` 1)."""
    if not dp_attention:
        return
    if not model.is_moe:
        raise InputError(f"--dp-attention: {model.name} has no routed experts; attention data parallelism is "
                         "deployed with expert parallelism (SGLang's --enable-dp-attention, TensorRT-LLM's "
                         "enable_attention_dp); use --replicas for a dense model")
    if tp < 2:
        raise InputError(f"--dp-attention: needs --tp N with N >= 2 GPUs to split the sequences over (got --tp {tp})")


def build_operators(
    model: ModelSpec,
    precision: Precision,
    gpu: GPUSpec,
    tp: int = 1,
    attention_kernel: AttentionKernel = "flash",
    fusion: Fusion = "elementwise",
    ep: int = 1,
    routing_skew: float = 0.0,
    dp_attention: bool = False,
) -> tuple[Operator, ...]:
    """Every operator of one forward pass, per GPU, in execution order (decoder ops repeat over their layers).

    ``ep``: expert-parallel degree (1 or ``tp``, see :func:`check_expert_parallel`);
    ``routing_skew``: Zipf-like exponent of expert popularity (0: uniform; simulator.model.routing).
    ``dp_attention``: attention data-parallel over the ``tp`` GPUs (:func:`check_attention_data_parallel`):
    each GPU runs the attention block with all heads and whole weights for 1/tp of the sequences,
    and holds only their KV cache; the MLP and experts stay tensor/expert-parallel.
    Layers differ only in their window (full or sliding attention) and MLP (dense or MoE); each
    kind is one operator whose ``count`` is the number of such layers.
    """
    check_tensor_parallel(model, tp)
    check_expert_parallel(model, tp, ep)
    check_attention_data_parallel(model, tp, dp_attention)
    if attention_kernel not in ATTENTION_KERNELS:
        raise InputError(f"--attention-kernel: '{attention_kernel}' is not one of {', '.join(ATTENTION_KERNELS)}")
    if fusion not in FUSIONS:
        raise InputError(f"--fusion: '{fusion}' is not one of {', '.join(FUSIONS)}")
    if fusion == "full" and attention_kernel != "flash":
        raise InputError(
            "--fusion full: fuses the attention block into one kernel, which needs --attention-kernel flash "
            f"(got {attention_kernel}: naive writes the score matrix to HBM, per-head decodes with a kernel of its "
            f"own); use --fusion elementwise with {attention_kernel} attention"
        )
    if model.is_mla and attention_kernel != "flash":
        # MLA's attention is built from its own operators (the absorbed decode over the latent), which no
        # kernel choice changes: accepting one would report a kernel the simulation never ran.
        raise InputError(
            f"--attention-kernel {attention_kernel}: {model.name} uses multi-head latent attention, which runs its "
            "own kernels (decode over the shared latent, as FlashMLA); only flash applies"
        )
    if not (math.isfinite(routing_skew) and routing_skew >= 0.0):
        raise InputError(f"--routing-skew: must be a finite exponent >= 0 (got {routing_skew})")
    return _Builder(model, precision, gpu, tp, attention_kernel, fusion, ep, routing_skew, dp_attention).build()


@dataclass(frozen=True)
class _Builder:
    """The operator list of :func:`build_operators`, one block (attention, MLP, MoE, ...) per method."""

    model: ModelSpec
    precision: Precision
    gpu: GPUSpec
    tp: int
    attention_kernel: AttentionKernel
    fusion: Fusion
    ep: int
    routing_skew: float
    dp_attention: bool = False

    @property
    def attention_tp(self) -> int:
        """GPUs one attention block is split over: 1 under attention data parallelism, else tp."""
        return 1 if self.dp_attention else self.tp

    @property
    def attention_dp(self) -> int:
        """Ways the sequences are split for attention: tp under attention data parallelism, else 1."""
        return self.tp if self.dp_attention else 1

    @property
    def b_a(self) -> float:
        return self.precision.activation_bytes_per_element

    @property
    def fused_block(self) -> bool:
        return self.fusion == "full"

    def gemm(
        self,
        name: str,
        in_f: int,
        out_f: int,
        weight_params: int,
        bias_params: int,
        bias_gpu: int,
        count: int | None = None,
        module: str = "attention",
        token_source: Literal["all", "logits"] = "all",
        read: int | None = None,
        write: int | None = None,
        launches: float = 1.0,
        active_params: int | None = None,
        data_parallel: int = 1,
    ) -> Gemm:
        """``bias_params``: logical bias elements; ``bias_gpu``: bias elements each GPU holds."""
        p = self.precision.for_module(module)
        w_bytes, w_scale = p.weight_bytes_per_element, p.scale_bytes_per_weight
        bias = self.model.linear_bias
        bias_gpu = bias_gpu if bias else 0
        return Gemm(
            name=name,
            count=self.model.num_layers if count is None else count,
            in_features=in_f,
            out_features=out_f,
            params=weight_params + (bias_params if bias else 0),
            resident_bytes=in_f * out_f * (w_bytes + w_scale) + bias_gpu * self.b_a,
            weight_bytes_per_element=w_bytes,
            scale_bytes_per_weight=w_scale,
            bias_elements=bias_gpu,
            activation_bytes_per_element=self.b_a,
            compute_dtype=p.compute_dtype,
            dequant_ops_per_weight=p.dequant_ops_per_weight,
            dequant_tile_tokens=p.dequant_tile_tokens,
            token_source=token_source,
            active_params=active_params,
            input_read_elements=read,
            output_write_elements=write,
            launches_per_step=launches,
            data_parallel=data_parallel,
        )

    @property
    def separate_cache_write(self) -> bool:
        """Is writing the new tokens' K/V (or MLA latent) into the cache a kernel of its own (module docstring)?"""
        return self.fusion in ("none", "kernels")

    def fuses(self, residual: bool = False) -> bool:
        """Does this fusion level fold an elementwise op into a neighbour (``residual``: a residual add)?"""
        if self.fusion == "kernels":
            return residual
        return self.fusion != "none"

    def elementwise(
        self, name: str, read: float, write: float, flops: float, weights: int = 0, count: int | None = None,
        fused_read: int = 0, residual: bool = False,
    ) -> Elementwise:
        if residual and self.fusion == "kernels":
            fused_read = 2 * fused_read  # the norm kernel reads the residual and writes the updated one
        return Elementwise(
            name=name,
            count=self.model.num_layers if count is None else count,
            read_elements_per_token=read,
            write_elements_per_token=write,
            flops_per_token=flops,
            weight_elements=weights,
            params=weights,
            resident_bytes=weights * self.b_a,
            activation_bytes_per_element=self.b_a,
            compute_dtype=self.precision.activation_dtype,
            fused=self.fuses(residual),
            fused_read_elements_per_token=fused_read,
        )

    def unfused(self, name: str, read: float, write: float, flops: float, count: int) -> Elementwise:
        """An elementwise kernel no engine fuses into a GEMM (its launch and traffic always count)."""
        return replace(self.elementwise(name, read, write, flops, count=count), fused=False)

    def norm(self, name: str, count: int | None = None, width: int | None = None) -> Elementwise:
        width = self.model.hidden_size if width is None else width
        params = width * (2 if self.model.norm == "layernorm" else 1)
        return self.elementwise(name, width, width, NORM_FLOPS_PER_ELEMENT * width, weights=params, count=count)

    def allreduce(self, name: str) -> AllReduce:
        return AllReduce(name=name, count=self.model.num_layers, width=self.model.hidden_size, tp=self.tp,
                         activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype)

    def build(self) -> tuple[Operator, ...]:
        model, tp, H = self.model, self.tp, self.model.hidden_size
        position_tables = 2 if model.position_embedding == "learned" else 1
        embed_b = self.precision.for_module("embedding").weight_bytes_per_element
        ops: list[Operator] = [
            Embedding(
                name="embedding",
                count=1,
                width=H,
                tables=position_tables,
                params=H * (model.vocab_size + (model.learned_position_rows if position_tables == 2 else 0)),
                resident_bytes=H * (model.vocab_size + model.learned_position_rows * (position_tables - 1))
                * embed_b / tp,
                activation_bytes_per_element=embed_b,
                compute_dtype=self.precision.activation_dtype,
            ),
            self.norm("attn_norm"),
        ]
        ops += self.latent_attention() if model.is_mla else self.attention()
        if not model.parallel_attention:
            if tp > 1:
                ops.append(self.allreduce("attn_allreduce"))
            if model.norms_per_layer == 4:
                ops.append(self.norm("post_attn_norm"))
            ops.append(self.elementwise("attn_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H, residual=True))
            if model.norms_per_layer >= 2:
                ops.append(self.norm("mlp_norm"))
        dense_layers = model.num_layers - model.moe_layers
        if dense_layers:
            F = model.ffn_size
            if F % tp:
                raise InputError(f"--tp: {tp} does not divide the FFN size {F} of {model.name}")
            ops += self.mlp("", F, F // tp, dense_layers, "mlp")
        if model.moe_layers:
            ops += self.moe()
        if tp > 1:
            ops.append(self.allreduce("mlp_allreduce"))
        if model.parallel_attention:
            # x + attention(x) + mlp(x): one add reading three vectors.
            ops.append(self.elementwise("residual", 3 * H, H, 2 * ADD_FLOPS_PER_ELEMENT * H, fused_read=2 * H,
                                        residual=True))
        else:
            if model.norms_per_layer == 4:
                ops.append(self.norm("post_mlp_norm"))
            ops.append(self.elementwise("mlp_residual", 2 * H, H, ADD_FLOPS_PER_ELEMENT * H, fused_read=H, residual=True))
        ops.append(self.norm("final_norm", count=1))
        vocab_gpu = -(-model.vocab_size // tp)
        tied = model.tied_embeddings
        lm_head = self.gemm("lm_head", H, vocab_gpu, 0 if tied else H * model.vocab_size, 0, 0, count=1,
                            module="lm_head", token_source="logits", active_params=H * model.vocab_size if tied else None)
        if tied:
            # The LM head reads the embedding table, which is stored once.
            lm_head = replace(lm_head, resident_bytes=0.0)
        ops.append(lm_head)
        return tuple(ops)

    def attention(self) -> list[Operator]:
        """QKV projection, q/k norms, rotary, attention (full and sliding-window layers apart), output projection."""
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, d, L = model.hidden_size, model.head_dim, model.num_layers
        n, g = model.num_heads, model.num_kv_heads
        n_gpu, g_gpu = n // tp, kv_heads_per_gpu(model, tp)
        # Under full fusion q stays on chip and k, v go straight into the KV cache (charged by attention).
        ops: list[Operator] = [self.gemm("qkv_proj", H, (n_gpu + 2 * g_gpu) * d, H * (n + 2 * g) * d,
                                         (n + 2 * g) * d, (n_gpu + 2 * g_gpu) * d,
                                         write=0 if self.fused_block else None, data_parallel=dp)]
        # per-token elementwise work: all heads for 1/dp of the tokens = 1/dp of the heads for all of them
        width = (n_gpu + g_gpu) * d // dp
        if model.qk_norm:
            # Per-head RMSNorm of q and k (one weight vector of d each), in the QKV epilogue when fused.
            ops.append(self.elementwise("qk_norm", width, width, NORM_FLOPS_PER_ELEMENT * width, weights=2 * d))
        if model.position_embedding == "rotary":
            ops.append(self.elementwise("rotary", width, width, ROTARY_FLOPS_PER_ELEMENT * width))
        sliding = model.sliding_layers
        if sliding in (0, L):
            ops.append(self.attention_op("attention", L, model.sliding_window if sliding else None))
        else:
            ops.append(self.attention_op("attention", L - sliding, None))
            ops.append(self.attention_op("attention_local", sliding, model.sliding_window))
        # Row-parallel projections: every GPU holds the whole bias, added after the all-reduce.
        ops.append(self.gemm("o_proj", n_gpu * d, H, n * d * H, H, H, read=0 if self.fused_block else None,
                             launches=0.0 if self.fused_block else 1.0, data_parallel=dp))
        return ops

    def attention_op(self, name: str, count: int, window: int | None) -> Attention:
        model, d, tp = self.model, self.model.head_dim, self.attention_tp
        # gpt-oss's attention sinks: one learned logit per head, added to each softmax denominator.
        sinks = model.num_heads if model.attention_sinks else 0
        return Attention(
            name=name,
            count=count,
            q_heads=model.num_heads // tp,
            kv_heads=kv_heads_per_gpu(model, tp),
            head_dim=d,
            kv_bytes_per_element=self.precision.kv_bytes_per_element,
            activation_bytes_per_element=self.b_a,
            compute_dtype=self.precision.activation_dtype,
            kernel=self.attention_kernel,
            query_tile_rows=flash_query_tile_rows(self.gpu, d, self.b_a),
            io_fused=self.fusion == "full",
            cache_write_kernel=self.separate_cache_write,
            params=sinks,
            resident_bytes=sinks // tp * self.b_a,
            window=window,
            data_parallel=self.attention_dp,
        )

    def latent_attention(self) -> list[Operator]:
        """MLA's projections and attention (DeepSeek-V2/V3), split over ``tp`` GPUs as vLLM does.

        q_a_proj and kv_a_proj (down-projections to the query and KV latents) are replicated on every
        GPU (vLLM's ReplicatedLinear); q_b_proj (or q_proj) and kv_b_proj are split by heads, o_proj by rows.
        """
        model, tp, dp = self.model, self.attention_tp, self.attention_dp
        H, L, n = model.hidden_size, model.num_layers, model.num_heads
        n_gpu = n // tp
        r, r_q = model.kv_lora_rank, model.q_lora_rank
        d_r, d_n, d_v = model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim
        qk = d_n + d_r
        ops: list[Operator] = []
        if r_q:
            ops.append(self.gemm("q_a_proj", H, r_q, H * r_q, r_q, r_q, data_parallel=dp))
            ops.append(self.norm("q_a_norm", width=r_q))
            ops.append(self.gemm("q_b_proj", r_q, n_gpu * qk, r_q * n * qk, n * qk, n_gpu * qk, data_parallel=dp))
        else:
            ops.append(self.gemm("q_proj", H, n_gpu * qk, H * n * qk, n * qk, n_gpu * qk, data_parallel=dp))
        ops.append(self.gemm("kv_a_proj", H, r + d_r, H * (r + d_r), r + d_r, r + d_r, data_parallel=dp))
        ops.append(self.norm("kv_a_norm", width=r))
        rotary_width = (n_gpu + 1) * d_r // dp
        ops.append(self.elementwise("rotary", rotary_width, rotary_width, ROTARY_FLOPS_PER_ELEMENT * rotary_width))
        p = self.precision.for_module("attention")
        ops.append(
            LatentAttention(
                name="attention",
                count=L,
                q_heads=n_gpu,
                kv_lora_rank=r,
                rope_dim=d_r,
                nope_dim=d_n,
                v_dim=d_v,
                kv_bytes_per_element=self.precision.kv_bytes_per_element,
                activation_bytes_per_element=self.b_a,
                weight_bytes_per_element=p.weight_bytes_per_element,
                scale_bytes_per_weight=p.scale_bytes_per_weight,
                compute_dtype=self.precision.activation_dtype,
                query_tile_rows=flash_query_tile_rows(self.gpu, qk, self.b_a),
                io_fused=self.fusion == "full",
                params=r * n * (d_n + d_v),
                resident_bytes=r * n_gpu * (d_n + d_v) * (p.weight_bytes_per_element + p.scale_bytes_per_weight),
                data_parallel=dp,
                cache_write_kernel=self.separate_cache_write,
            )
        )
        ops.append(self.gemm("o_proj", n_gpu * d_v, H, n * d_v * H, H, H, read=0 if self.fused_block else None,
                             launches=0.0 if self.fused_block else 1.0, data_parallel=dp))
        return ops

    def mlp(self, prefix: str, F: int, F_gpu: int, count: int, module: str) -> list[Operator]:
        """A dense MLP (or the shared experts, ``prefix`` 'shared_') of width F, F_gpu per GPU, on ``count`` layers."""
        H = self.model.hidden_size
        fused = self.fuses()
        act = ACTIVATION_FLOPS_PER_ELEMENT * F_gpu
        if self.model.gated_mlp:
            # Fused SiLU(gate) * up in the epilogue: the GEMM writes F wide, not 2F.
            return [
                self.gemm(f"{prefix}gate_up_proj", H, 2 * F_gpu, 2 * H * F, 2 * F, 2 * F_gpu, count=count,
                          module=module, write=F_gpu if fused else None),
                self.elementwise(f"{prefix}activation", 2 * F_gpu, F_gpu, act, count=count),
                self.gemm(f"{prefix}down_proj", F_gpu, H, F * H, H, H, count=count, module=module),
            ]
        return [
            self.gemm(f"{prefix}up_proj", H, F_gpu, H * F, F, F_gpu, count=count, module=module),
            self.elementwise(f"{prefix}activation", F_gpu, F_gpu, act, count=count),
            self.gemm(f"{prefix}down_proj", F_gpu, H, F * H, H, H, count=count, module=module),
        ]

    def moe(self) -> list[Operator]:
        """Router and routing kernels, (dispatch), routed experts, their weighted sum, (combine), shared experts of the
        MoE layers (simulator.model.routing)."""
        model, tp, ep = self.model, self.tp, self.ep
        H, E, k = model.hidden_size, model.moe_experts, model.moe_top_k
        count = model.moe_layers
        expert_tp = tp // ep  # ep is 1 (experts split by columns/rows over tp) or tp (whole experts per GPU)
        F_e = model.expert_ffn_size
        if F_e % expert_tp:
            raise InputError(f"--tp: {tp} does not divide the expert FFN size {F_e} of {model.name} (or use --ep {tp})")
        F_gpu = F_e // expert_tp
        q_all = expert_probabilities(E, k, self.routing_skew)
        q = local_probabilities(q_all, ep)
        rows = float(q.sum())  # (token, expert) rows per step token on this GPU: k / ep when uniform
        p = self.precision.for_module("experts")
        bias = 1 if model.linear_bias else 0
        fused = self.fuses()

        def experts(name: str, in_f: int, out_f: int, weights: int, biases: int, write: int | None = None) -> ExpertGemm:
            per_expert = weights + bias * biases
            return ExpertGemm(
                name=name,
                count=count,
                in_features=in_f,
                out_features=out_f,
                params=E * per_expert,
                active_params=k * per_expert,
                resident_bytes=len(q) * (in_f * out_f * (p.weight_bytes_per_element + p.scale_bytes_per_weight)
                                         + bias * out_f * self.b_a),
                weight_bytes_per_element=p.weight_bytes_per_element,
                scale_bytes_per_weight=p.scale_bytes_per_weight,
                bias_elements=bias * out_f,
                activation_bytes_per_element=self.b_a,
                compute_dtype=p.compute_dtype,
                experts=E,
                top_k=k,
                probabilities=tuple(float(x) for x in q),
                dequant_ops_per_weight=p.dequant_ops_per_weight,
                dequant_tile_tokens=p.dequant_tile_tokens,
                output_write_elements=write,
            )

        ops: list[Operator] = [
            self.gemm("router", H, E, H * E, E, E, count=count, module="router"),
            # Routing runs as kernels of its own in every engine (vLLM/SGLang: topk_softmax, then
            # moe_align_block_size sorting the (token, expert) rows by expert; TensorRT-LLM: its routing
            # kernel, then the expert maps): a softmax and top-k over the E logits, writing k ids and k
            # weights, then the sort of the rows.
            self.unfused("moe_topk", E, 2 * k, SOFTMAX_FLOPS_PER_SCORE * E, count),
            self.unfused("moe_align", k, k, 0.0, count),
        ]
        if ep > 1:
            share = remote_gpus_per_token(E, k, ep) if self.routing_skew == 0 else busiest_share(q_all, ep)
            dispatch = AllToAll(name="moe_dispatch", count=count, width=H, tp=tp, ep=ep, remote_share=share,
                                activation_bytes_per_element=self.b_a, compute_dtype=self.precision.activation_dtype)
            ops.append(dispatch)
        act = ACTIVATION_FLOPS_PER_ELEMENT * F_gpu * rows
        if model.gated_mlp:
            ops.append(experts("experts_gate_up", H, 2 * F_gpu, 2 * H * F_e, 2 * F_e, write=F_gpu if fused else None))
            ops.append(self.elementwise("experts_activation", 2 * F_gpu * rows, F_gpu * rows, act, count=count))
        else:
            ops.append(experts("experts_up", H, F_gpu, H * F_e, F_e))
            ops.append(self.elementwise("experts_activation", F_gpu * rows, F_gpu * rows, act, count=count))
        ops.append(experts("experts_down", F_gpu, H, F_e * H, H))
        # The k expert outputs of a token are weighted and summed by a kernel of their own (vLLM's and
        # SGLang's moe_sum, TensorRT-LLM's finalizeMoeRouting): it reads the rows the down GEMM wrote.
        ops.append(self.unfused("experts_combine", rows * H, H, 2.0 * rows * H, count))
        if ep > 1:
            ops.append(replace(dispatch, name="moe_combine"))  # the same bytes back to the tokens' GPUs
        if model.moe_shared_experts:
            F_s = model.moe_shared_experts * model.shared_expert_ffn_size
            if F_s % tp:
                raise InputError(f"--tp: {tp} does not divide the shared-expert FFN size {F_s} of {model.name}")
            ops += self.mlp("shared_", F_s, F_s // tp, count, "experts")
        return ops


class MoEFacts(NamedTuple):
    """What the report says about a mixture-of-experts deployment at one step size."""

    experts: int
    top_k: int
    shared_experts: int
    moe_layers: int
    ep: int
    experts_per_gpu: int
    touched_per_gpu: float
    """expected distinct experts per MoE layer a step of ``tokens`` touches on the busiest GPU"""


def moe_facts(model: ModelSpec, operators: tuple[Operator, ...], tokens: float) -> MoEFacts | None:
    """Routed experts, their split over GPUs and the experts a step of ``tokens`` tokens touches (None: dense)."""
    experts = next((op for op in operators if isinstance(op, ExpertGemm)), None)
    if experts is None:
        return None
    per_gpu = len(experts.probabilities)
    return MoEFacts(
        experts=model.moe_experts,
        top_k=model.moe_top_k,
        shared_experts=model.moe_shared_experts,
        moe_layers=model.moe_layers,
        ep=model.moe_experts // per_gpu,
        experts_per_gpu=per_gpu,
        touched_per_gpu=float(experts.experts_touched(tokens)),
    )


class ParameterCounts(NamedTuple):
    """A model's parameters (element counts, whole model).

    ``active``: weights one token multiplies with: the top-k routed experts (not the others), the
    LM head, every dense weight, but not the input embedding table (a lookup of one row), as
    DeepSeek and OpenAI count active parameters. ``active_with_embedding`` adds the table, as
    Mistral (Mixtral 12.9B) and Qwen (Qwen3-30B-A3B 3.3B) count them.
    """

    total: int
    active: int
    embedding: int
    active_with_embedding: int


def parameter_count(operators: tuple[Operator, ...]) -> int:
    """Parameters of the whole model (all GPUs): sum of count x params over operators."""
    return int(sum(op.count * op.params for op in operators))


def parameter_counts(operators: tuple[Operator, ...]) -> ParameterCounts:
    """Total, active and embedding parameters of the model the operators belong to (see ParameterCounts)."""
    total = parameter_count(operators)
    embedding = int(sum(op.count * op.params for op in operators if isinstance(op, Embedding)))
    active = 0
    tied = False
    for op in operators:
        if isinstance(op, Embedding):
            continue
        own = getattr(op, "active_params", None)
        if isinstance(op, Gemm) and own is not None and op.params == 0:
            tied = True  # a tied LM head: its matrix is the embedding table
        active += op.count * (op.params if own is None else own)
    return ParameterCounts(total, int(active), embedding, int(active + (0 if tied else embedding)))


# Any GPU builds the operator list for counting (only the FlashAttention tile reads it).
_COUNTING_GPU = GPUSpec(name="parameter counting", peak_flops={"fp16": 1.0}, hbm_bytes=1.0,
                        hbm_bandwidth_bytes_per_second=1.0, sram_bytes_per_sm=1.0, link_bandwidth_bytes_per_second=1.0)


def model_parameters(model: ModelSpec) -> ParameterCounts:
    """Total and active parameters of ``model`` (tp = 1, default precision)."""
    return parameter_counts(build_operators(model, Precision(), _COUNTING_GPU))
