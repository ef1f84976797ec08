"""FLOPs and HBM bytes of each calibration case, counted exactly as the cost model counts them.

An efficiency is (work the cost model counts) / (peak x measured time), so the counts must be
the cost model's own: GEMM and attention cases build the :mod:`simulator.model.layers` operator of
that shape and ask it for ``work(step)``. Pure functions, no PyTorch.

Conventions (those of :mod:`simulator.model.layers`):
- a GEMM of ``m`` tokens through a ``k x n`` weight reads the weight once, reads ``m x k``
  activations and writes ``m x n``; fp8 weights are 1 byte but activations stay 2 bytes (fp16).
- attention is the flash kernel without I/O fusion: the KV cache is read once per sequence
  (plus once per query row tile in prefill), the new K/V are written, q is read and the
  output written.
- an elementwise add of two ``tokens x width`` tensors reads both and writes one.
- a device-to-device copy of ``n`` bytes reads ``n`` and writes ``n``; a read-reduce reads ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model.operators import Attention, Gemm
from simulator.model.precision import DTYPE_BYTES
from simulator.model.step import Step

ACTIVATION_DTYPE = {"fp16": "fp16", "bf16": "bf16", "fp8": "fp16", "fp32": "fp32"}


@dataclass(frozen=True)
class Work:
    """FLOPs and HBM bytes of one case (the cost model's counts)."""

    flops: float
    bytes: float


def gemm_work(tokens: int, in_features: int, out_features: int, dtype: str) -> Work:
    """One ``tokens x in_features @ in_features x out_features`` weight GEMM in ``dtype``."""
    activation = ACTIVATION_DTYPE[dtype]
    op = Gemm(
        name="calibration",
        count=1,
        in_features=in_features,
        out_features=out_features,
        params=in_features * out_features,
        resident_bytes=in_features * out_features * DTYPE_BYTES[dtype],
        weight_bytes_per_element=DTYPE_BYTES[dtype],
        scale_bytes_per_weight=0.0,
        bias_elements=0,
        activation_bytes_per_element=DTYPE_BYTES[activation],
        compute_dtype=dtype,
    )
    work = op.work(Step.decode(tokens, 1))
    return Work(flops=float(work.flops), bytes=float(work.weight_bytes + work.activation_bytes))


def attention_step(phase: str, batch: int, context: int) -> Step:
    """Decode: ``batch`` queries each attending ``context`` keys; prefill: ``batch`` prompts of ``context`` tokens."""
    if phase == "decode":
        return Step.decode(batch, context)
    return Step.prefill(batch, context)


def attention_work(
    phase: str, batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int, dtype: str, query_tile_rows: int
) -> Work:
    """One flash-attention call (one layer) for ``attention_step(phase, batch, context)``."""
    b = DTYPE_BYTES[dtype]
    op = Attention(
        name="calibration",
        count=1,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_bytes_per_element=b,
        activation_bytes_per_element=b,
        compute_dtype=dtype,
        kernel="flash",
        query_tile_rows=query_tile_rows,
        io_fused=False,
    )
    work = op.work(attention_step(phase, batch, context))
    moved = work.kv_read_bytes + work.kv_write_bytes + work.activation_bytes
    return Work(flops=float(work.flops), bytes=float(moved))


def attention_tokens(phase: str, batch: int, context: int) -> int:
    """New tokens of the step: the count the cost model buckets attention efficiencies by."""
    return batch if phase == "decode" else batch * context


def elementwise_add_work(tokens: int, width: int, dtype: str) -> Work:
    """``out = a + b`` over ``tokens x width`` elements."""
    elements = tokens * width
    return Work(flops=float(elements), bytes=3.0 * elements * DTYPE_BYTES[dtype])


def copy_bytes(buffer_bytes: int) -> float:
    """HBM bytes a device-to-device copy of ``buffer_bytes`` moves: read once, written once."""
    return 2.0 * buffer_bytes


def read_bytes(buffer_bytes: int) -> float:
    """HBM bytes a read-reduce (sum) of ``buffer_bytes`` moves."""
    return float(buffer_bytes)


def copies_to_defeat_cache(set_bytes: float, cache_bytes: float, most: int = 16) -> int:
    """Buffer sets to cycle through so that repeated calls miss a cache of ``cache_bytes``.

    Cycling through sets that total at least three times the cache makes each set leave
    the cache before it is used again.
    """
    if cache_bytes <= 0 or set_bytes <= 0:
        return 1
    needed = -(-3.0 * cache_bytes // set_bytes)
    return int(max(1, min(most, needed)))
