"""One measured batch's latency curve in plain floats, and its lookups as functions of the length alone.

A measured attention table holds, per batch size, the log seconds at a few log lengths
(:mod:`simulator.cost.kernel_tables.attention`). Looking one up is linear in (log length, log
seconds) inside the measured lengths and the roofline's ratio beyond them. The engine costs most
steps one at a time, in Python floats; a traced decode tick (:mod:`simulator.cost.tracing`) calls a
lookup once per tick, so the builders here resolve a batch's rows once and return a closure with
the search inlined. Every closure performs, row by row, the same IEEE operations as
:func:`log_linear` plus the edge ratio, so its floats equal the scalar lookup's bit for bit.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

SequenceSeconds = Callable[[float], float]
"""The roofline's seconds of one sequence at a length (its ratio scales a lookup beyond a row's ends)."""


def log_linear(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` at ``x``, linear between the points of increasing ``xs`` and held at the end points beyond them (in
    plain floats: the scalar lookups' speed, and the array lookups repeat the same arithmetic entry by entry)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_left(xs, x)
    w = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
    return ys[j - 1] + w * (ys[j] - ys[j - 1])


@dataclass(frozen=True, eq=False)
class CurveRow:
    """One measured batch's curve in plain floats: the lookup runs in Python floats, and an array lookup repeats
    the same IEEE operations entry by entry (:meth:`~simulator.cost.kernel_tables.attention.PhaseCurve.seconds_array`)."""

    log_lengths: list[float]
    log_seconds: list[float]
    first: float
    """the shortest measured length, ``exp(log_lengths[0])`` (the clip bounds of every lookup, so worked out once)"""
    last: float
    log_lengths_array: np.ndarray
    log_seconds_array: np.ndarray


def curve_row(log_lengths: np.ndarray, log_seconds: np.ndarray) -> CurveRow:
    lens, secs = log_lengths.tolist(), log_seconds.tolist()
    return CurveRow(lens, secs, math.exp(lens[0]), math.exp(lens[-1]), np.asarray(lens, dtype=float),
                    np.asarray(secs, dtype=float))


def same_lengths(low: CurveRow, high: CurveRow) -> bool:
    """Were the two rows measured at the same lengths (one clip, logarithm and search serve both)?"""
    return (low.log_lengths, low.first, low.last) == (high.log_lengths, high.first, high.last)


def row_seconds(row: CurveRow, scale: float, sequence: SequenceSeconds) -> Callable[[float], float]:
    """``exp(log seconds of row at length) * scale`` as a function of the length."""
    log_seconds, exp = row_log_seconds(row, sequence), math.exp
    return lambda length: exp(log_seconds(length)) * scale


def row_log_seconds(row: CurveRow, sequence: SequenceSeconds) -> Callable[[float], float]:
    """The row's log seconds at a length: :func:`log_linear` inside its lengths, plus the roofline's log ratio
    beyond them."""
    xs, ys, first, last, n = row.log_lengths, row.log_seconds, row.first, row.last, len(row.log_lengths)
    x0, xn = xs[0], xs[-1]
    log, search = math.log, bisect.bisect_left

    def log_seconds(length: float) -> float:
        clipped = first if length < first else last if length > last else length  # min(max(...)), without calls
        x = log(clipped)
        if n == 1 or x <= x0:
            a = ys[0]
        elif x >= xn:
            a = ys[-1]
        else:
            j = search(xs, x)
            a = ys[j - 1] + (x - xs[j - 1]) / (xs[j] - xs[j - 1]) * (ys[j] - ys[j - 1])
        if clipped != length:
            a += log(sequence(length) / sequence(clipped))
        return a

    return log_seconds


def blended_rows_seconds(low: CurveRow, high: CurveRow, w: float, scale: float,
                         sequence: SequenceSeconds) -> Callable[[float], float]:
    """``exp((1 - w) * low + w * high) * scale`` of the two rows' log seconds, as a function of the length."""
    if same_lengths(low, high):
        return _alike_rows_seconds(low, high, w, scale, sequence)
    low_log, high_log, exp = row_log_seconds(low, sequence), row_log_seconds(high, sequence), math.exp
    keep = 1.0 - w
    return lambda length: exp(keep * low_log(length) + w * high_log(length)) * scale


def _alike_rows_seconds(low: CurveRow, high: CurveRow, w: float, scale: float,
                        sequence: SequenceSeconds) -> Callable[[float], float]:
    """:func:`blended_rows_seconds` of two rows measured at the same lengths: one clip, logarithm and search."""
    xs, a_ys, b_ys = low.log_lengths, low.log_seconds, high.log_seconds
    first, last, n, x0, xn = low.first, low.last, len(xs), xs[0], xs[-1]
    log, exp, search = math.log, math.exp, bisect.bisect_left
    keep = 1.0 - w

    def seconds(length: float) -> float:
        clipped = first if length < first else last if length > last else length
        x = log(clipped)
        if n == 1 or x <= x0:
            a, b = a_ys[0], b_ys[0]
        elif x >= xn:
            a, b = a_ys[-1], b_ys[-1]
        else:
            j = search(xs, x)
            t = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
            a = a_ys[j - 1] + t * (a_ys[j] - a_ys[j - 1])
            b = b_ys[j - 1] + t * (b_ys[j] - b_ys[j - 1])
        if clipped != length:
            beyond = log(sequence(length) / sequence(clipped))
            a, b = a + beyond, b + beyond
        return exp(keep * a + w * b) * scale

    return seconds
