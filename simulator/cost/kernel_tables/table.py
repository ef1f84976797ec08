"""The internal format of a measured kernel table: latencies in seconds on a grid of shape keys."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.errors import InputError

GEMM_DTYPES: tuple[str, ...] = ("bf16", "fp8", "fp8_block", "nvfp4", "int8_wo", "int4_wo")
"""GEMM formats a table may hold: bf16 (fp16 runs the same tensor-core rate), per-tensor FP8 with dynamic
activation scales, FP8 with 1x128 block scales, NVFP4, and the weight-only int8/int4 kernels (fp16 compute)."""


@dataclass(frozen=True)
class TableOrigin:
    """Where a table's numbers come from: the GPU, engine and release they were measured on, and the file."""

    gpu: str
    """the measured GPU as its source names it (e.g. "H100 SXM")"""
    engine: str
    """the engine whose kernels were timed: trtllm, vllm or sglang for AIConfigurator's tables; a kernel-table
    file's ``# engine:`` line as written (``torch`` for ``simulate calibrate``'s, ``unstated`` where it has none)"""
    version: str
    """the engine release the kernels come from"""
    path: str
    """the file read"""
    includes: str = ""
    """what each latency includes, as the collector measured it"""

    def label(self) -> str:
        names = {"trtllm": "TensorRT-LLM", "vllm": "vLLM", "sglang": "SGLang"}
        return f"{self.gpu} / {names.get(self.engine, self.engine)} {self.version}"


def mean_grid(seconds: np.ndarray, *coordinates: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows (coordinates..., seconds) as a grid: the distinct values of each coordinate, ascending, and the mean
    latency of the rows at each combination (duplicate rows averaged; NaN where no row was measured)."""
    axes, where = zip(*(np.unique(c, return_inverse=True) for c in coordinates))
    total = np.zeros(tuple(len(a) for a in axes))
    count = np.zeros_like(total)
    np.add.at(total, where, np.asarray(seconds, dtype=float))
    np.add.at(count, where, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return list(axes), np.where(count > 0, total / count, np.nan)


def suffix_minimum(grid: np.ndarray) -> tuple[np.ndarray, float]:
    """Each latency the least of its own and those of every larger measured size along each axis, and the largest
    relative cut that made. A smaller problem can always run as a larger one (padded), so a latency above that of
    a larger size is the kernel choice's or the clock's noise, not the work's. Missing (NaN) cells stay missing
    and are skipped."""
    smoothed = grid
    for axis in range(grid.ndim):
        flipped = np.flip(smoothed, axis=axis)
        smoothed = np.where(np.isfinite(grid), np.flip(np.fmin.accumulate(flipped, axis=axis), axis=axis), np.nan)
    with np.errstate(invalid="ignore"):
        cut = np.nanmax(np.where(np.isfinite(grid), 1.0 - smoothed / grid, 0.0))
    return smoothed, float(cut)


@dataclass(frozen=True)
class GemmTable:
    """Measured latencies of one GEMM format: ``seconds[i, j, l]`` for m = m[i] rows, n = n[j] output columns
    and k = k[l] input features (NaN where not measured).

    ``smoothing``: the largest relative cut made to a latency so that it does not fall as m, n or k
    grows. A smaller GEMM can always run as a larger one (its rows or columns padded), so a latency
    above that of a larger shape is the kernel choice's noise, not the work's: each latency is the
    least of its own and those of every larger measured shape (a suffix minimum along each axis).
    E.g. H100's bf16 8192 x 8192 weight: 0.1907 ms measured at 1,024 rows, 0.1765 ms at 1,025, so
    1,024 rows take 0.1765 ms.
    """

    origin: TableOrigin
    dtype: str
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    seconds: np.ndarray
    smoothing: float = 0.0

    @property
    def rows(self) -> int:
        return int(np.isfinite(self.seconds).sum())


def gemm_table(origin: TableOrigin, dtype: str, m: np.ndarray, n: np.ndarray, k: np.ndarray,
               seconds: np.ndarray) -> GemmTable:
    """A :class:`GemmTable` from rows (m, n, k, seconds): duplicates averaged, then non-decreasing along m, n
    and k (a suffix minimum over each axis)."""
    if dtype not in GEMM_DTYPES:
        raise InputError(f"{origin.path}: GEMM dtype '{dtype}' is not one of {', '.join(GEMM_DTYPES)}")
    m, n, k = (np.asarray(a, dtype=np.int64) for a in (m, n, k))
    seconds = np.asarray(seconds, dtype=float)
    if not len(seconds):
        raise InputError(f"{origin.path}: no {dtype} GEMM rows")
    if (m < 1).any() or (n < 1).any() or (k < 1).any() or not np.isfinite(seconds).all() or (seconds <= 0).any():
        raise InputError(f"{origin.path}: {dtype} GEMM rows need m, n, k >= 1 and finite latencies > 0")
    (mu, nu, ku), grid = mean_grid(seconds, m, n, k)
    smoothed, cut = suffix_minimum(grid)
    return GemmTable(origin, dtype, mu, nu, ku, smoothed, cut)
