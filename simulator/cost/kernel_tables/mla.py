"""Multi-head latent attention (MLA) latency from NVIDIA AIConfigurator's measured MLA tables.

memwall models a DeepSeek MLA layer's attention as one operator
(:class:`~simulator.model.operators.LatentAttention`): for decode tokens the absorbed W_UK batched
matmul, the attention over the latent and the absorbed W_UV batched matmul; for prefill tokens
the ``kv_b_proj`` GEMM that decompresses every key of the prefilling sequences, then attention on
the decompressed q/k/v; the new tokens' latent goes into the cache in either phase. The database
times those pieces apart, so the operator is charged their sum (one layer on one GPU):

    decode  = generation_mla(decoders, keys) + mla_gen_pre(decoders) + mla_gen_post(decoders)
    prefill = context_mla(prefillers, chunk) + kv_b GEMM(prefill keys)

What each latency includes, from the collectors' code (``collector/trtllm/collect_mla.py``,
``collector/trtllm/collect_mla_bmm.py``, ``collector/sglang/collect_mla.py`` and
``collector/helper.py:benchmark_with_power`` of ai-dynamo/aiconfigurator):

- Every latency is the mean device time of CUDA-graph replays after warm-up (no host launch; the
  GPU-side launch of each kernel in the graph is in it), in milliseconds (converted to seconds on
  reading). All rows are DeepSeek-V3's geometry (``Scenario``: kv_lora_rank 512, rope 64, nope 128,
  v 128); ``num_heads`` is the heads on the GPU (128 / tp); ``mla_dtype`` is always bf16,
  ``kv_cache_dtype`` bf16 or fp8.
- ``context_mla_perf.parquet`` (``isl`` prompt tokens, ``step`` 0: an empty cache, causal):
  TensorRT-LLM's ``TrtllmAttention.forward(q, k, v, context_only, latent_cache)`` on random,
  already decompressed q (heads x 192), k (192) and v (128), so it covers the RoPE of the rotary
  part, the write of the latent (512 + 64 values a token) into the paged cache and the FMHA; the
  ``kv_b_proj`` GEMM that would make k and v is *not* in it (charged here by the GEMM table).
  SGLang's rows on Blackwell (``trtllm_mla``) run the same decompressed form; its Hopper rows
  (``flash_attention``, FA3) and ``triton`` rows run prefill in the absorbed form over the latent
  (q and k of 512 + 64), a kernel memwall's prefill does not model, so they are not read: such a
  run's MLA is timed by the roofline.
- ``generation_mla_perf.parquet`` (``batch_size`` sequences decoding one token on ``step`` cached
  tokens, so ``step + 1`` keys): TensorRT-LLM's ``mla_rope_generation`` (RoPE of q_pe and k_pe, the
  latent's append to the cache, FP8 quantisation of q where the cache is FP8) and the forward over
  the latent (FlashMLA on Hopper), with the absorbed query (heads x 576) given: the W_UK and W_UV
  products are *not* in it. SGLang: the backend's decode forward with its cache write; RoPE is
  applied outside attention and is not in it.
- ``mla_bmm_perf.parquet`` (``num_tokens`` tokens, ``num_heads`` heads): ``mla_gen_pre`` is
  q_nope (tokens x heads x 128) times W_UK (heads x 128 x 512), ``mla_gen_post`` the latent output
  (tokens x heads x 512) times W_UV (heads x 512 x 128), each one batched matmul over the heads;
  ``fp8`` rows are TensorRT-LLM's ``fp8_block_scaling_bmm_out`` with its activation quantisation
  (Hopper) or the bf16 matmul on dequantised weights (Blackwell), ``bfloat16`` rows the bf16 one.

memwall's ``rotary`` operator stays timed by the roofline. Under TensorRT-LLM's fusion
(``elementwise``) it is fused, FLOPs only (tens of nanoseconds a step), so the RoPE inside the
TensorRT-LLM rows is charged twice by that much; under SGLang's (``kernels``) the rows exclude
RoPE and the rotary kernel is charged once.

Lookup: the context and generation tables are smoothed and interpolated as the attention tables
are (:mod:`.attention`: log-log in the length within a measured batch, in the batch between them,
the suffix minimum so that no shape is faster than a smaller one), and the batched matmuls
log-log in the tokens (smoothed the same way). Never a silent extrapolation: beyond a table's
range the latency at its edge is scaled by the roofline's ratio (the speed of light,
``max(flops / peak, bytes / bandwidth)``, of this operator's shape; :class:`MlaContextShape`,
:class:`MlaGenerationShape`, :class:`BmmShape`); a prefill chunk on cached tokens is its
empty-cache latency times the roofline ratio with and without the cached keys; the ``kv_b_proj``
GEMM is the measured GEMM table's curve (:mod:`.gemm`). An operator whose geometry, head count,
KV-cache or weight format, or sparse attention (DSA's ``topk``) a table does not measure, or whose
``kv_b_proj`` format the GEMM tables lack, gets no curve: the whole operator is then timed by the
roofline, and the report's by-kind source says so.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from simulator.cost.kernel_tables.attention import (
    PHASES,
    AttentionTable,
    PhaseCurve,
    attention_table,
    phase_curve,
)
from simulator.cost.kernel_tables.curve_rows import log_linear
from simulator.cost.kernel_tables.gemm import GemmCurve
from simulator.cost.kernel_tables.parquet import codes, numbers, read_parquet
from simulator.cost.kernel_tables.table import TableOrigin, mean_grid, suffix_minimum
from simulator.cost.tracing import is_traced, scalar_call
from simulator.errors import InputError
from simulator.model.sparse_linear_operators import prefill_keys
from simulator.model.step import Number, Step

MLA_INCLUDES = ("CUDA-graph replay device time (no host launch) of one MLA layer's attention: generation = RoPE, "
                "latent append and the latent kernel, plus the W_UK and W_UV batched matmuls; context = RoPE, latent "
                "write and the FMHA on decompressed q/k/v, plus the kv_b_proj GEMM")

GEOMETRY = (512, 64, 128, 128)
"""(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim) of every measured row (the collectors' DeepSeek-V3
``Scenario``)"""

DECOMPRESSED_CONTEXT_KERNELS = ("default", "trtllm_mla")
"""context rows' ``kernel_source`` values that run prefill on decompressed q/k/v (TensorRT-LLM's ``default``, SGLang's
``trtllm_mla`` on Blackwell); SGLang's ``flash_attention`` and ``triton`` rows run it absorbed over the latent"""

