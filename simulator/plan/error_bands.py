"""Error bands: the typical out-of-sample error of a class of predictions, for headline figures.

A band is the (10th, 90th) percentile of the signed out-of-sample relative errors,
(predicted - measured) / measured, of the validation rows of one class, with the row count.
A band of -12%..+30% means 8 of 10 such predictions were between 12% below and 30% above the
measurement. For a time (TTFT, TPOT, e2e) below means the simulator was too fast; for a rate
(throughput) above does: :func:`band_reading` says which in words.

Classes, finest first (:func:`lookup_band` takes the first with at least :data:`MIN_ROWS` rows):

1. ``full``: GPU family x engine x regime x metric kind;
2. ``family_regime``: GPU family x regime x metric kind;
3. ``regime``: regime x metric kind.

The metric kind (ttft, tpot, e2e, throughput) is kept at every level: a time and a rate err
in opposite directions, so pooling them would blur the band's sign. A class with fewer rows
says so (the lookup's ``reason``) instead of inventing a band.

The bands are precomputed from the validation table into ``validation/error_bands.json``
(``simulate validate --write-bands``), so a normal run only reads that small file.
Percentiles are numpy's default (linear interpolation between order statistics).

This module reads the shipped bands for a run; :mod:`simulator.validation.bands` computes and writes them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.files import read_text
from simulator.model.gpu_family import family_of
from simulator.model.registry import validation_file

MIN_ROWS = 5


QUANTILES = (10.0, 90.0)


LEVELS = ("full", "family_regime", "regime")


SCHEMA = "memwall-error-bands/1"


LONG_CONTEXT_TOKENS = 32_768
"""The table's ``long_context`` regime starts here (context >= 32k tokens)."""


def bands_file() -> Path:
    """Where the shipped bands live (beside the validation table)."""
    return validation_file("error_bands.json")


@dataclass(frozen=True)
class Band:
    """(low, high) signed relative error quantiles of ``rows`` validation rows of one class."""

    low: float
    high: float
    rows: int
    level: str
    family: str | None
    engine: str | None
    regime: str
    metric_kind: str
    note: str = ""

    @property
    def label(self) -> str:
        parts = [p for p in (self.family, self.engine, self.regime, self.metric_kind) if p]
        return " / ".join(parts)

    def text(self) -> str:
        """``typical error -12%..+30%, from 14 validation rows (hopper / serving / ttft): the prediction ran ...``."""
        return (f"typical error {100 * self.low:+.0f}%..{100 * self.high:+.0f}%, from {self.rows} validation rows "
                f"({self.label}): {band_reading(self.low, self.high, self.metric_kind)}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "low": self.low, "high": self.high, "rows": self.rows, "level": self.level, "family": self.family,
            "engine": self.engine, "regime": self.regime, "metric_kind": self.metric_kind,
            "quantiles": [q / 100 for q in QUANTILES], "note": self.note or None,
        }


def class_key(level: str, family: str | None, engine: str | None, regime: str, kind: str) -> tuple:
    if level == "full":
        return (level, family, engine, regime, kind)
    if level == "family_regime":
        return (level, family, None, regime, kind)
    return (level, None, None, regime, kind)


