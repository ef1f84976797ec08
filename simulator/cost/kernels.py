"""Kernel efficiency by shape and size: what one flat efficiency per GPU cannot say. Pure functions.

The GPU YAML's ``efficiency.compute`` and ``efficiency.memory`` stay as *ceilings* (what large,
well-shaped kernels reach); these functions scale them for the kernel at hand. A measured overlay
(``efficiency_by_op``) replaces both, since a measurement already contains the shape.

GEMM (tile and wave quantisation; NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
Background User's Guide", sections on tile and wave quantization). A GEMM of ``M`` rows (tokens)
and ``N`` output columns runs as ``ceil(M / b_m) * ceil(N / b_n)`` output tiles, scheduled on the
``S`` SMs in ``ceil(tiles / S)`` waves; every tile costs as much as a full one and every wave as
much as a full one, so the fraction of the work capacity spent on real outputs is

    shape(M, N) = M N / (ceil(tiles / S) * S * b_m * b_n).

When the tiles are too few to fill the SMs, cuBLAS splits the reduction dimension K among
``s`` work units per tile (split-K; CUTLASS's split-K and stream-K kernels, Osama et al.,
"Stream-K", PPoPP 2023), so the waves count ``tiles * s`` units:

    shape(M, N, K) = M N / (ceil(M / b_m) b_m * ceil(N / b_n) b_n)
                     * tiles * s / (ceil(tiles * s / S) * S),

with ``s`` in :data:`SPLIT_K` and every split at least :data:`MIN_SPLIT_DEPTH` deep. Weight-only
quantised GEMMs (int4/int8 weights, fp16 activations: Marlin, AWQ and GPTQ kernels) tile rows by 16
(:data:`WEIGHT_ONLY_TILES`), so a batch-1 decode pads one row to 16, not to 64. The tile and
split are the best for the shape, as cuBLAS's heuristics choose among their kernels (the partial
sums' extra traffic, ~s M N 4 bytes, is left out). Compute time then uses
``peak * efficiency.compute * shape(M, N, K)``.

Memory (small transfers are latency-bound; Little's law): a kernel that moves ``b`` bytes needs
the DRAM latency ``L`` before its stream reaches full rate, so it reaches

    eta_m(b) = eta_max * b / (b + b_half),   b_half = bandwidth * L,

i.e. its memory time is ``(b + b_half) / (bandwidth * eta_max)``: one latency per kernel on top of
the streaming time. ``L`` is ``efficiency.memory_latency_seconds`` (default 0.5 us: HBM load
latency measured by pointer chasing on A100 and H100 is ~0.45-0.6 us, Chips and Cheese, "Nvidia's
H100: Funny L2, and Tons of Bandwidth", 2023; Luo et al., "Benchmarking and Dissecting the Nvidia
Hopper GPU Architecture", 2024).

Attention: FlashAttention prefill is compute-bound and runs at its own ceiling,
``efficiency.attention_compute`` of the tensor peak (default 0.70: FlashAttention-2 reaches 50-73%
of A100 peak, Dao 2023; FlashAttention-3 75% of H100 fp16 peak, Shah et al. 2024), not at the GEMM
ceiling. Decode attention reads the KV cache with split-K (FlashDecoding, Dao et al. 2023), which
keeps every SM streaming whatever the batch, so it is charged as bandwidth-bound with
``eta_m(b)`` like any other transfer.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from simulator.model.step import Number

GEMM_TILES: tuple[tuple[int, int], ...] = ((64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
"""(rows, columns) output tiles of the tensor-core GEMM kernels of cuBLAS and CUTLASS on Ampere and
Hopper (CUTLASS's default tile configurations; Hopper's wgmma needs row tiles that are multiples
of 64, so no smaller row tile is listed)."""


WEIGHT_ONLY_TILES: tuple[tuple[int, int], ...] = (
    (16, 128), (16, 256), (32, 128), (32, 256), (48, 128), (48, 256), (64, 128), (64, 256))
"""(rows, columns) output tiles of the weight-only quantised GEMMs (int4/int8 weights, fp16 compute):
Marlin processes rows in blocks of 16 (``thread_m_blocks`` 1 to 4, i.e. 16 to 64 rows) against 128 or
256 columns (``thread_n``), and reaches "close to ideal (4x) speedups up to batchsizes of 16-32 tokens"
(IST-DASLab/marlin, README and marlin_cuda_kernel.cu); AWQ's and GPTQ's GEMV/GEMM kernels also work on
16-row MMA fragments (mma.m16n8k16)."""


SPLIT_K: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
"""Split-K factors considered (CUTLASS's split-K GEMMs take any factor; these cover the useful range)."""

MIN_SPLIT_DEPTH = 256
"""Least K per split: four k-tiles of 64, below which a split's prologue and epilogue dominate."""


def gemm_shape_efficiency(rows: Number, columns: int, sm_count: int, depth: int = 0,
                          tiles: tuple[tuple[int, int], ...] = GEMM_TILES) -> Number:
    """``shape(M, N, K)`` of the module docstring, best over ``tiles`` and splits; 1 where nothing runs.

    ``rows`` (tokens, may be an array), ``columns`` (output features on this GPU) and ``depth``
    (K, input features; 0: no split-K); with an unknown SM count (``sm_count`` 0) only tile
    quantisation applies. An array is worked out once per distinct row count (the engine's decode
    stretches hold few distinct batch sizes).
    """
    if isinstance(rows, np.ndarray):
        distinct, where = np.unique(rows, return_inverse=True)
        values = np.array([_shape_efficiency(float(r), columns, sm_count, depth, tiles) for r in distinct])
        return values[where].reshape(np.shape(rows))
    return _shape_efficiency(float(rows), columns, sm_count, depth, tiles)


@functools.lru_cache(maxsize=65536)
def _shape_efficiency(rows: float, columns: int, sm_count: int, depth: int,
                      tiles: tuple[tuple[int, int], ...] = GEMM_TILES) -> float:
    if rows <= 0 or columns <= 0:
        return 1.0
    splits = [s for s in SPLIT_K if s == 1 or depth >= s * MIN_SPLIT_DEPTH] if sm_count > 0 else [1]
    best = 0.0
    for tile_rows, tile_columns in tiles:
        row_tiles = math.ceil(rows / tile_rows)
        column_tiles = math.ceil(columns / tile_columns)
        tile_efficiency = rows * columns / (row_tiles * tile_rows * column_tiles * tile_columns)
        tile_count = row_tiles * column_tiles
        for split in splits:
            units = tile_count * split
            wave = units / (math.ceil(units / sm_count) * sm_count) if sm_count > 0 else 1.0
            best = max(best, tile_efficiency * wave)
    return best


def memory_half_bytes(bandwidth_bytes_per_second: float, latency_seconds: float) -> float:
    """``b_half = bandwidth * L``: the bytes a kernel moves before it reaches half its streaming rate."""
    return bandwidth_bytes_per_second * latency_seconds


def memory_efficiency(moved_bytes: Number, ceiling: float, half_bytes: float) -> Number:
    """``eta_m(b) = eta_max * b / (b + b_half)`` (for reports; the cost model uses the equivalent time form)."""
    return ceiling * moved_bytes / (moved_bytes + half_bytes) if half_bytes else ceiling + 0.0 * moved_bytes