KV_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}
BMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
BMM_OPS = ("mla_gen_pre", "mla_gen_post")


@dataclass(frozen=True)
class _MlaShape:
    """What both phases' speed of light needs: heads on the GPU, element sizes (bytes) and the GPU's peaks (SI)."""

    heads: int
    kv_bytes_per_element: float
    activation_bytes_per_element: float
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float


@dataclass(frozen=True)
class MlaGenerationShape(_MlaShape):
    """The speed of light of one decoding sequence over the latent (absorbed form), for the edge scaling (SI units):
    per key, scores over r + d_r values and the weighted sum over r, ``2 n (2 r + d_r)`` FLOPs, one read of the key's
    latent; per query, its latent written, the absorbed q (n (r + d_r)) read and the latent output (n r) written."""

    def sequence_seconds(self, queries: float, keys_before: float) -> float:
        r, d_r, _, _ = GEOMETRY
        keys = keys_before + queries
        flops = 2.0 * self.heads * (2 * r + d_r) * queries * keys
        moved = ((r + d_r) * self.kv_bytes_per_element * (keys + queries)
                 + self.heads * (2 * r + d_r) * self.activation_bytes_per_element * queries)
        return max(flops / self.peak_flops_per_second, moved / self.bandwidth_bytes_per_second)


@dataclass(frozen=True)
class MlaContextShape(_MlaShape):
    """The speed of light of one prefilling sequence on decompressed q/k/v (SI units): ``2 n (d_n + d_r + d_v)`` FLOPs
    per causal (query, key) pair; the per-head keys and values of every key read once, q read and o written per
    query, the new tokens' latent written."""

    def sequence_seconds(self, queries: float, keys_before: float) -> float:
        r, d_r, d_n, d_v = GEOMETRY
        keys = keys_before + queries
        pairs = queries * keys_before + queries * (queries + 1) / 2.0
        flops = 2.0 * self.heads * (d_n + d_r + d_v) * pairs
        moved = (self.heads * (d_n + d_r + d_v) * self.activation_bytes_per_element * (keys + queries)
                 + (r + d_r) * self.kv_bytes_per_element * queries)
        return max(flops / self.peak_flops_per_second, moved / self.bandwidth_bytes_per_second)


