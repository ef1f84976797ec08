"""Workloads: when requests arrive and how long their prompts and outputs are.

A :class:`Workload` is three numpy arrays of one entry per request, sorted by arrival
(arrival times in seconds from the start of the run, prompt and output lengths in tokens).
Sources:

- a closed batch: ``n`` requests all present at t = 0;
- open-loop arrivals at ``qps`` requests/s: Poisson (exponential gaps) or gamma gaps whose
  SHAPE is ``burstiness``, as vLLM's ``benchmark_serving.py --burstiness`` (gaps
  ``Gamma(shape=k, scale=1/(qps*k))``: mean 1/qps, squared coefficient of variation 1/k;
  k = 1 is Poisson, k < 1 burstier, k > 1 more regular, k = inf evenly spaced). Until
  this version ``burstiness`` was the squared CV (shape 1/burstiness): 4 then is 0.25 now;
- a trace file (see :mod:`simulator.engine.traces` for the formats), replayed whole or in
  a window, optionally sped up.

Lengths are fixed, uniform, normal (rounded, clipped) or empirical (drawn from a trace's
lengths). Everything is drawn from numpy generators seeded by ``seed``: the same seed gives
the same workload. A request count that would not fit in memory is refused up front.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from simulator.engine.traces import (
    MAX_TIME_SECONDS,
    MAX_TOKENS_EXCLUSIVE,
    Trace,
    read_trace,
)
from simulator.errors import InputError

__all__ = [
    "BYTES_PER_REQUEST", "HELD_BYTES_PER_REQUEST", "MAX_REQUESTS", "LengthSpec", "Trace", "Workload", "arrival_times",
    "check_held_in_memory", "check_request_count",
    "closed_batch", "open_loop", "parse_length_spec", "read_trace", "trace_workload",
]

MAX_LENGTH = MAX_TOKENS_EXCLUSIVE - 1
"""Longest prompt or output a length spec may give, tokens (2^31 - 1)."""

BYTES_PER_REQUEST = 256
"""The least memory one simulated request holds, bytes, in a run that streams its records (``--records``):
the workload's arrival (float64) and two lengths (int64), 24 B, its share of the iteration log and the
inter-token gaps, which stream to files, and of the window of requests in flight. Measured: a streamed run of
10^7 requests (benchmarks.bench_engine) peaks at 1,707 MB, 171 B a request. A run held in memory needs
:data:`HELD_BYTES_PER_REQUEST`."""

HELD_BYTES_PER_REQUEST = 1536
"""Memory one simulated request holds, bytes, in a run held in memory (no ``--records``): the engine's
per-request state (25 values in Python lists, simulator.engine.engine_state.PER_REQUEST), its share of the
iteration log (48 B a row) and of the inter-token gaps (16 B a row), and the result's arrays. Measured
(benchmarks.bench_engine, peak memory from 10^5 to 10^6 requests): 729 B a request with the roofline,
1,254 B with measured kernels, whose shorter steps log 2.7x the iterations; rounded up. More iterations per
request (long outputs at small batches) need more."""

MAX_REQUESTS = 2**27
"""Most requests one run simulates (134,217,728: 32 GiB at BYTES_PER_REQUEST), whatever the memory."""

UNDERFLOW_ODDS = 1e-9
"""Largest accepted chance that one gamma gap comes out below the smallest normal double (0 s)."""


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival; ``notes`` are warnings to show the user (e.g. a trace was re-sorted)."""

    arrival_seconds: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    kind: str
    """'closed', 'poisson', 'gamma', 'trace', 'closed-loop' (simulator.engine.closed_loop) or 'sessions'
    (simulator.engine.sessions)"""
    description: str
    notes: tuple[str, ...] = field(default=())
    prefix_id: np.ndarray | None = None
    """per request, the shared prefix its prompt starts with (-1: none); None when no request has one"""
    prefix_tokens: np.ndarray | None = None
    """per request, that prefix's length in tokens (part of ``prompt_tokens``); see simulator.engine.prefix_cache"""
    client_seconds: np.ndarray | None = None
    """per request, seconds from the client's send to the engine's receipt (HTTP, tokenisation, hand-off:
    simulator.cost.client_path); None: the engine receives each request when it is sent"""
    response_seconds: float = 0.0
    """seconds from the engine's emission of a token to the client's receipt of it (first chunk streaming)"""
    concurrency: int | None = None
    """a closed loop of this many clients (simulator.engine.closed_loop): ``arrival_seconds`` are then
    filled in by the engine as requests are sent; None: the arrivals are given"""
    warmup: int = 0
    """the first ``warmup`` requests are sent first and not scored (closed loops)"""

    def __len__(self) -> int:
        return len(self.arrival_seconds)


