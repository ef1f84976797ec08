"""Workloads: when requests arrive and how long their prompts and outputs are.

A :class:`Workload` is three numpy arrays of one entry per request, sorted by arrival
(arrival times in seconds from the start of the run, prompt and output lengths in tokens).
Sources:

- a closed batch: ``n`` requests all present at t = 0;
- open-loop arrivals at ``qps`` requests/s: Poisson (exponential gaps) or gamma gaps with a
  burstiness factor (the squared coefficient of variation of the gaps; 1 is Poisson);
- a trace file, CSV or JSONL, with an arrival time, prompt tokens and output tokens per
  request; the public Azure LLM inference trace CSV (``TIMESTAMP, ContextTokens,
  GeneratedTokens``) is read as published.

Lengths are fixed, uniform, normal (rounded, clipped) or empirical (drawn from a trace's
lengths). Everything is drawn from numpy generators seeded by ``seed``: the same seed gives
the same workload.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from simulator.errors import InputError

# Column names accepted in a trace, first match wins: ours, then the Azure trace's.
ARRIVAL_COLUMNS = ("arrival_seconds", "arrival", "timestamp", "time")
PROMPT_COLUMNS = ("prompt_tokens", "input_tokens", "contexttokens", "context_tokens")
OUTPUT_COLUMNS = ("output_tokens", "generated_tokens", "generatedtokens")


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival; ``notes`` are warnings to show the user (e.g. a trace was re-sorted)."""

    arrival_seconds: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    kind: str
    """'closed', 'poisson', 'gamma' or 'trace'"""
    description: str
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.arrival_seconds)


@dataclass(frozen=True)
class LengthSpec:
    """A length distribution in tokens: fixed, uniform (inclusive) or normal (rounded, clipped to >= 1)."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, n: int, rng: np.random.Generator, max_tokens: int) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(n, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), size=n, endpoint=True)
        else:
            values = np.rint(rng.normal(self.a, self.b, size=n))
        return np.clip(values, 1, max_tokens).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform[{int(self.a)}, {int(self.b)}]"
        return f"normal(mean {self.a:g}, std {self.b:g})"


def parse_length_spec(spec: str | int, option: str) -> LengthSpec:
    """``N``, ``uniform:LO:HI`` or ``normal:MEAN:STD`` -> LengthSpec; InputError naming ``option`` otherwise."""
    text = str(spec).strip().lower()
    allowed = "N, uniform:LO:HI or normal:MEAN:STD (token counts)"
    parts = text.split(":")
    try:
        if len(parts) == 1:
            value = int(parts[0])
            if value < 1:
                raise InputError(f"{option}: length must be >= 1 (got {spec!r})")
            return LengthSpec("fixed", value)
        if parts[0] == "uniform" and len(parts) == 3:
            lo, hi = int(parts[1]), int(parts[2])
            if not 1 <= lo <= hi:
                raise InputError(f"{option}: uniform:LO:HI needs 1 <= LO <= HI (got {spec!r})")
            return LengthSpec("uniform", lo, hi)
        if parts[0] == "normal" and len(parts) == 3:
            mean, std = float(parts[1]), float(parts[2])
            if mean < 1 or std < 0:
                raise InputError(f"{option}: normal:MEAN:STD needs MEAN >= 1 and STD >= 0 (got {spec!r})")
            return LengthSpec("normal", mean, std)
    except ValueError:
        pass
    raise InputError(f"{option}: cannot read {spec!r}; allowed: {allowed}")


def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    # Independent streams, so changing a length distribution does not move the arrivals.
    arrivals, prompts, outputs = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(arrivals), np.random.default_rng(prompts), np.random.default_rng(outputs)


def closed_batch(n: int, prompt: LengthSpec, output: LengthSpec, seed: int = 0, max_tokens: int = 2**31) -> Workload:
    """``n`` requests present at t = 0."""
    if n < 1:
        raise InputError(f"--batch/--requests: must be >= 1 (got {n})")
    _, rng_prompt, rng_output = _generators(seed)
    return Workload(
        arrival_seconds=np.zeros(n),
        prompt_tokens=prompt.sample(n, rng_prompt, max_tokens),
        output_tokens=output.sample(n, rng_output, max_tokens),
        kind="closed",
        description=f"closed batch of {n} request{'' if n == 1 else 's'} at t=0, prompt {prompt.describe()}, output {output.describe()} tokens",
    )


def arrival_times(n: int, qps: float, arrival: str, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (seconds) of ``n`` requests at mean rate ``qps``; gaps exponential or gamma(shape 1/burstiness)."""
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / qps, size=n)
    elif arrival == "gamma":
        shape = 1.0 / burstiness
        gaps = rng.gamma(shape, 1.0 / (qps * shape), size=n)
    else:
        raise InputError(f"--arrival: unknown {arrival!r}; allowed: poisson, gamma")
    return np.cumsum(gaps)