@dataclass(frozen=True)
class BmmShape:
    """The speed of light of one absorbed batched matmul (SI units): ``tokens`` rows of ``inner`` values times each
    head's ``inner x outer`` weight, ``heads`` times."""

    heads: int
    inner: int
    outer: int
    weight_bytes_per_element: float
    activation_bytes_per_element: float
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float

    def seconds(self, tokens: float) -> float:
        n = self.heads
        flops = 2.0 * tokens * n * self.inner * self.outer
        moved = (n * self.inner * self.outer * self.weight_bytes_per_element
                 + tokens * n * (self.inner + self.outer) * self.activation_bytes_per_element)
        return max(flops / self.peak_flops_per_second, moved / self.bandwidth_bytes_per_second)


@dataclass(frozen=True)
class BmmTable:
    """Measured seconds of the absorbed batched matmuls: (op, format, heads) -> (tokens ascending, seconds)."""

    origin: TableOrigin
    rows: dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]
    cut: float = 0.0
    """the largest relative cut the smoothing made (a latency above a larger token count's), over every curve"""


@dataclass(frozen=True)
class TokenCurve:
    """Measured seconds of one batched matmul as a function of its tokens: log-log between the measured token counts,
    the roofline's ratio beyond them (plain floats: the engine costs most steps one at a time)."""

    shape: BmmShape
    log_tokens: tuple[float, ...]
    log_seconds: tuple[float, ...]

    def seconds(self, tokens: float) -> float:
        lens = self.log_tokens
        clipped = min(max(tokens, math.exp(lens[0])), math.exp(lens[-1]))
        out = math.exp(log_linear(lens, self.log_seconds, math.log(clipped)))
        if clipped != tokens:
            out *= self.shape.seconds(tokens) / self.shape.seconds(clipped)
        return out


@functools.lru_cache(maxsize=16)
def read_bmm_table(path: str, gpu: str, engine: str, version: str) -> BmmTable:
    """One ``mla_bmm_perf.parquet`` (module docstring)."""
    try:
        table = read_parquet(path, ("op_name", "bmm_dtype", "num_tokens", "num_heads", "latency"),
                             dictionary=["op_name", "bmm_dtype"])
        op, op_names = codes(table, "op_name")
        dtype, dtype_names = codes(table, "bmm_dtype")
        tokens = numbers(table.column("num_tokens")).astype(float)
        heads = numbers(table.column("num_heads")).astype(np.int64)
        seconds = numbers(table.column("latency")).astype(float) * 1e-3  # stored in milliseconds
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the MLA batched-matmul table ({exc})") from None
    if (tokens < 1).any() or not np.isfinite(seconds).all() or (seconds <= 0).any():
        raise InputError(f"{path}: MLA batched-matmul rows need num_tokens >= 1 and finite latencies > 0")
    rows: dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]] = {}
    cut = 0.0
    for o, o_name in enumerate(op_names):
        for d, d_name in enumerate(dtype_names):
            if str(o_name) not in BMM_OPS or str(d_name) not in BMM_DTYPES:
                continue
            for h in np.unique(heads[(op == o) & (dtype == d)]).tolist():
                pick = (op == o) & (dtype == d) & (heads == h)
                (sizes,), mean = mean_grid(seconds[pick], tokens[pick])
                if len(sizes) < 2:
                    continue
                smooth, c = suffix_minimum(mean)
                cut = max(cut, c)
                rows[(str(o_name), BMM_DTYPES[str(d_name)], int(h))] = (sizes, smooth)
    return BmmTable(TableOrigin(gpu, engine, version, path, MLA_INCLUDES), rows, cut)