@dataclass(frozen=True)
class LengthSpec:
    """A length distribution in tokens: fixed, uniform (inclusive) or normal (rounded, clipped to >= 1)."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, n: int, rng: np.random.Generator, max_tokens: int = MAX_LENGTH) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(n, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), size=n, endpoint=True)
        else:
            values = np.rint(rng.normal(self.a, self.b, size=n))
        return np.clip(values, 1, min(max_tokens, MAX_LENGTH)).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform[{int(self.a)}, {int(self.b)}]"
        return f"normal(mean {self.a:g}, std {self.b:g})"


# -- length specs -----------------------------------------------------------------------------------------


def _length(text: str, what: str) -> int:
    """A token count in [1, 2^31): ValueError saying what is wrong with ``text``."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a whole number") from None
    if not 1 <= value <= MAX_LENGTH:
        raise ValueError(f"{what} must be in [1, 2^31 - 1 = {MAX_LENGTH:,}] tokens (got {text})")
    return value


def _real(text: str, what: str, low: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite (got {text})")
    if not low <= value <= MAX_LENGTH:
        raise ValueError(f"{what} must be in [{low:g}, {MAX_LENGTH:,}] tokens (got {text})")
    return value


def parse_length_spec(spec: str | int, option: str) -> LengthSpec:
    """``N``, ``uniform:LO:HI`` or ``normal:MEAN:STD`` -> LengthSpec; InputError naming ``option`` and the fault.

    Counts are whole numbers in [1, 2^31 - 1]; MEAN in [1, 2^31 - 1] and STD in [0, 2^31 - 1], finite.
    """
    text = str(spec).strip().lower()
    allowed = "allowed: N, uniform:LO:HI or normal:MEAN:STD (token counts)"
    kind, *values = text.split(":")
    try:
        if not text:
            raise ValueError("empty")
        if not values:
            return LengthSpec("fixed", _length(kind, "length"))
        if kind == "uniform":
            if len(values) != 2:
                raise ValueError(f"uniform needs two values LO:HI, got {len(values)}")
            low, high = _length(values[0], "LO"), _length(values[1], "HI")
            if low > high:
                raise ValueError(f"LO {low} is above HI {high}")
            return LengthSpec("uniform", low, high)
        if kind == "normal":
            if len(values) != 2:
                raise ValueError(f"normal needs two values MEAN:STD, got {len(values)}")
            return LengthSpec("normal", _real(values[0], "MEAN", 1.0), _real(values[1], "STD", 0.0))
        raise ValueError(f"unknown distribution {kind!r}")
    except ValueError as exc:
        raise InputError(f"{option}: cannot read {str(spec)!r}: {exc}; {allowed}") from None


# -- request counts ---------------------------------------------------------------------------------------


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_request_count(n: int, option: str = "--requests") -> None:
    """InputError unless 1 <= ``n`` and ``n`` requests fit: at most MAX_REQUESTS and in physical memory."""
    if n < 1:
        raise InputError(f"{option}: must be >= 1 (got {n})")
    memory = _physical_memory_bytes()
    limit, why = MAX_REQUESTS, f"the cap of {MAX_REQUESTS:,} requests"
    if memory is not None and memory // BYTES_PER_REQUEST < limit:
        limit, why = memory // BYTES_PER_REQUEST, f"this machine's {memory / 2**30:.1f} GiB of memory"
    if n > limit:
        raise InputError(
            f"{option}: {n:,} requests need about {n * BYTES_PER_REQUEST / 2**30:,.1f} GiB "
            f"({BYTES_PER_REQUEST} bytes each), beyond {why}; simulate at most {limit:,} requests"
        )


def check_held_in_memory(n: int) -> None:
    """InputError when a run of ``n`` requests held in memory would need more than this machine's memory."""
    memory = _physical_memory_bytes()
    if memory is None or n * HELD_BYTES_PER_REQUEST <= memory:
        return
    raise InputError(
        f"{n:,} requests (--requests, --batch or --trace) held in memory need about {n * HELD_BYTES_PER_REQUEST / 2**30:,.1f} GiB "
        f"({HELD_BYTES_PER_REQUEST} bytes each: per-request state, the iteration log, the inter-token gaps), beyond "
        f"this machine's {memory / 2**30:.1f} GiB; give --records DIR to stream them to disk, or simulate at most "
        f"{memory // HELD_BYTES_PER_REQUEST:,} requests"
    )


def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    # Independent streams, so changing a length distribution does not move the arrivals.
    arrivals, prompts, outputs = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(arrivals), np.random.default_rng(prompts), np.random.default_rng(outputs)


def closed_batch(n: int, prompt: LengthSpec, output: LengthSpec, seed: int = 0, max_tokens: int = MAX_LENGTH) -> Workload:
    """``n`` requests present at t = 0."""
    check_request_count(n, "--batch/--requests")
    _, rng_prompt, rng_output = _generators(seed)
    return Workload(
        arrival_seconds=np.zeros(n),
        prompt_tokens=prompt.sample(n, rng_prompt, max_tokens),
        output_tokens=output.sample(n, rng_output, max_tokens),
        kind="closed",
        description=f"closed batch of {n} request{'' if n == 1 else 's'} at t=0, prompt {prompt.describe()}, output {output.describe()} tokens",
    )


# -- arrivals ---------------------------------------------------------------------------------------------


def _check_rate(n: int, qps: float) -> None:
    if not (math.isfinite(qps) and qps > 0):
        raise InputError(f"--qps: must be a finite rate > 0 requests/s (got {qps!r}); omit --qps for a closed batch")
    mean_gap = 1.0 / qps
    if not (math.isfinite(mean_gap) and mean_gap >= np.finfo(float).tiny):
        raise InputError(f"--qps: {qps!r} requests/s makes the mean gap 1/qps = {mean_gap!r} s, not a usable number")
    if n * mean_gap > MAX_TIME_SECONDS:
        raise InputError(f"--qps: {n:,} requests at {qps!r}/s span about {n * mean_gap:.3g} s, "
                         f"beyond {MAX_TIME_SECONDS:g} s")


def _check_shape(shape: float, qps: float) -> float:
    """The gamma scale (seconds) for ``shape``; InputError where gaps would overflow or underflow.

    For small x, P(Gamma(k, theta) < x) ~ (x/theta)^k / Gamma(k + 1) (the series of the
    regularised lower incomplete gamma function, DLMF 8.7.1). With x the smallest normal double
    (2.2e-308) that is the chance a gap comes out as 0 s; shapes giving more than
    UNDERFLOW_ODDS are refused (about k < 0.03 at 10 requests/s).
    """
    if math.isnan(shape) or not shape > 0:
        raise InputError(f"--burstiness: must be > 0, the gamma shape (got {shape!r})")
    scale = 1.0 / (qps * shape)
    tiny = float(np.finfo(float).tiny)
    if not (math.isfinite(scale) and scale >= tiny):
        raise InputError(f"--burstiness: {shape!r} at {qps!r} requests/s gives a gamma scale 1/(qps*k) = {scale!r} s, "
                         "which does not fit a double")
    log_odds = shape * (math.log(tiny) - math.log(scale)) - math.lgamma(shape + 1.0)
    if log_odds > math.log(UNDERFLOW_ODDS):
        odds = math.exp(min(log_odds, 0.0))
        lowest = math.log(UNDERFLOW_ODDS) / (math.log(tiny) - math.log(scale))
        raise InputError(
            f"--burstiness: {shape!r} is too small a gamma shape: about {odds:.2g} of the gaps would underflow "
            f"to 0 s; use >= {lowest:.2g} at {qps!r} requests/s (1 is Poisson; smaller is burstier)"
        )
    return scale


def arrival_times(n: int, qps: float, arrival: str, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (seconds, finite, non-decreasing) of ``n`` requests at mean rate ``qps`` requests/s.

    ``poisson``: exponential gaps of mean 1/qps. ``gamma``: gaps Gamma(shape=burstiness,
    scale=1/(qps*burstiness)), exactly vLLM benchmark_serving's ``get_request`` (its
    ``theta = 1.0 / (request_rate * burstiness)``); burstiness = inf gives even gaps 1/qps,
    as vLLM's ``vllm bench serve``. InputError for a rate or shape whose gaps overflow or underflow.
    """
    _check_rate(n, qps)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / qps, size=n)
    elif arrival == "gamma":
        if burstiness == math.inf:
            gaps = np.full(n, 1.0 / qps)
        else:
            gaps = rng.gamma(burstiness, _check_shape(burstiness, qps), size=n)
    else:
        raise InputError(f"--arrival: unknown {arrival!r}; allowed: poisson, gamma")
    times = np.cumsum(gaps)
    if not np.isfinite(times[-1]):
        raise InputError(f"--qps/--burstiness: {n:,} arrivals at {qps!r}/s overflow a double; use a higher rate")
    return times


def open_loop(
    n: int,
    qps: float,
    prompt: LengthSpec | np.ndarray,
    output: LengthSpec | np.ndarray,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    max_tokens: int = MAX_LENGTH,
) -> Workload:
    """``n`` requests arriving at ``qps``; a length given as an array is an empirical sample to draw from.

    ``burstiness`` is the gamma shape k (vLLM's meaning; see :func:`arrival_times`).
    """
    check_request_count(n, "--requests")
    rng_arrival, rng_prompt, rng_output = _generators(seed)
    times = arrival_times(n, qps, arrival, burstiness, rng_arrival)

    def lengths(spec: LengthSpec | np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str]:
        if isinstance(spec, LengthSpec):
            return spec.sample(n, rng, max_tokens), spec.describe()
        if not len(spec):
            raise InputError("empirical lengths: the trace has no requests to draw lengths from")
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


# -- traces -----------------------------------------------------------------------------------------------


def _window(trace: Trace, start_seconds: float, duration_seconds: float | None) -> tuple[np.ndarray, str]:
    """Indices (by arrival, stable) of the requests in [start, start + duration) trace seconds, and a label."""
    if not (math.isfinite(start_seconds) and 0 <= start_seconds <= MAX_TIME_SECONDS):
        raise InputError(f"--trace-start: must be finite seconds >= 0 (got {start_seconds!r})")
    if duration_seconds is not None and not (math.isfinite(duration_seconds) and 0 < duration_seconds <= MAX_TIME_SECONDS):
        raise InputError(f"--trace-duration: must be finite seconds > 0 (got {duration_seconds!r})")
    times = trace.arrival_seconds
    order = np.argsort(times, kind="stable")
    if start_seconds == 0 and duration_seconds is None:
        return order, ""
    end = math.inf if duration_seconds is None else start_seconds + duration_seconds
    sorted_times = times[order]
    lo, hi = np.searchsorted(sorted_times, [start_seconds, end], side="left")
    # An open-ended window is spelled in words: a report never prints 'inf'.
    window = f"from {start_seconds:g} s to the end" if duration_seconds is None else f"[{start_seconds:g}, {end:g}) s"
    label = f", window {window}"
    if lo == hi:
        span = float(sorted_times[-1])
        raise InputError(f"--trace-start/--trace-duration: the window {window} holds no requests; "
                         f"{trace.path.name}'s arrivals span 0 to {span:g} s")
    return order[lo:hi], label


def trace_workload(
    trace: Trace,
    speedup: float = 1.0,
    prompt: LengthSpec | None = None,
    output: LengthSpec | None = None,
    seed: int = 0,
    max_tokens: int = MAX_LENGTH,
    start_seconds: float = 0.0,
    duration_seconds: float | None = None,
    requests: int | None = None,
) -> Workload:
    """Replay ``trace``, or its window [start, start + duration) in trace seconds, ``speedup`` times faster;
    ``requests``: only the first that many of them (an InputError where the window holds fewer).

    Arrival times are rebased to the window start then divided by ``speedup``: a request at
    trace second t arrives at (t - start_seconds) / speedup. Unsorted arrivals are sorted
    (stable) with a note; the trace's own notes are carried over.
    """
    if not (math.isfinite(speedup) and speedup > 0):
        raise InputError(f"--trace-speedup: must be a finite factor > 0 (got {speedup!r})")
    notes = list(trace.notes)
    if np.any(np.diff(trace.arrival_seconds) < 0):
        order = np.argsort(trace.arrival_seconds, kind="stable")
        moved = int(np.count_nonzero(order != np.arange(len(order))))
        notes.append(f"{trace.path}: arrivals were not sorted; sorted them by time ({moved} requests moved)")
    chosen, label = _window(trace, start_seconds, duration_seconds)
    if requests is not None:
        if requests > len(chosen):
            where = f"the window {label.removeprefix(', window ')} of " if label else ""
            raise InputError(f"--requests {requests:,}: {where}{trace.path.name} holds {len(chosen):,} requests; give at "
                             "most that many, or --qps to draw more arrivals with the trace's lengths")
        chosen = chosen[:requests]
    check_request_count(len(chosen), "--trace")
    with np.errstate(over="ignore"):
        arrivals = (trace.arrival_seconds[chosen] - start_seconds) / speedup
    if not np.isfinite(arrivals[-1]):
        raise InputError(f"--trace-speedup: {speedup!r} stretches the trace beyond a double; use a larger factor")
    n = len(chosen)
    _, rng_prompt, rng_output = _generators(seed)
    prompts = trace.prompt_tokens[chosen] if prompt is None else prompt.sample(n, rng_prompt, max_tokens)
    outputs = trace.output_tokens[chosen] if output is None else output.sample(n, rng_output, max_tokens)
    span = float(arrivals[-1])
    return Workload(
        arrival_seconds=arrivals,
        prompt_tokens=prompts,
        output_tokens=outputs,
        kind="trace",
        description=f"trace {trace.path.name}{label}: {n} requests over {span:.1f} s (speedup {speedup:g})",
        notes=tuple(notes),
        prefix_id=None if trace.prefix_id is None or prompt is not None else trace.prefix_id[chosen],
        prefix_tokens=None if trace.prefix_tokens is None or prompt is not None else trace.prefix_tokens[chosen],
    )
