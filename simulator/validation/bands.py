"""Error bands from out-of-sample residuals: the classes computed and written to ``validation/error_bands.json``.

What a band is and how a run looks its band up: :mod:`simulator.plan.error_bands`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.files import atomic_write
from simulator.plan.error_bands import LEVELS, MIN_ROWS, QUANTILES, SCHEMA, class_key


@dataclass(frozen=True)
class Residual:
    """One out-of-sample signed relative error and the class it belongs to."""

    family: str
    engine: str
    regime: str
    metric_kind: str
    error: float






def band_of(errors: Iterable[float]) -> tuple[float, float]:
    """(10th, 90th) percentile of signed errors (numpy's linear interpolation)."""
    values = np.asarray(list(errors), dtype=float)
    low, high = np.percentile(values, QUANTILES)
    return float(low), float(high)


def compute_bands(residuals: Iterable[Residual]) -> list[dict[str, Any]]:
    """Every class at every level with its row count; low/high only where rows >= MIN_ROWS."""
    groups: dict[tuple, list[float]] = {}
    for r in residuals:
        if not math.isfinite(r.error):
            continue
        for level in LEVELS:
            groups.setdefault(class_key(level, r.family, r.engine, r.regime, r.metric_kind), []).append(r.error)
    out = []
    for key in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        level, family, engine, regime, kind = key
        errors = groups[key]
        entry: dict[str, Any] = {"level": level, "family": family, "engine": engine, "regime": regime,
                                 "metric_kind": kind, "rows": len(errors), "low": None, "high": None}
        if len(errors) >= MIN_ROWS:
            entry["low"], entry["high"] = band_of(errors)
        out.append(entry)
    return out


def bands_document(residuals: list[Residual], provenance: dict[str, Any]) -> dict[str, Any]:
    """The JSON document written by ``simulate validate --write-bands``."""
    return {
        "schema": SCHEMA,
        "about": "signed out-of-sample relative errors (predicted - measured) / measured of the validation rows, "
                 "leave-one-source-out; low/high = 10th/90th percentiles; classes with fewer than "
                 f"{MIN_ROWS} rows have no band",
        "provenance": provenance,
        "min_rows": MIN_ROWS,
        "quantiles": [q / 100 for q in QUANTILES],
        "classes": compute_bands(residuals),
    }


def write_bands(path: Path, document: dict[str, Any]) -> None:
    """Write the bands file whole or not at all."""
    atomic_write(path, json.dumps(document, indent=1, allow_nan=False) + "\n", "--write-bands")




















