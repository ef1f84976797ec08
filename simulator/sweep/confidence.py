"""The chance that a configuration meets its SLO, given the error band of its class.

Every run's JSON carries, per headline metric (ttft, tpot, e2e), the error band of its validation
class (:mod:`simulator.plan.error_bands`): quantiles of the signed out-of-sample relative error
e = (predicted - measured) / measured of that class's validation rows. Seen from the other side, the
*ratio* r = measured / predicted = 1 / (1 + e) is what the real deployment will show for each second
the simulator predicts: a 10th-percentile error e_10 is the 90th percentile of r, 1 / (1 + e_10).

A latency limit L on a predicted p99 of p seconds is met when the measured p99, p * r, is <= L:

    P(meets) = P(r <= L / p) = F_r(L / p)

**The distribution F_r.** The bands file stores quantiles, not the rows: today the 10th and 90th
percentiles of e (``quantiles`` [0.1, 0.9] beside ``low``/``high``). F_r is taken as the piecewise
linear CDF through those knots, (1 / (1 + e_q), 1 - q), and beyond the outermost knots it goes on
at the slope of the nearest segment until it reaches 0 and 1. With two knots that is the uniform
distribution whose 10th and 90th percentiles are the band's ends: the inner 80% of the mass where the
band puts it, 10% on each side within an eighth of the band's width. (The tails are therefore thin:
beyond that eighth F_r says 0 or 1, which the few rows of a class cannot contradict; a class with more
quantiles stored gets more knots without a change here.) A band whose ends coincide is a step at that
ratio.

**Several limits.** The chance of meeting them all is the product of the per-metric chances, i.e.
their errors are taken as independent. The TTFT and TPOT errors of one run tend to err the same way
(one GPU or engine mis-modelled); under such positive correlation the true joint chance is at least
the product, so the product is the conservative reading.

The band was measured on the class's headline figures (means and medians, mostly), and is applied
here to the p99 the SLO names: the p99's own error is not measured separately.

Units: seconds for latencies and limits; probabilities in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def ratio_knots(band: Mapping[str, Any]) -> list[tuple[float, float]] | None:
    """(ratio measured/predicted, cumulative probability) knots of a band dict, by rising ratio; None without a band.

    ``band``: a run's ``error_band.<metric>`` object: ``low``/``high`` are the errors at ``quantiles``
    (default [0.1, 0.9]).
    """
    low, high = band.get("low"), band.get("high")
    if low is None or high is None:
        return None
    quantiles = band.get("quantiles") or [0.1, 0.9]
    errors = [float(low), float(high)]
    if len(quantiles) != len(errors) or not all(math.isfinite(e) and e > -1.0 for e in errors):
        return None
    # e at quantile q is r = 1 / (1 + e) at cumulative probability 1 - q (r falls as e rises).
    knots = sorted((1.0 / (1.0 + e), 1.0 - float(q)) for e, q in zip(errors, quantiles))
    return knots


def ratio_cdf(x: float, knots: list[tuple[float, float]]) -> float:
    """F_r(x): the chance that measured / predicted <= ``x``, piecewise linear through ``knots`` (see module)."""
    ratios = [r for r, _ in knots]
    probs = [c for _, c in knots]
    if ratios[-1] - ratios[0] <= 0.0:  # a band of zero width: all the mass at one ratio
        return 1.0 if x >= ratios[0] else 0.0
    first = (probs[1] - probs[0]) / (ratios[1] - ratios[0])
    last = (probs[-1] - probs[-2]) / (ratios[-1] - ratios[-2])
    xs = [ratios[0] - probs[0] / first, *ratios, ratios[-1] + (1.0 - probs[-1]) / last]
    ys = [0.0, *probs, 1.0]
    return float(np.clip(np.interp(x, xs, ys), 0.0, 1.0))


def chance_within(predicted_seconds: float | None, limit_seconds: float, band: Mapping[str, Any] | None) -> float | None:
    """P(measured <= ``limit_seconds``) for a prediction of ``predicted_seconds`` in a class with ``band``.

    None when there is no prediction or no band to judge it by.
    """
    if predicted_seconds is None or band is None or not math.isfinite(predicted_seconds):
        return None
    knots = ratio_knots(band)
    if knots is None:
        return None
    if predicted_seconds <= 0.0:
        return 1.0
    return ratio_cdf(limit_seconds / predicted_seconds, knots)


def slo_chances(result: Mapping[str, Any], slo: Mapping[str, float],
                p99: Any) -> tuple[dict[str, float | None], float | None]:
    """({metric: P(meets its limit)}, P(meets all)) for a run's JSON ``result``; ``p99(result, metric)`` reads the
    predicted p99 seconds. The joint chance is the product (see module) or None when any metric's is unknown."""
    bands = result.get("error_band") or {}
    chances: dict[str, float | None] = {}
    for metric, limit in slo.items():
        band = bands.get(metric) if isinstance(bands, Mapping) else None
        chances[metric] = chance_within(p99(result, metric), limit, band)
    known = [c for c in chances.values() if c is not None]
    joint = math.prod(known) if len(known) == len(chances) and chances else None
    return chances, joint


def chance_text(metric: str, limit_seconds: float, predicted_seconds: float | None, chance: float | None) -> str:
    """``meets TTFT p99 <= 1 s: predicted 0.82 s, 91% likely`` (or why there is no chance)."""
    predicted = "no prediction" if predicted_seconds is None else f"predicted {predicted_seconds:.3g} s"
    likely = "no error band to judge it by" if chance is None else f"{100 * chance:.0f}% likely"
    return f"meets {metric.upper()} p99 <= {limit_seconds:g} s: {predicted}, {likely}"


def check_confidence(value: float | None, where: str = "--confidence") -> float | None:
    """``value`` if it is None or a probability in (0, 1]; else ValueError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < float(value) <= 1.0):
        raise ValueError(f"{where}: must be a probability in (0, 1], e.g. 0.9 (got {value!r})")
    return float(value)