@functools.lru_cache(maxsize=4)
def _load(path: Path, stamp: float) -> dict[tuple, dict[str, Any]]:
    try:
        data = json.loads(read_text(path, "error bands"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: cannot read the error bands ({exc}); regenerate with `simulate validate --write-bands`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("classes"), list):
        raise InputError(f"{path}: not an error-bands file (expected \"schema\": \"{SCHEMA}\")")
    table = {}
    for entry in data["classes"]:
        try:
            key = class_key(entry["level"], entry["family"], entry["engine"], entry["regime"], entry["metric_kind"])
        except (KeyError, TypeError):
            raise InputError(f"{path}: a class lacks level/family/engine/regime/metric_kind") from None
        table[key] = entry
    return table


def load_bands(path: Path | None = None) -> dict[tuple, dict[str, Any]] | None:
    """The classes of a bands file by key, or None when there is none."""
    path = bands_file() if path is None else path
    if not path.is_file():
        return None
    return _load(path, path.stat().st_mtime)


@dataclass(frozen=True)
class BandLookup:
    """A band, or None with the reason (too few rows in every class, or no bands file)."""

    band: Band | None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        if self.band is not None:
            return self.band.as_dict()
        return {"low": None, "high": None, "rows": 0, "reason": self.reason}


def lookup_band(gpu_family: str | None, engine: str | None, regime: str, metric_kind: str,
                path: Path | None = None) -> BandLookup:
    """The band of the finest class with >= MIN_ROWS rows (see the module docstring)."""
    table = load_bands(path)
    if table is None:
        return BandLookup(None, "no error bands shipped (simulate validate --write-bands writes them)")
    thin: list[str] = []
    for level in LEVELS:
        key = class_key(level, gpu_family, engine, regime, metric_kind)
        entry = table.get(key)
        rows = 0 if entry is None else int(entry["rows"])
        if entry is not None and rows >= MIN_ROWS and entry["low"] is not None:
            note = f"finer classes have too few rows ({'; '.join(thin)})" if thin else ""
            return BandLookup(Band(float(entry["low"]), float(entry["high"]), rows, level, key[1], key[2], regime,
                                   metric_kind, note))
        thin.append(f"{' / '.join(str(p) for p in key[1:] if p)}: {rows}")
    return BandLookup(None, f"fewer than {MIN_ROWS} validation rows in every class ({'; '.join(thin)})")


def error_band(gpu_family: str | None, engine: str | None, regime: str, metric_kind: str,
               path: Path | None = None) -> Band | None:
    """The typical out-of-sample error of a prediction of this class, or None (see :func:`lookup_band` for why)."""
    return lookup_band(gpu_family, engine, regime, metric_kind, path).band


def regime_of_run(metric_kind: str, batch: int, context_tokens: int, serving: bool) -> str:
    """The validation regime a run's headline figure belongs to (the table's ``regime`` column)."""
    if serving:
        return "serving"
    if context_tokens >= LONG_CONTEXT_TOKENS:
        return "long_context"
    if metric_kind == "ttft":
        return "prefill"
    return "decode_b1" if batch == 1 else "decode_batch"


HEADLINE_KINDS = ("ttft", "tpot", "e2e", "throughput")


def run_error_bands(gpu: str, engine: str | None, batch: int, context_tokens: int, serving: bool,
                    path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The ``error_band`` objects of a run's headline figures, by metric kind (ttft, tpot, e2e, throughput).

    ``gpu``: the run's GPU name; ``engine``: its engine profile (vllm when None); ``serving``:
    arrivals over time (a rate or a trace) rather than a closed batch. Each object is
    :meth:`Band.as_dict` or ``{"low": null, "high": null, "rows": 0, "reason": ...}``.
    """
    family = family_of(gpu)
    out = {}
    for kind in HEADLINE_KINDS:
        regime = regime_of_run(kind, batch, context_tokens, serving)
        out[kind] = lookup_band(family, engine or "vllm", regime, kind, path).as_dict()
    return out


RATE_KINDS = frozenset({"throughput"})
"""Metric kinds that are rates: a prediction above the measurement is the simulator being too fast (for a time,
too slow)."""


def _end(error: float, kind: str) -> str:
    """One end of a band in words: ``46% below (too fast)``. ``error``: (predicted - measured) / measured."""
    side = "below" if error < 0 else "above"
    too_fast = (error > 0) == (kind in RATE_KINDS)  # a low time or a high rate flatters the deployment
    return f"{abs(100 * error):.0f}% {side} ({'too fast' if too_fast else 'too slow'})"


def band_reading(low: float, high: float, kind: str) -> str:
    """The band as a sentence whose sign cannot be misread: ``the prediction ran 46% below (too fast) to 19%
    above (too slow) the measurement``; 'too fast' means the simulator promised more speed than was measured."""
    return f"the prediction ran {_end(low, kind)} to {_end(high, kind)} the measurement"


def band_text(band: dict[str, Any]) -> str:
    """``the prediction ran 46% below (too fast) to 19% above (too slow) the measurement (10th-90th percentile,
    40 validation rows)`` or the reason there is none (for reports)."""
    if band.get("low") is None:
        return f"no error band: {band.get('reason', 'unknown')}"
    low, high = (round(q * 100) for q in band.get("quantiles", [q / 100 for q in QUANTILES]))
    return (f"{band_reading(band['low'], band['high'], band.get('metric_kind', ''))} "
            f"({low}th-{high}th percentile, {band['rows']} validation rows)")


def error_bands_for_run(run: Any, path: Path | None = None) -> dict[str, dict[str, Any]]:
    """:func:`run_error_bands` of an ``EngineRun`` (``simulator.plan.run``): what the report shows beside its figures.

    The run is *serving* when its workload is not a closed batch; its context is the mean
    prompt plus the mean output; its engine is the System's engine profile (vllm without one).
    """
    try:
        system, workload = run.deployment.system, run.workload
        gpu = system.gpu.name
        context = round(float(workload.prompt_tokens.mean()) + float(workload.output_tokens.mean()))
        serving = workload.kind != "closed"
    except (AttributeError, ValueError):  # a run shape the bands do not describe (no GPU or no requests)
        reason = {"low": None, "high": None, "rows": 0, "reason": "no validation class for this run"}
        return {kind: dict(reason) for kind in HEADLINE_KINDS}
    engine = getattr(getattr(system, "engine", None), "name", None)
    return run_error_bands(gpu, engine, len(workload), context, serving, path)
