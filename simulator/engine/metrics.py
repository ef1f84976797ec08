"""Per-request records, the per-iteration log, and the aggregates of a run.

Per-request times are seconds since the start of the run, one entry per request (NaN until the event
happens; Python lists during the run, numpy arrays in its result). Latencies:

- queueing delay = first scheduled - arrival
- TTFT = first token - arrival
- TPOT = (finish - first token) / (output tokens - 1), for requests with more than one output token
- end to end = finish - arrival
- inter-token latency (ITL): every gap between two consecutive tokens of a request, over all
  tokens of all requests (weighted samples: one per iteration and group of sequences)
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# Request states.
PENDING, WAITING, PREFILLING, DECODING, DONE, REJECTED = 0, 1, 2, 3, 4, 5
STATE_NAMES = ("pending", "waiting", "prefilling", "decoding", "done", "rejected")

# Short names of the reject reasons (index = code), for JSON/CSV keys that are the same in every run.
REJECT_KEYS = ("", "max_context", "kv_cache", "empty", "prompt_over_budget")

REJECT_REASONS = (
    "",
    "prompt + output exceed the model's maximum context",
    "needs more KV-cache blocks than the whole cache holds",
    "empty prompt or no output tokens",
    "prompt longer than --max-batched-tokens (the continuous scheduler does not split prompts)",
)


_TYPECODES = {np.dtype(np.float64): "d", np.dtype(np.int64): "q"}


class Columns:
    """Growable columns of float64 / int64 values, appended to row by row or in slices, read as numpy arrays.

    Kept as :class:`array.array` (a Python-level append costs ~50 ns, a numpy slice assignment ~1 us). A read
    is a read-only numpy view of the column's buffer, not a copy (a long run's log is read whole when it is
    summarised, and a copy would double it); an array that numpy views cannot grow, so an append after a
    read that is still held first copies that column (:meth:`_unshared`), and the reader's view stays as it was.
    """

    def __init__(self, dtypes: dict[str, type], capacity: int = 0) -> None:
        self._names = tuple(dtypes)
        self._dtypes = tuple(np.dtype(dtype) for dtype in dtypes.values())
        self._columns = [array(_TYPECODES[dtype]) for dtype in self._dtypes]
        self._read: dict[str, tuple[int, np.ndarray]] = {}
        self._folder: Path | None = None
        self._spilled = 0

    def spill_to(self, folder: Path) -> None:
        """From now on :meth:`spill` moves the rows held to one raw file per column in ``folder`` (a run too long
        to hold its log in memory); reads then map the files."""
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = folder
        for name in self._names:
            (folder / f"{name}.bin").write_bytes(b"")

    def spill(self) -> None:
        """Append the rows held in memory to the column files (if :meth:`spill_to` named a folder) and drop them."""
        if self._folder is None or not len(self._columns[0]):
            return
        for index, (name, column) in enumerate(zip(self._names, self._columns)):
            with open(self._folder / f"{name}.bin", "ab") as file:
                column.tofile(file)
            try:
                del column[:]
            except BufferError:  # a reader still holds a view of it: leave that to the reader
                self._columns[index] = array(column.typecode)
        self._spilled = (self._folder / f"{self._names[0]}.bin").stat().st_size // self._dtypes[0].itemsize

    @property
    def size(self) -> int:
        return self._spilled + len(self._columns[0])

    def _unshared(self, index: int) -> array:
        """Column ``index`` in a buffer of its own, so that it can grow: a copy replaces it (a reader's view keeps
        the old buffer alive and unchanged)."""
        column = self._columns[index]
        self._columns[index] = copy = array(column.typecode, column)
        return copy

    def add(self, *row) -> None:
        """Append one row: one value per column, in the columns' order."""
        columns = self._columns
        for index, value in enumerate(row):
            try:
                columns[index].append(value)
            except BufferError:
                self._unshared(index).append(value)

    def add_rows(self, *columns) -> None:
        """Append rows: per column (in order) a list or array of equal length, or one value for every row."""
        count = 0
        for values in columns:
            if type(values) is list or isinstance(values, np.ndarray):
                count = len(values)
                break
        for index, (dtype, values) in enumerate(zip(self._dtypes, columns)):
            raw = isinstance(values, np.ndarray)
            if raw:
                values = np.ascontiguousarray(values, dtype=dtype).tobytes()
            elif type(values) is not list:
                values = array(self._columns[index].typecode, [values]) * count  # repeated in C, not a list
            try:
                column = self._columns[index]
                column.frombytes(values) if raw else column.extend(values)
            except BufferError:
                column = self._unshared(index)
                column.frombytes(values) if raw else column.extend(values)

    def append(self, **values) -> None:
        """Append one row (scalars) or several (equal-length arrays or lists; scalars broadcast), by column name."""
        row = [values[name] for name in self._names]
        if any(isinstance(value, (list, np.ndarray)) for value in row):
            self.add_rows(*row)
        else:
            self.add(*row)

    def __getitem__(self, name: str) -> np.ndarray:
        size = self.size
        cached = self._read.get(name)
        if cached is None or cached[0] != size:
            index = self._names.index(name)
            column: np.ndarray
            if self._folder is not None and size:
                self.spill()  # read-only map of the column's file: the OS pages it in and out
                column = np.memmap(self._folder / f"{name}.bin", dtype=self._dtypes[index], mode="r", shape=(size,))
            else:
                column = np.frombuffer(self._columns[index], dtype=self._dtypes[index])
                column.flags.writeable = False
            cached = self._read[name] = (size, column)
        return cached[1]