@functools.lru_cache(maxsize=16)
def read_mla_table(path: str, phase: str, gpu: str, engine: str, version: str) -> AttentionTable:
    """One ``context_mla_perf.parquet`` or ``generation_mla_perf.parquet``, keyed by (heads on the GPU, KV-cache
    format); context rows of an absorbed-form kernel are left out (module docstring)."""
    if phase not in PHASES:
        raise InputError(f"{path}: MLA phase '{phase}' is not one of {', '.join(PHASES)}")
    try:
        table = read_parquet(path, ("kernel_source", "mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl",
                                    "step", "latency"), dictionary=["kernel_source", "mla_dtype", "kv_cache_dtype"])
        source, source_names = codes(table, "kernel_source")
        mla, mla_names = codes(table, "mla_dtype")
        kv, kv_names = codes(table, "kv_cache_dtype")
        heads = numbers(table.column("num_heads")).astype(np.int64)
        batch = numbers(table.column("batch_size")).astype(np.int64)
        isl = numbers(table.column("isl")).astype(np.int64)
        step = numbers(table.column("step")).astype(np.int64)
        seconds = numbers(table.column("latency")).astype(float) * 1e-3  # stored in milliseconds
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the {phase} MLA table ({exc})") from None
    keep = np.array([str(mla_names[m]) == "bfloat16" for m in mla.tolist()], dtype=bool)
    keep &= np.array([str(kv_names[c]) in KV_DTYPES for c in kv.tolist()], dtype=bool)
    if phase == "context":
        keep &= np.array([str(source_names[s]) in DECOMPRESSED_CONTEXT_KERNELS for s in source.tolist()], dtype=bool)
    rows = np.flatnonzero(keep)
    keys = [(int(heads[i]), KV_DTYPES[str(kv_names[kv[i]])]) for i in rows.tolist()]
    # Context: the prompt length; generation: the keys each query attends, its cached tokens plus itself.
    length = isl[rows] if phase == "context" else step[rows] + 1
    origin = TableOrigin(gpu, engine, version, path, MLA_INCLUDES)
    return attention_table(origin, phase, keys, batch[rows], length, seconds[rows])


@dataclass(frozen=True)
class MlaCurve:
    """Measured seconds of one MLA attention operator (one layer on one GPU) as a function of the step."""

    context: PhaseCurve
    generation: PhaseCurve
    pre: TokenCurve
    """W_UK: q_nope times the absorbed key up-projection, per decode token"""
    post: TokenCurve
    """W_UV: the latent output times the absorbed value up-projection, per decode token"""
    kv_b: GemmCurve
    """kv_b_proj, the decompression of every key of a prefilling sequence (the measured GEMM table's curve)"""
    data_parallel: int = 1

    def step_seconds(self, step: Step) -> Number:
        """Seconds of one layer's MLA attention in ``step`` (module docstring): the decode part for the decoding
        sequences, the prefill part for the prefilling ones; 0 for a step with neither."""
        share = 1.0 / self.data_parallel  # this GPU's share of the sequences
        arrays = (step.tokens, step.prefill_tokens, step.sequences, step.attention_pairs,
                  step.prefill_attention_pairs, step.context_tokens)
        if is_traced(*arrays):
            # A decode tick traced as a function of its keys (simulator.cost.tracing): the lookup is one call.
            return scalar_call(self._scalar_step_seconds, *arrays, share)
        if not any(isinstance(a, np.ndarray) for a in arrays):
            t, p, q, a, pa, c = (float(value) for value in arrays)
            return self._scalar_step_seconds(t, p, q, a, pa, c, share)
        # An array step equals its entries costed one at a time bit for bit (the engine's decode stretches rely on
        # it): the generation lookup runs on arrays with the scalar path's arithmetic (PhaseCurve.seconds_array),
        # the rest entry by entry.
        columns = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in arrays))
        shape = columns[0].shape
        tokens, prefill, sequences, pairs, prefill_pairs, context = (c.reshape(-1) for c in columns)
        decoders = tokens - prefill
        out = np.zeros(len(tokens))
        decoding = np.flatnonzero(decoders > 0)
        if len(decoding):
            d = decoders[decoding]
            keys = (pairs[decoding] - prefill_pairs[decoding]) / d
            batch = np.maximum(d * share, 1e-9)
            bmm = {b: self.pre.seconds(b) + self.post.seconds(b) for b in np.unique(batch).tolist()}
            out[decoding] = (self.generation.seconds_array(batch, np.maximum(keys, 1.0))
                             + np.array([bmm[b] for b in batch.tolist()]))
        for k in np.flatnonzero(prefill > 0).tolist():
            out[k] = out[k] + self._prefill_seconds(float(tokens[k]), float(prefill[k]), float(sequences[k]),
                                                    float(pairs[k]), float(prefill_pairs[k]), float(context[k]), share)
        return out.reshape(shape)

    def _scalar_step_seconds(self, tokens: float, prefill: float, sequences: float, pairs: float,
                             prefill_pairs: float, context: float, share: float) -> float:
        decoders = tokens - prefill
        out = 0.0
        if decoders > 0:
            keys = (pairs - prefill_pairs) / decoders
            batch = max(decoders * share, 1e-9)
            out += self.generation.scalar_seconds(batch, max(keys, 1.0)) + (
                self.pre.seconds(batch) + self.post.seconds(batch))
        if prefill > 0:
            out += self._prefill_seconds(tokens, prefill, sequences, pairs, prefill_pairs, context, share)
        return out

    def _prefill_seconds(self, tokens: float, prefill: float, sequences: float, pairs: float, prefill_pairs: float,
                         context: float, share: float) -> float:
        """The context kernel of the prefilling sequences plus the kv_b_proj GEMM over their keys (cached ones too:
        the operator decompresses every key a prefilling sequence attends)."""
        ctx = self.context.prefill_seconds(prefill, sequences, tokens - prefill, prefill_pairs, share)
        # The prefilling sequences' keys as LatentAttention.work counts them (sparse_linear_operators.prefill_keys).
        step = Step(tokens=tokens, prefill_tokens=prefill, sequences=sequences, logit_tokens=0.0, attention_pairs=pairs,
                    prefill_attention_pairs=prefill_pairs, score_elements=0.0, context_tokens=context)
        keys = float(prefill_keys(step)) * share
        return ctx + float(self.kv_b.seconds(keys))


