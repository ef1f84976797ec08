"""GEMM latency from a measured table: one curve in the row count m per (n, k) shape of an operator.

The table's n and k are a grid (AIConfigurator's: 22 sizes from 32 to 65,536 each) and m another
(74 sizes from 1 to 32,768), so an operator's fixed (n, k) is interpolated once, bilinearly in
(log n, log k) of log latency, into a curve over the measured m; a step's m is then interpolated
on that curve, linearly in (log m, log latency). Latency is close to a power law in each size
(flat while the weight read dominates, linear in m once compute does), which log-log
interpolation follows between grid points.

Never a silent extrapolation: beyond the table's range the operator's roofline (its speed of
light, ``max(2mnk / peak, bytes / bandwidth)`` at the GPU's datasheet peak and bandwidth) gives
the shape, scaled to agree with the table at its edge: a (n, k) outside the grid takes the edge
shape's curve times roofline(m, n, k) / roofline(m, n_edge, k_edge), an m beyond the curve the
edge latency times roofline(m) / roofline(m_edge). AIConfigurator's own query holds the
measured fraction of speed of light at the edge the same way (``perf_interp.rs``, step 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cost.kernel_tables.table import GemmTable
from simulator.model.step import Number


@dataclass(frozen=True)
class GemmShape:
    """The roofline of one GEMM shape: what the edge scaling needs (SI units)."""

    n: int
    k: int
    weight_bytes_per_element: float
    activation_bytes_per_element: float
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float

    def roofline_seconds(self, m: Number, n: Number | None = None, k: Number | None = None) -> Number:
        """Speed-of-light seconds of an m x k by k x n GEMM: the larger of its FLOPs and its bytes over the peaks."""
        n = self.n if n is None else n
        k = self.k if k is None else k
        flops = 2.0 * m * n * k
        moved = self.weight_bytes_per_element * n * k + self.activation_bytes_per_element * (m * k + m * n)
        return np.maximum(flops / self.peak_flops_per_second, moved / self.bandwidth_bytes_per_second)


@dataclass(frozen=True)
class GemmCurve:
    """Measured seconds of one (n, k) GEMM as a function of its rows (see the module docstring)."""

    shape: GemmShape
    log_m: np.ndarray
    log_seconds: np.ndarray
    edge_note: str = ""
    """how the curve left the table's (n, k) range, if it did ("" inside it)"""

    @property
    def first_m(self) -> float:
        return float(np.exp(self.log_m[0]))

    @property
    def last_m(self) -> float:
        return float(np.exp(self.log_m[-1]))

    def seconds(self, rows: Number) -> Number:
        """Seconds of one GEMM of ``rows`` rows (0 for no rows); an array for an array of rows."""
        r = np.asarray(rows, dtype=float)
        lo, hi = self.first_m, self.last_m
        clipped = np.clip(r, lo, hi)
        inside = np.exp(np.interp(np.log(clipped), self.log_m, self.log_seconds))
        beyond = r != clipped
        if beyond.any():
            inside = np.where(beyond, inside * self.shape.roofline_seconds(np.maximum(r, 1e-30))
                              / self.shape.roofline_seconds(clipped), inside)
        out = np.where(r > 0, inside, 0.0)
        return float(out) if out.ndim == 0 else out


def _bracket(grid: np.ndarray, x: float) -> tuple[int, int, float]:
    """Indices of the two grid points around ``x`` and the weight of the upper one, in log space."""
    if len(grid) == 1 or x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        last = len(grid) - 1
        return last, last, 0.0
    upper = int(np.searchsorted(grid, x, side="left"))
    if grid[upper] == x:
        return upper, upper, 0.0
    lower = upper - 1
    weight = (np.log(x) - np.log(grid[lower])) / (np.log(grid[upper]) - np.log(grid[lower]))
    return lower, upper, float(weight)


def gemm_curve(table: GemmTable, shape: GemmShape) -> GemmCurve | None:
    """The curve of ``shape``'s (n, k) in ``table``, or None when fewer than two of its rows are measured."""
    n_edge = int(np.clip(shape.n, table.n[0], table.n[-1]))
    k_edge = int(np.clip(shape.k, table.k[0], table.k[-1]))
    j0, j1, wn = _bracket(table.n, n_edge)
    l0, l1, wk = _bracket(table.k, k_edge)
    logs = np.log(table.seconds)
    corners = [(j0, l0, (1 - wn) * (1 - wk)), (j1, l0, wn * (1 - wk)), (j0, l1, (1 - wn) * wk), (j1, l1, wn * wk)]
    value = np.zeros(len(table.m))
    valid = np.ones(len(table.m), dtype=bool)
    for j, lk, weight in corners:
        if weight == 0.0:
            continue
        column = logs[:, j, lk]
        valid &= np.isfinite(column)
        value = value + weight * np.where(np.isfinite(column), column, 0.0)
    if valid.sum() < 2:
        return None
    m = table.m[valid].astype(float)
    log_seconds = value[valid]
    note = ""
    if (n_edge, k_edge) != (shape.n, shape.k):
        # Outside the measured shapes: the edge shape's latency times the roofline's ratio, row by row.
        log_seconds = log_seconds + np.log(shape.roofline_seconds(m) / shape.roofline_seconds(m, n_edge, k_edge))
        note = (f"n x k = {shape.n} x {shape.k} is outside the table ({table.n[0]}..{table.n[-1]} x "
                f"{table.k[0]}..{table.k[-1]}): its roofline scaled to the table at {n_edge} x {k_edge}")
    return GemmCurve(shape, np.log(m), log_seconds, note)
