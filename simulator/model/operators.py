"""The operator types of a forward pass (GEMMs, attention, elementwise, collectives) and the work each does.

Each operator knows *what it does* for a :class:`~simulator.model.step.Step` (``work``: FLOPs and
bytes by kind); :mod:`simulator.cost.step_cost` alone turns that into seconds. How the builder
(:mod:`simulator.model.layers`) chooses and fuses them, and the attention kernels' traffic rules,
are in that module's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from simulator.model.compressed_attention_operators import CompressedAttention, HyperConnection, KVCompressor
from simulator.model.routing import (
    expected_touched,
    row_tile,
    row_tiles,
)
from simulator.model.sparse_linear_operators import BlockIndexer, GatedDeltaNet, Indexer, topk_step, windowed_step
from simulator.model.sparse_linear_operators import prefill_keys as keys_of_prefills
from simulator.model.state_space_operators import Mamba2
from simulator.model.step import Number, Step, ceil_div
from simulator.model.work import SOFTMAX_FLOPS_PER_SCORE, Work
from simulator.model.work import active as _active
from simulator.model.work import maximum as _max
from simulator.model.work import minimum as _min

AttentionKernel = Literal["flash", "naive", "per-head"]


Fusion = Literal["none", "kernels", "elementwise", "full"]


ATTENTION_KERNELS: tuple[str, ...] = ("flash", "naive", "per-head")


FUSIONS: tuple[str, ...] = ("none", "kernels", "elementwise", "full")


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
    value_head_dim: int = 0
    """width of each value head where narrower than ``head_dim`` (MiMo-V2-Flash: 128 beside 192); 0: head_dim"""
    topk: int = 0
    """block-sparse attention: each query attends at most this many keys, the selected blocks' (0: all of them)"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads other fields of the step than ``tokens(step)`` (the context, attention pairs)"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    @property
    def key_value_width(self) -> int:
        """Elements of one key and one value head together: d + d_v (2 d where they are equally wide)."""
        return self.head_dim + (self.value_head_dim or self.head_dim)

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
        working_set = heads_at_once * keys * self.key_value_width * self.kv_bytes_per_element
        return _min(1.0, self.l2_bytes / _max(working_set, 1.0))

    def group_rereads(self, step: Step) -> Number:
        """Keys the ``per-head`` decode kernel works through again (module docstring): every query head of a GQA
        group after the first repeats the group's K/V work for each decode key."""
        return (self.q_heads / self.kv_heads - 1.0) * (step.attention_pairs - step.prefill_attention_pairs)

    def work(self, step: Step) -> Work:
        if self.window is not None:
            step = windowed_step(step, self.window)
        if self.topk:
            step = topk_step(step, self.topk)
        n, g = self.q_heads, self.kv_heads
        b_a, b_kv = self.activation_bytes_per_element, self.kv_bytes_per_element
        # Scores are q . k over d, the weighted sum runs over d_v: 2 n (d + d_v) FLOPs per pair, 4 n d when d_v = d.
        width = self.key_value_width
        kv_token_bytes = g * width * b_kv
        io = 0.0 if self.io_fused else step.tokens * n * width * b_a  # q read (d), output written (d_v)
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
            flops=(2.0 * n * width * scores + SOFTMAX_FLOPS_PER_SCORE * n * scores) * share,
            kv_read_bytes=kv_token_bytes * kv_reads * share,
            kv_write_bytes=kv_token_bytes * step.tokens * share,
            activation_bytes=(io + score_traffic) * share,
            launches=launches,
        )


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
    topk: int = 0
    """DSA: keys each query attends, chosen by the indexer (0: all); then prefill runs absorbed too (work)"""
    kind: str = "attention"
    works_from_tokens: ClassVar[bool] = False
    """False: ``work(step)`` reads the context and attention pairs of the step"""

    def tokens(self, step: Step) -> Number:
        return step.tokens

    def work(self, step: Step) -> Work:
        n, r, d_r, d_n, d_v = self.q_heads, self.kv_lora_rank, self.rope_dim, self.nope_dim, self.v_dim
        b_a, b_kv = self.activation_bytes_per_element, self.kv_bytes_per_element
        if self.topk:
            # DSA: attention over the selected keys only; every token, prefill too, runs in the absorbed (MQA)
            # form over the latent, since each selected latent serves all heads (DeepSeek-V3.2-Exp report, 2.1;
            # FlashMLA's sparse kernels), so nothing is decompressed.
            step = topk_step(step, self.topk)
            decode_tokens, decode_pairs = step.tokens, step.attention_pairs
            prefill_keys, prefill_pairs, prefill_tokens = 0.0 * step.tokens, 0.0 * step.tokens, 0.0 * step.tokens
        else:
            decode_tokens = step.tokens - step.prefill_tokens
            decode_pairs = step.attention_pairs - step.prefill_attention_pairs
            prefill_keys = keys_of_prefills(step)
            prefill_pairs, prefill_tokens = step.prefill_attention_pairs, step.prefill_tokens
        latent_bytes = (r + d_r) * b_kv
        expanded = n * (d_n + d_r + d_v)
        flops = (
            decode_pairs * 2.0 * n * (2 * r + d_r)
            + decode_tokens * 2.0 * n * r * (d_n + d_v)
            + prefill_keys * 2.0 * r * n * (d_n + d_v)
            + prefill_pairs * 2.0 * n * (d_n + d_r + d_v)
            + SOFTMAX_FLOPS_PER_SCORE * n * step.attention_pairs
        )
        expanded_traffic = (2.0 * prefill_keys + prefill_pairs / self.query_tile_rows) * expanded * b_a
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
            launches=3.0 * _active(decode_tokens) + 2.0 * _active(prefill_tokens)
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

    ``collective``: 'allreduce', or under attention data parallelism the pair that replaces the two
    all-reduces of a layer: 'allgather' (every GPU's tokens gathered for the MLP or experts, ``link_bytes``
    the gathered result) and 'reducescatter' (their partial outputs summed and each rank's tokens sent back,
    ``link_bytes`` the summed input). Both cost one ring phase, half an all-reduce's traffic.
    """

    name: str
    count: int
    width: int
    tp: int
    activation_bytes_per_element: float
    collective: Literal["allreduce", "allgather", "reducescatter"] = "allreduce"
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


Operator = (Gemm | ExpertGemm | Attention | LatentAttention | Indexer | BlockIndexer | GatedDeltaNet | Mamba2
            | CompressedAttention | KVCompressor | HyperConnection | Elementwise | Embedding | AllReduce | AllToAll)
