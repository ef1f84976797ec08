"""Request-length data for replay: ``dataset:NAME[:MAX]`` length files and their statistics, scaled to a row's stated means."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.errors import InputError
from simulator.files import read_csv_rows
from simulator.model.registry import validation_file


def dataset_spec(dist: str) -> tuple[str, int | None]:
    """(NAME, MAX) of a ``dataset:NAME`` or ``dataset:NAME:MAX`` distribution (MAX: the source's cap on that
    side's tokens, e.g. a benchmark's max_new_tokens; None: none). Raises ValueError for a MAX that is not an
    integer."""
    name, _, cap = dist.partition(":")[2].partition(":")
    return name, int(cap) if cap else None


@dataclass(frozen=True)
class LengthData:
    """A ``validation/lengths/NAME.csv`` file: paired samples, a histogram, or summary statistics."""

    name: str
    pairs: np.ndarray | None = None
    """(n, 2) integer array of (input, output) token counts"""
    histogram: np.ndarray | None = None
    """(k, 3) array of bucket_low, bucket_high, count"""
    statistics: dict[str, dict[str, float]] | None = None
    """{"input_tokens": {"mean": ..., "median": ...}, "output_tokens": {...}}"""

    def sample(self, side: str, n: int, rng: np.random.Generator, index: np.ndarray | None) -> np.ndarray:
        """``n`` lengths of one side (``input_tokens``/``output_tokens``); ``index`` picks paired rows."""
        if self.pairs is not None:
            column = 0 if side == "input_tokens" else 1
            return self.pairs[index if index is not None else rng.integers(0, len(self.pairs), n), column]
        if self.histogram is not None:
            counts = self.histogram[:, 2].astype(float)
            bucket = rng.choice(len(counts), size=n, p=counts / counts.sum())
            low, high = self.histogram[bucket, 0], self.histogram[bucket, 1]
            return np.floor(low + rng.random(n) * (high - low + 1)).astype(np.int64)
        stats = (self.statistics or {}).get(side, {})
        return _from_statistics(stats, n, rng, f"dataset:{self.name} {side}")

    def mean(self, side: str) -> float | None:
        """The file's mean length of one side in tokens (a histogram: of its bucket midpoints), None if unknown."""
        if self.pairs is not None:
            return float(self.pairs[:, 0 if side == "input_tokens" else 1].mean())
        if self.histogram is not None:
            counts = self.histogram[:, 2]
            return float(((self.histogram[:, 0] + self.histogram[:, 1]) / 2 * counts).sum() / counts.sum())
        return (self.statistics or {}).get(side, {}).get("mean")


def _from_statistics(stats: dict[str, float], n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """Lengths from summary statistics: a log-normal matched to (mean, median) or (mean, std), else the mean.

    Request lengths of chat datasets are right-skewed (mean above median); a log-normal is the
    two-parameter law that keeps both figures: median = e^mu, mean = e^(mu + sigma^2 / 2).
    """
    mean, median, std = stats.get("mean"), stats.get("median", stats.get("p50")), stats.get("std")
    if mean is None and median is None:
        raise InputError(f"{what}: the statistics give neither a mean nor a median")
    if mean is not None and median is not None and mean > median > 0:
        mu, sigma = math.log(median), math.sqrt(2 * math.log(mean / median))
    elif mean is not None and std is not None and mean > 0 and std > 0:
        sigma = math.sqrt(math.log(1 + (std / mean) ** 2))
        mu = math.log(mean) - sigma**2 / 2
    else:
        return np.full(n, round(mean if mean is not None else median), dtype=np.int64)  # type: ignore[arg-type]
    return np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)


@functools.cache
def load_lengths(path: Path) -> LengthData:
    """Read a lengths file by its header; InputError naming the file, line and what is allowed."""
    header, body = read_csv_rows(path, "lengths file")
    name = path.stem

    def numbers(columns: list[str]) -> np.ndarray:
        index = [header.index(c) for c in columns]
        out = np.empty((len(body), len(columns)))
        for i, cells in enumerate(body):
            try:
                out[i] = [float(cells[j]) for j in index]
            except (ValueError, IndexError):
                raise InputError(f"{path}:{i + 2}: expected numbers in columns {', '.join(columns)}") from None
        if not np.all(np.isfinite(out)) or np.any(out < 0):
            raise InputError(f"{path}: every value must be a finite number >= 0")
        return out

    if {"input_tokens", "output_tokens"} <= set(header) and "statistic" not in header:
        pairs = numbers(["input_tokens", "output_tokens"]).astype(np.int64)
        if len(pairs) == 0:
            raise InputError(f"{path}: no samples")
        return LengthData(name, pairs=np.maximum(pairs, 1))
    if {"bucket_low", "bucket_high", "count"} <= set(header):
        hist = numbers(["bucket_low", "bucket_high", "count"])
        if len(hist) == 0 or hist[:, 2].sum() <= 0 or np.any(hist[:, 1] < hist[:, 0]):
            raise InputError(f"{path}: a histogram needs buckets with bucket_low <= bucket_high and counts summing > 0")
        hist[:, 0] = np.maximum(hist[:, 0], 1)
        return LengthData(name, histogram=hist)
    if "statistic" in header:
        stats: dict[str, dict[str, float]] = {"input_tokens": {}, "output_tokens": {}}
        for i, cells in enumerate(body):
            record = dict(zip(header, (c.strip() for c in cells)))
            key = record.get("statistic", "").lower()
            for side, values in stats.items():
                if record.get(side):
                    try:
                        values[key] = float(record[side])
                    except ValueError:
                        raise InputError(f"{path}:{i + 2}: column '{side}': expected a number (got {record[side]!r})") from None
        return LengthData(name, statistics=stats)
    raise InputError(
        f"{path}: unknown lengths file; expected columns input_tokens,output_tokens (a sample), "
        "bucket_low,bucket_high,count (a histogram) or statistic,input_tokens,output_tokens (summary statistics)"
    )


def find_lengths(name: str, dirs: tuple[Path, ...]) -> LengthData:
    for folder in dirs or (validation_file("lengths"),):
        path = folder / f"{name}.csv"
        if path.is_file():
            return load_lengths(path)
    raise InputError(f"dataset:{name}: no lengths file {name}.csv in {', '.join(str(d) for d in dirs)}")




SCALE_TOLERANCE = 0.01
"""A ``dataset:`` file's lengths are scaled to the row's stated mean when the two differ by more than this."""