@dataclass(frozen=True)
class MlaTables:
    """The context, generation and batched-matmul tables of one run."""

    context: AttentionTable
    generation: AttentionTable
    bmm: BmmTable

    def curve(self, heads: int, kv: str, bmm_format: str, context_shape: MlaContextShape,
              generation_shape: MlaGenerationShape, pre_shape: BmmShape, post_shape: BmmShape, kv_b: GemmCurve | None,
              data_parallel: int = 1) -> MlaCurve | None:
        """The curve of ``heads`` heads on the GPU over a ``kv`` (bf16 or fp8) cache with ``bmm_format`` absorbed
        weights, or None where any part is not measured (then the roofline times the whole operator)."""
        context = phase_curve(self.context.grid((heads, kv)), context_shape, "context")
        generation = phase_curve(self.generation.grid((heads, kv)), generation_shape, "generation")
        pre = self.bmm.rows.get(("mla_gen_pre", bmm_format, heads))
        post = self.bmm.rows.get(("mla_gen_post", bmm_format, heads))
        if context is None or generation is None or pre is None or post is None or kv_b is None:
            return None
        return MlaCurve(context, generation, _token_curve(pre_shape, *pre), _token_curve(post_shape, *post), kv_b,
                        data_parallel)

    @property
    def smoothing(self) -> float:
        """The largest relative cut the smoothing made, over both phases and the batched matmuls."""
        return max(self.context.smoothing, self.generation.smoothing, self.bmm.cut)


def _token_curve(shape: BmmShape, tokens: np.ndarray, seconds: np.ndarray) -> TokenCurve:
    return TokenCurve(shape, tuple(np.log(tokens).tolist()), tuple(np.log(seconds).tolist()))


def measured_mla(root, folder: str, display: str, family: str, version: str) -> tuple[MlaTables | None, str]:
    """The MLA tables of an AIConfigurator system folder under ``family``, each from the release nearest the GEMMs'
    ``version`` (so one run's kernels come from one release where possible), and the releases ("" if none):
    ``'1.3.0rc20'``, or ``'<mla> (batched matmuls <bmm>)'`` where they differ."""
    from simulator.cost.kernel_tables import aiconfigurator

    files = {phase: f"{phase}_mla_perf.parquet" for phase in PHASES}
    both = set(aiconfigurator.measured_versions(root, folder, "mla", family, files["context"]))
    versions = [v for v in aiconfigurator.measured_versions(root, folder, "mla", family, files["generation"])
                if v in both]
    bmm_versions = aiconfigurator.measured_versions(root, folder, "mla_bmm", family, "mla_bmm_perf.parquet")
    if not versions or not bmm_versions:
        return None, ""
    wanted = aiconfigurator.release(version)
    chosen = aiconfigurator.nearest_release(versions, wanted)
    bmm_chosen = aiconfigurator.nearest_release(bmm_versions, wanted)
    context, generation = (read_mla_table(str(root / folder / "mla" / family / chosen / files[phase]), phase, display,
                                          family, chosen) for phase in PHASES)
    bmm = read_bmm_table(str(root / folder / "mla_bmm" / family / bmm_chosen / "mla_bmm_perf.parquet"), display,
                         family, bmm_chosen)
    label = chosen if bmm_chosen == chosen else f"{chosen} (batched matmuls {bmm_chosen})"
    return MlaTables(context, generation, bmm), label
