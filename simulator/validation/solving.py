"""Solving one row: the efficiency at which the engine replay reproduces its measurement (crossval rule 3).

Kept apart from :mod:`simulator.validation.crossval` (which decides *which* rows are solved, and
with what held) so that a worker process (:mod:`simulator.validation.pool`) can solve rows with
nothing but a :class:`~simulator.validation.replay.Replayer` of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from simulator.validation.replay import Efficiencies, Replayer
from simulator.validation.table import Row, is_time_metric

BOUNDS = (0.05, 1.0)
"""Range searched for a row's efficiency; a row outside it says something else is wrong (left out)."""


def row_solution(replayer: Replayer, row: Row, parameter: str, held: float | Efficiencies) -> float | None:
    """The ``parameter`` efficiency reproducing ``row``: 'compute'/'memory' with the other held at ``held``,
    or 'expert' with both ceilings held at ``held`` (an :class:`Efficiencies`); None when none in
    :data:`BOUNDS` does (or a replay is skipped)."""
    def trial(x: float) -> Efficiencies:
        if isinstance(held, Efficiencies):
            return replace(held, expert=x)
        return Efficiencies(x, held) if parameter == "compute" else Efficiencies(held, x)

    def gap(x: float) -> float | None:
        value = replayer.predict(row, trial(x)).value
        if value is None:
            return None
        # log(predicted / measured), made increasing in x: times fall as efficiency rises
        sign = -1.0 if is_time_metric(row.metric) else 1.0
        return sign * math.log(value / row.measured)

    return solve_increasing(gap, *BOUNDS)


def solve_increasing(f: Callable[[float], float | None], low: float, high: float,
                     tolerance: float = 1e-4, iterations: int = 40) -> float | None:
    """The root of an increasing ``f`` in [low, high] (Illinois regula falsi); None if not bracketed or undefined."""
    f_low, f_high = f(low), f(high)
    if f_low is None or f_high is None or f_low > 0 or f_high < 0:
        return None
    if f_low == 0:
        return low
    if f_high == 0:
        return high
    side = 0
    for _ in range(iterations):
        x = (low * f_high - high * f_low) / (f_high - f_low)
        fx = f(x)
        if fx is None:
            return None
        if abs(fx) < tolerance or high - low < tolerance:
            return x
        if fx < 0:
            low, f_low = x, fx
            if side == -1:
                f_high /= 2
            side = -1
        else:
            high, f_high = x, fx
            if side == 1:
                f_low /= 2
            side = 1
    return (low + high) / 2