def iteration_log() -> Columns:
    """One row per iteration: end time and duration (s), prefill tokens, decoding sequences, KV blocks used, running sequences."""
    return Columns(
        {"end": np.float64, "seconds": np.float64, "prefill_tokens": np.int64, "decode_seqs": np.int64,
         "blocks_used": np.int64, "running": np.int64}
    )


def itl_samples() -> Columns:
    """Inter-token gaps (s) with how many tokens had that gap."""
    return Columns({"seconds": np.float64, "weight": np.int64})


@dataclass(frozen=True)
class Summary:
    """mean, p50, p90, p99 of a sample (0.0 each when empty)."""

    mean: float
    p50: float
    p90: float
    p99: float

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


PERCENTILES = (50, 90, 99)
"""The percentiles of a :class:`Summary`."""


def _percentiles(values: np.ndarray) -> np.ndarray:
    """``np.percentile(values, PERCENTILES, axis=-1)`` (linear interpolation), shape (3,) + ``values.shape[:-1]``.

    Where every sample is one value, finite and not negative (a static batch: each request's TTFT is the batch's
    prefill), every percentile is that value without numpy's ~20 us per call: numpy interpolates between two
    equal values ``a`` as ``a + 0 * t`` or ``a - 0 * (1 - t)``, which give ``a`` back exactly (a negative zero
    would not come back as itself, hence not negative).
    """
    first = values[..., :1]
    if np.all(values == first) and np.all(np.isfinite(first)) and not np.any(np.signbit(first)):
        return np.broadcast_to(first[..., 0], (len(PERCENTILES), *values.shape[:-1]))
    return np.percentile(values, PERCENTILES, axis=-1)


def summarize(values: np.ndarray) -> Summary:
    if len(values) == 0:
        return Summary(0.0, 0.0, 0.0, 0.0)
    p50, p90, p99 = _percentiles(values)
    return Summary(float(np.mean(values)), float(p50), float(p90), float(p99))