def open_loop(
    n: int,
    qps: float,
    prompt: LengthSpec | np.ndarray,
    output: LengthSpec | np.ndarray,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    max_tokens: int = 2**31,
) -> Workload:
    """``n`` requests arriving at ``qps``; a length given as an array is an empirical sample to draw from."""
    if n < 1:
        raise InputError(f"--requests: must be >= 1 (got {n})")
    if not qps > 0:
        raise InputError(f"--qps: must be > 0 requests/s (got {qps})")
    if not burstiness > 0:
        raise InputError(f"--burstiness: must be > 0 (got {burstiness})")
    rng_arrival, rng_prompt, rng_output = _generators(seed)
    times = arrival_times(n, qps, arrival, burstiness, rng_arrival)

    def lengths(spec: LengthSpec | np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str]:
        if isinstance(spec, LengthSpec):
            return spec.sample(n, rng, max_tokens), spec.describe()
        return rng.choice(spec, size=n, replace=True).astype(np.int64), f"empirical ({len(spec)} trace values)"

    prompts, prompt_text = lengths(prompt, rng_prompt)
    outputs, output_text = lengths(output, rng_output)
    shape = "Poisson" if arrival == "poisson" else f"gamma (burstiness {burstiness:g})"
    return Workload(
        arrival_seconds=times,
        prompt_tokens=prompts,
        output_tokens=outputs,
        kind=arrival,
        description=f"{n} requests, {shape} arrivals at {qps:g}/s, prompt {prompt_text}, output {output_text} tokens",
    )


def _pick(columns: dict[str, str], names: tuple[str, ...], path: Path, what: str) -> str:
    for name in names:
        if name in columns:
            return columns[name]
    found = ", ".join(columns.values()) or "none"
    raise InputError(
        f"{path}: missing column for {what}; expected one of {', '.join(names)} (case-insensitive), found: {found}"
    )


def _parse_time(value: str, path: Path, line: int) -> float:
    """Seconds as a number, or an ISO date-time (the Azure trace's TIMESTAMP) -> POSIX seconds."""
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        # The Azure trace writes 7 fractional digits; datetime takes at most 6.
        head, dot, fraction = text.partition(".")
        stamp = datetime.fromisoformat(head + (dot + fraction[:6] if dot else ""))
        return stamp.timestamp() + (float("0." + fraction[6:]) * 1e-6 if len(fraction) > 6 else 0.0)
    except ValueError:
        raise InputError(f"{path}:{line}: arrival time {value!r} is neither seconds nor an ISO date-time") from None


def _parse_count(value: object, path: Path, line: int, column: str) -> int:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{path}:{line}: {column} {value!r} is not a number") from None
    if number < 0 or number != int(number):
        raise InputError(f"{path}:{line}: {column} must be a non-negative integer (got {value!r})")
    return int(number)


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """(column names, [(line number, row dict)]) from a CSV or JSONL file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"--trace: cannot read {path}: {exc.strerror}") from None
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{number}: each line must be a JSON object")
            rows.append((number, row))
        names = list(rows[0][1]) if rows else []
        return names, rows
    reader = csv.DictReader(text.splitlines())
    names = [name.strip() for name in (reader.fieldnames or [])]
    reader.fieldnames = names
    return names, [(number, row) for number, row in enumerate(reader, start=2)]


@dataclass(frozen=True)
class Trace:
    """A trace file's requests in file order (arrival seconds from the first request)."""

    path: Path
    arrival_seconds: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray


def read_trace(path: str | Path) -> Trace:
    """Read a CSV/JSONL trace; InputError naming file, line and column for anything wrong."""
    path = Path(path)
    names, rows = _rows(path)
    columns = {name.lower().replace(" ", ""): name for name in names}
    arrival_col = _pick(columns, ARRIVAL_COLUMNS, path, "the arrival time")
    prompt_col = _pick(columns, PROMPT_COLUMNS, path, "prompt tokens")
    output_col = _pick(columns, OUTPUT_COLUMNS, path, "output tokens")
    if not rows:
        raise InputError(f"{path}: the trace has no requests")
    n = len(rows)
    arrivals, prompts, outputs = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i, (line, row) in enumerate(rows):
        for column in (arrival_col, prompt_col, output_col):
            if row.get(column) in (None, ""):
                raise InputError(f"{path}:{line}: {column} is empty")
        arrivals[i] = _parse_time(str(row[arrival_col]), path, line)
        prompts[i] = _parse_count(row[prompt_col], path, line, prompt_col)
        outputs[i] = _parse_count(row[output_col], path, line, output_col)
    return Trace(path, arrivals - arrivals.min(), prompts, outputs)


def trace_workload(
    trace: Trace, speedup: float = 1.0, prompt: LengthSpec | None = None, output: LengthSpec | None = None,
    seed: int = 0, max_tokens: int = 2**31,
) -> Workload:
    """Replay ``trace`` ``speedup`` times faster; unsorted arrivals are sorted (stable) with a note."""
    if not speedup > 0:
        raise InputError(f"--trace-speedup: must be > 0 (got {speedup})")
    notes = []
    order = np.argsort(trace.arrival_seconds, kind="stable")
    if np.any(np.diff(trace.arrival_seconds) < 0):
        moved = int(np.count_nonzero(order != np.arange(len(order))))
        notes.append(f"{trace.path}: arrivals were not sorted; sorted them by time ({moved} requests moved)")
    n = len(order)
    _, rng_prompt, rng_output = _generators(seed)
    prompts = trace.prompt_tokens[order] if prompt is None else prompt.sample(n, rng_prompt, max_tokens)
    outputs = trace.output_tokens[order] if output is None else output.sample(n, rng_output, max_tokens)
    span = trace.arrival_seconds.max() / speedup
    return Workload(
        arrival_seconds=trace.arrival_seconds[order] / speedup,
        prompt_tokens=prompts,
        output_tokens=outputs,
        kind="trace",
        description=f"trace {trace.path.name}: {n} requests over {span:.1f} s (speedup {speedup:g})",
        notes=tuple(notes),
    )
