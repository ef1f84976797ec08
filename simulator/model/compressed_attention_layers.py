"""The operators of DeepSeek-V4's attention block and hyper-connections, per GPU, for :mod:`simulator.model.layers`.

Split from that module's builder (which would pass 800 lines with them); these functions take its builder (the
``_Builder`` protocol below) and use its GEMM and elementwise rules. What each operator does is in
:mod:`simulator.model.compressed_attention_operators`; the layer is the reference's (DeepSeek-V4's
inference/model.py ``Attention``), split over ``tp`` GPUs as vLLM's ``DeepseekV4Attention`` does:

- ``q_a_kv_proj`` (wq_a and wkv, hidden -> q_lora_rank + head_dim; vLLM's ``fused_wqa_wkv``) and both norms,
  replicated; ``q_b_proj`` (wq_b) split by heads; the per-head query norm and the rotary of q and k in one kernel.
- the attention of each kind of layer (window only, CSA, HCA: ``CompressedAttention``); the compressor of each
  compressed layer (wkv and wgate as one GEMM, ``fused_wkv_wgate``, replicated, fp32 out; ``KVCompressor``); on
  CSA layers the lightning indexer: wq_b (q_lora_rank -> index heads x index head width), weights_proj and its own
  compressor at the index width, all replicated, and the scoring (:class:`~simulator.model.sparse_linear_operators.
  Indexer` over compressed keys).
- the output: the inverse rotary of the output's rotary part, wo_a (``o_groups`` groups of n d / g -> o_lora_rank,
  a batched GEMM split by groups) and wo_b (g o_lora_rank -> hidden, split by rows, then the all-reduce).

The compressors' projections and the indexer's weights_proj are stored in bf16 in every DeepSeek-V4 checkpoint
(transformers' ``_keep_in_fp32_modules`` for them; vLLM builds them with ``quant_config=None``): they are costed in
the format of the ``router`` module, which stays unquantised unless ``--weights`` names it.
"""

from __future__ import annotations

from typing import Literal, Protocol

from simulator.model.architecture import ModelSpec
from simulator.model.compressed_attention_operators import (
    FP32_BYTES,
    INDEXED_RATIO,
    CompressedAttention,
    HyperConnection,
    KVCompressor,
    compressed_entry_bytes,
    overlap_factor,
    padded_query_heads,
)
from simulator.model.gpu import GPUSpec
from simulator.model.operators import Elementwise, Gemm, Operator
from simulator.model.precision import Precision
from simulator.model.sparse_linear_operators import Indexer, indexer_key_bytes
from simulator.model.work import NORM_FLOPS_PER_ELEMENT, ROTARY_FLOPS_PER_ELEMENT