def summarize_rows(*samples: np.ndarray) -> list[Summary]:
    """:func:`summarize` of samples of one length, in one numpy call per statistic (row by row, the same values)."""
    if not samples[0].size:
        return [Summary(0.0, 0.0, 0.0, 0.0) for _ in samples]
    rows = np.stack(samples)
    means = np.mean(rows, axis=1)
    quantiles = _percentiles(rows)
    return [Summary(float(means[k]), *(float(q) for q in quantiles[:, k])) for k in range(len(samples))]


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` percent of the total (inverted CDF)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, q / 100.0 * cumulative[-1], side="left"))
    return float(values[order][min(index, len(order) - 1)])


LARGE_SAMPLE = 1 << 23
"""Samples from which summaries work through the data in chunks (a streamed 10^7-request run has ~3 x 10^7
inter-token gaps: sorting them whole would take ~1.5 GB)."""

CHUNK = 1 << 21
"""Samples read at a time by the chunked summaries."""


def _weighted_quantile_chunked(values: np.ndarray, weights: np.ndarray, targets: list[float]) -> list[float]:
    """For each target weight t: the smallest value v with weight(values <= v) >= t, exactly, in chunks.

    The same answer as sorting (:func:`weighted_percentile`), found by a radix selection on the values'
    IEEE bits (for non-negative floats they order as the values): four passes of 16 bits, each
    histogramming, by weight, the next 16 bits of the samples that share the prefix chosen so far.
    """
    answers = []
    for target in targets:
        prefix, below, shift = 0, 0.0, 64
        for _ in range(4):
            shift -= 16
            histogram = np.zeros(1 << 16)
            for start in range(0, len(values), CHUNK):
                keys = (values[start:start + CHUNK] + 0.0).view(np.uint64)  # + 0.0: -0.0 becomes 0.0
                chunk_weights = weights[start:start + CHUNK]
                if shift < 48:
                    same = (keys >> np.uint64(shift + 16)) == np.uint64(prefix)
                    keys, chunk_weights = keys[same], chunk_weights[same]
                digits = ((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.intp)
                histogram += np.bincount(digits, weights=chunk_weights, minlength=1 << 16)
            cumulative = below + np.cumsum(histogram)
            digit = min(int(np.searchsorted(cumulative, target, side="left")), (1 << 16) - 1)
            below = float(cumulative[digit - 1]) if digit else below
            prefix = (prefix << 16) | digit
        answers.append(float(np.array([prefix], dtype=np.uint64).view(np.float64)[0]))
    return answers


def _summarize_weighted_chunked(values: np.ndarray, weights: np.ndarray) -> Summary:
    """:func:`summarize_weighted` of a large sample, in chunks (same percentiles; the mean summed chunk by chunk)."""
    total = weighted = 0.0
    for start in range(0, len(values), CHUNK):
        chunk_weights = weights[start:start + CHUNK]
        total += float(np.sum(chunk_weights))
        weighted += float(np.sum(values[start:start + CHUNK] * chunk_weights))
    if total <= 0:
        return Summary(0.0, 0.0, 0.0, 0.0)
    p50, p90, p99 = _weighted_quantile_chunked(values, weights, [q * total for q in (0.5, 0.9, 0.99)])
    return Summary(weighted / total, p50, p90, p99)


def summarize_weighted(values: np.ndarray, weights: np.ndarray) -> Summary:
    if len(values) > LARGE_SAMPLE:
        return _summarize_weighted_chunked(values, weights)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return Summary(0.0, 0.0, 0.0, 0.0)
    mean = float(np.sum(values * weights) / np.sum(weights))
    # weighted_percentile's inverted CDF, with one sort for the three percentiles.
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    cumulative = np.cumsum(weights[order])
    indices = np.searchsorted(cumulative, np.array([0.5, 0.9, 0.99]) * cumulative[-1], side="left")
    p50, p90, p99 = (float(ordered[min(int(index), len(order) - 1)]) for index in indices)
    return Summary(mean, p50, p90, p99)


@dataclass(frozen=True)
class Aggregates:
    """What a run achieved. Rates per second of simulated time; FLOPs and bytes for the whole TP group."""

    requests: int
    completed: int
    rejected: int
    rejected_by_reason: dict[str, int]
    """count per reject key (REJECT_KEYS), every key present"""
    preemptions: int
    preempted_requests: int
    ttft: Summary
    tpot: Summary
    itl: Summary
    e2e: Summary
    queue: Summary
    duration_seconds: float
    busy_seconds: float
    input_tokens: int
    output_tokens: int
    good_requests: int
    mfu: float
    mbu: float
    compute_bound_share: float
    memory_bound_share: float
    communication_share: float
    kv_high_water_blocks: int
    kv_blocks: int
    max_running: int
    iterations: int
    overhead_share: float = 0.0
    """share of busy time the GPU waited for the host: the engine loop (simulator.cost.engine_overhead) and kernel
    launches outside CUDA graphs (simulator.cost.step_cost.launch_wait)"""
    decode_tokens: int = 0
    """sequence decodes over all iterations (one per decoding sequence per iteration; tokens without speculation)"""
    mixed_decode_tokens: int = 0
    """the part of ``decode_tokens`` that rode in mixed iterations (ones that also ran a prefill chunk)"""
    mixed_iterations: int = 0
    """iterations that ran prefill chunks and decodes together (chunked prefill)"""
    mixed_iteration_seconds: float = 0.0
    """mean duration of a mixed iteration, seconds (0 when there is none)"""
    decode_only_iteration_seconds: float = 0.0
    """mean duration of an iteration that only decodes, seconds (0 when there is none)"""

    @property
    def mixed_decode_share(self) -> float:
        """Share of decode tokens that rode in mixed iterations: what makes TPOT exceed a decode step's time."""
        return self.mixed_decode_tokens / self.decode_tokens if self.decode_tokens else 0.0

    def _rate(self, count: float) -> float:
        return count / self.duration_seconds if self.duration_seconds > 0 else 0.0

    @property
    def output_tokens_per_second(self) -> float:
        return self._rate(self.output_tokens)

    @property
    def input_tokens_per_second(self) -> float:
        return self._rate(self.input_tokens)

    @property
    def total_tokens_per_second(self) -> float:
        return self._rate(self.input_tokens + self.output_tokens)

    @property
    def requests_per_second(self) -> float:
        return self._rate(self.completed)

    @property
    def goodput_requests_per_second(self) -> float:
        """Completed requests per second that met every SLO given (all completed ones when none is given)."""
        return self._rate(self.good_requests)

    @property
    def slo_attainment(self) -> float:
        """Share of all requests (rejected ones included) that completed within the SLOs."""
        return self.good_requests / self.requests if self.requests else 0.0

    @property
    def kv_high_water_fraction(self) -> float:
        return self.kv_high_water_blocks / self.kv_blocks if self.kv_blocks else 0.0


class Latencies(NamedTuple):
    """Per completed request, in seconds (arrays in request order); ``tpot_seconds`` is 0 where one token was generated."""

    ttft_seconds: np.ndarray
    tpot_seconds: np.ndarray
    e2e_seconds: np.ndarray
    multi_token: np.ndarray
    """bool: the request generated more than one token (its TPOT is defined)"""


def completed_latencies(result) -> Latencies:
    """TTFT, TPOT (time per output token after the first) and end-to-end latency of every completed request."""
    done = result.status == DONE
    arrival = result.workload.arrival_seconds[done]
    first_token, finish = result.first_token[done], result.finish[done]
    outputs = result.workload.output_tokens[done]
    multi = outputs > 1
    # (finish - first token) / (outputs - 1) where more than one token came, else 0, without masked copies
    # (a 10^7-request run would hold ~10 temporaries of 80 MB).
    tpot = np.subtract(finish, first_token)
    np.divide(tpot, outputs - 1, out=tpot, where=multi)
    tpot[~multi] = 0.0
    return Latencies(first_token - arrival, tpot, finish - arrival, multi)


def aggregate(result, tp: int, peak_flops: float, hbm_bandwidth: float,
              slo_ttft: float | None = None, slo_tpot: float | None = None,
              slo_e2e: float | None = None) -> Aggregates:
    """Per-request latencies and run totals of an EngineResult (``peak_flops``, ``hbm_bandwidth``: one GPU)."""
    workload = result.workload
    done = result.status == DONE
    latencies = completed_latencies(result)
    ttft, e2e, tpot_all, multi = latencies.ttft_seconds, latencies.e2e_seconds, latencies.tpot_seconds, latencies.multi_token
    finish = result.finish[done]
    outputs = workload.output_tokens[done]
    good = np.ones(len(outputs), dtype=bool)
    if slo_ttft is not None:
        good &= ttft <= slo_ttft
    if slo_tpot is not None:
        good &= tpot_all <= slo_tpot
    if slo_e2e is not None:
        good &= e2e <= slo_e2e
    rejected = result.status == REJECTED
    reasons = {key: int(np.count_nonzero(result.reject_reason[rejected] == code))
               for code, key in enumerate(REJECT_KEYS) if code}
    duration = float(finish.max() - workload.arrival_seconds.min()) if len(finish) else 0.0
    queue = result.first_scheduled[done] - workload.arrival_seconds[done]
    if len(queue) > LARGE_SAMPLE:  # one at a time: stacking copies them all (same values, see summarize_rows)
        ttft_summary, e2e_summary, queue_summary = summarize(ttft), summarize(e2e), summarize(queue)
    else:
        ttft_summary, e2e_summary, queue_summary = summarize_rows(ttft, e2e, queue)
    totals = result.totals
    busy = totals.busy_seconds
    mix = _mixed_iterations(result.log)
    share = (lambda s: s / busy) if busy > 0 else (lambda s: 0.0)
    return Aggregates(
        requests=len(workload),
        completed=int(done.sum()),
        rejected=int(rejected.sum()),
        rejected_by_reason=reasons,
        preemptions=int(result.preemptions.sum()),
        preempted_requests=int(np.count_nonzero(result.preemptions)),
        ttft=ttft_summary,
        tpot=summarize(tpot_all[multi]),
        itl=summarize_weighted(result.itl["seconds"], result.itl["weight"]),
        e2e=e2e_summary,
        queue=queue_summary,
        duration_seconds=duration,
        busy_seconds=busy,
        input_tokens=int(workload.prompt_tokens[done].sum()),
        output_tokens=int(outputs.sum()),
        good_requests=int(good.sum()),
        mfu=totals.flops / (duration * peak_flops) if duration > 0 else 0.0,
        mbu=totals.bytes / (duration * hbm_bandwidth) if duration > 0 else 0.0,
        compute_bound_share=share(totals.compute_bound_seconds),
        memory_bound_share=share(totals.memory_bound_seconds),
        communication_share=share(totals.communication_seconds),
        kv_high_water_blocks=result.kv_high_water_blocks,
        kv_blocks=result.kv_blocks,
        max_running=result.max_running,
        iterations=totals.iterations,
        # Iteration time includes the engine's exposed host time, which is in none of the bound columns.
        overhead_share=share(max(0.0, busy - totals.compute_bound_seconds - totals.memory_bound_seconds
                                 - totals.communication_seconds)),
        **mix,
    )


def _mixed_iterations(log: Columns) -> dict[str, Any]:
    """Decode tokens in all and in mixed iterations, and the mean durations (s) of mixed and decode-only ones,
    from the iteration log (its ``prefill_tokens``, ``decode_seqs`` and ``seconds`` columns)."""
    if not log.size:
        return {}
    seconds, prefill, decodes = log["seconds"], log["prefill_tokens"], log["decode_seqs"]
    decoding = decodes > 0
    mixed = decoding & (prefill > 0)
    only = decoding & (prefill == 0)
    mixed_count, only_count = int(np.count_nonzero(mixed)), int(np.count_nonzero(only))
    return {
        "decode_tokens": int(decodes.sum()),
        "mixed_decode_tokens": int(decodes[mixed].sum()),
        "mixed_iterations": mixed_count,
        "mixed_iteration_seconds": float(seconds[mixed].sum()) / mixed_count if mixed_count else 0.0,
        "decode_only_iteration_seconds": float(seconds[only].sum()) / only_count if only_count else 0.0,
    }