class _Builder(Protocol):
    """What these functions use of :mod:`simulator.model.layers`' builder (named here: that module imports this one)."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def precision(self) -> Precision: ...

    @property
    def gpu(self) -> GPUSpec: ...

    @property
    def attention_tp(self) -> int: ...

    @property
    def attention_dp(self) -> int: ...

    @property
    def b_a(self) -> float: ...

    def gemm(self, name: str, in_f: int, out_f: int, weight_params: int, bias_params: int, bias_gpu: int,
             count: int | None = None, module: str = "attention", token_source: Literal["all", "logits"] = "all",
             read: int | None = None, write: int | None = None, launches: float = 1.0,
             active_params: int | None = None, data_parallel: int = 1) -> Gemm: ...

    def elementwise(self, name: str, read: float, write: float, flops: float, weights: int = 0,
                    count: int | None = None, fused_read: int = 0, residual: bool = False) -> Elementwise: ...

# The module whose weight format the checkpoint's bf16 projections take (module docstring).
UNQUANTISED_MODULE = "router"

ATTENTION_NAMES = {0: "attention_window", INDEXED_RATIO: "attention_csa", 128: "attention_hca"}


def _fp32_output(b: _Builder, width: int) -> int:
    """Activation elements the width of ``width`` fp32 values (a GEMM with an fp32 output, torch.mm out_dtype)."""
    return int(width * FP32_BYTES // b.b_a)


def compressed_attention(b: _Builder) -> list[Operator]:
    """The attention block of every layer of a DeepSeek-V4 model (module docstring)."""
    model, tp, dp = b.model, b.attention_tp, b.attention_dp
    H, n, d = model.hidden_size, model.num_heads, model.head_dim
    r_q, d_r, g, r_o = model.q_lora_rank, model.qk_rope_head_dim, model.o_groups, model.o_lora_rank
    n_gpu, g_gpu = n // tp, g // tp
    entry = compressed_entry_bytes(d, d_r, b.precision.kv_bytes_per_element)
    # per-token elementwise work: all heads for 1/dp of the tokens = 1/dp of the heads for all of them
    q_width, rotary = n_gpu * d // dp, (n_gpu + 1) * d_r // dp
    ops: list[Operator] = [
        b.gemm("q_a_kv_proj", H, r_q + d, H * (r_q + d), 0, 0, data_parallel=dp),
        b.elementwise("q_kv_norm", (r_q + d) // dp, (r_q + d) // dp, NORM_FLOPS_PER_ELEMENT * (r_q + d) // dp,
                      weights=r_q + d),
        b.gemm("q_b_proj", r_q, n_gpu * d, r_q * n * d, 0, 0, data_parallel=dp),
        b.elementwise("q_norm_rotary", q_width + d // dp, q_width + d // dp,
                      NORM_FLOPS_PER_ELEMENT * q_width + ROTARY_FLOPS_PER_ELEMENT * rotary),
    ]
    for ratio, name in ATTENTION_NAMES.items():
        count = model.compress_ratio_layers(ratio)
        if not count:
            continue
        if ratio:
            ops += _compressor(b, ratio, d, entry, count, name.replace("attention", "compressor"))
        if ratio == INDEXED_RATIO:
            ops += _indexer(b, count)
        ops.append(CompressedAttention(
            name=name, count=count, q_heads=n_gpu, padded_heads=padded_query_heads(n_gpu), head_dim=d,
            window=model.compress_window, compress_ratio=ratio, topk=model.index_topk if ratio == INDEXED_RATIO else 0,
            entry_bytes=entry, activation_bytes_per_element=b.b_a, compute_dtype=b.precision.activation_dtype,
            params=n, resident_bytes=n_gpu * FP32_BYTES, data_parallel=dp))
    ops += [
        b.elementwise("output_inverse_rotary", q_width, q_width, ROTARY_FLOPS_PER_ELEMENT * n_gpu * d_r // dp),
        # g_gpu groups, each (n d / g) -> o_lora_rank: as one matrix of n_gpu d x o_lora_rank weights and FLOPs,
        # writing g_gpu o_lora_rank values per token
        b.gemm("o_a_proj", n_gpu * d, r_o, n * d * r_o, 0, 0, write=g_gpu * r_o, data_parallel=dp),
        b.gemm("o_b_proj", g_gpu * r_o, H, g * r_o * H, 0, 0, data_parallel=dp),
    ]
    return ops


def _compressor(b: _Builder, ratio: int, width: int, entry: float, count: int, name: str) -> list[Operator]:
    """A compressor of ``width`` values per entry on ``count`` layers: its projection and its pooling."""
    model, dp = b.model, b.attention_dp
    H, coff = model.hidden_size, overlap_factor(ratio)
    out = 2 * coff * width  # wkv and wgate
    ape = ratio * coff * width
    return [
        b.gemm(f"{name}_proj", H, out, H * out, 0, 0, count=count, module=UNQUANTISED_MODULE,
               write=_fp32_output(b, out), data_parallel=dp),
        KVCompressor(name=name, count=count, ratio=ratio, head_dim=width, rope_dim=model.qk_rope_head_dim,
                     entry_bytes=entry, activation_bytes_per_element=b.b_a, compute_dtype=b.precision.activation_dtype,
                     params=ape + width, resident_bytes=ape * FP32_BYTES + width * b.b_a, data_parallel=dp),
    ]


def _indexer(b: _Builder, count: int) -> list[Operator]:
    """The lightning indexer of the CSA layers: its query and head-weight projections, its compressor, the scoring."""
    model, dp = b.model, b.attention_dp
    H, r_q, n_i, d_i = model.hidden_size, model.q_lora_rank, model.index_heads, model.index_head_dim
    # The scores run on FP8 tensor cores where the GPU has them (DeepGEMM's fp8_mqa_logits), as DSA's indexer.
    dtype = "fp8" if "fp8" in b.gpu.peak_flops else b.precision.activation_dtype
    return [
        b.gemm("indexer_q_proj", r_q, n_i * d_i, r_q * n_i * d_i, 0, 0, count=count, data_parallel=dp),
        b.gemm("indexer_weights_proj", H, n_i, H * n_i, 0, 0, count=count, module=UNQUANTISED_MODULE,
               data_parallel=dp),
        *_compressor(b, INDEXED_RATIO, d_i, indexer_key_bytes(d_i), count, "indexer_compressor"),
        Indexer(name="indexer", count=count, heads=n_i, head_dim=d_i, topk=model.index_topk,
                activation_bytes_per_element=b.b_a, compute_dtype=dtype, data_parallel=dp,
                compress_ratio=INDEXED_RATIO),
    ]


def hyper_connection(b: _Builder, name: str, count: int, final: bool = False) -> HyperConnection:
    """One hyper-connection site on ``count`` layers (``final``: the head's collapse after the last block)."""
    model = b.model
    N, H = model.hc_mult, model.hidden_size
    mixes = N if final else (2 + N) * N  # pre, post and comb; the head: pre only
    params = mixes * N * H + mixes + (1 if final else 3)  # the matrix, its bias (base) and scales
    return HyperConnection(name=name, count=count, streams=N, width=H, mixes=mixes,
                           sinkhorn_iters=model.hc_sinkhorn_iters, activation_bytes_per_element=b.b_a,
                           compute_dtype=b.precision.activation_dtype, params=params,
                           resident_bytes=params * FP32_BYTES, final=final)
