"""Attention latency from NVIDIA AIConfigurator's measured context- and generation-attention tables.

What a latency includes, from the collector's code (``collector/<engine>/collect_attn.py`` and
``collector/helper.py:benchmark_with_power`` of ai-dynamo/aiconfigurator):

- One attention layer's forward on one GPU, timed as the mean device time of CUDA-graph replays
  after warm-up (10 warm-ups and 6 runs under TensorRT-LLM): no host launch, but the GPU-side
  launch of each kernel in the graph is in it.
- TensorRT-LLM 1.3 (``kernel_source`` ``torch_flow``): ``TrtllmAttention.forward`` on the fused QKV
  tensor, so the row includes the fused RoPE + KV-cache append kernel and the FMHA (context) or
  XQA/MMHA (generation) kernel; paged KV cache of 64-token blocks. vLLM 0.24 (``vllm_flash_attn_fa3``
  on Hopper): the backend's ``do_kv_cache_update`` (``reshape_and_cache``) where the forward does not
  include it, then ``impl.forward`` (FlashAttention 3); RoPE is applied outside attention and is not
  in it. SGLang 0.5 (``fa3``, or ``triton`` for head dims FA3 lacks): the backend's forward with its
  cache write.
- Context rows: ``batch_size`` sequences each prefilling ``isl`` tokens on an empty cache (``step``
  0, no chunked prefill), causal. Generation rows: ``batch_size`` sequences each decoding one token
  (``isl`` 1) on ``step`` cached tokens, so each attends ``step + 1`` keys. ``num_heads`` and
  ``num_key_value_heads`` are the heads on the GPU; ``attn_dtype`` the FMHA's compute type
  (generation: always bf16), ``kv_cache_dtype`` bf16 or fp8, ``window_size`` a sliding window (0:
  none). Latencies are stored in milliseconds; they are converted to seconds on reading.

A table is keyed by (heads, KV heads, head dim, attention dtype, KV dtype, window); each key holds
a grid of (batch, length) with length the prompt length (context) or the keys per sequence,
``step + 1`` (generation). The grid is ragged (the collector skips batch x length beyond its token
limits). Where a shape has rows from several kernels (SGLang's fa3 and triton at head dim 256),
the kernel with the most rows in the file is kept, the one the engine picks by default.

Lookup (:meth:`AttentionCurve.step_seconds`): within each measured batch the length is
interpolated linearly in (log length, log seconds); between measured batches, linearly in (log
batch, log seconds). Never a silent extrapolation: a length beyond a batch's measured range takes
the latency at that batch's edge times the roofline's ratio (the speed of light of this shape,
``max(flops / peak, bytes / bandwidth)``, of the two lengths), and a batch beyond the measured
batches the same at the edge batch: *the roofline scaled to agree with the table at its edge*. A
shape no table measures (its heads, KV heads, head dim, dtypes or window) gets no curve, and its
operator is timed by the *plain roofline* path of :mod:`simulator.cost.step_cost`, as is a shape
one phase measures and the other does not. A prefill chunk on cached tokens (chunked prefill, a
prefix-cache hit), which the context table does not measure, is its empty-cache latency times
the roofline ratio of the chunk with and without the cached keys.

A step with both prefill and decode sequences is charged the context kernel for its prefill part
and the generation kernel for its decoding sequences, each at the step's mean length of that part.
The latency is per layer per GPU (heads already divided by tensor parallelism); attention data
parallelism gives the GPU 1/dp of the sequences.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from simulator.cost.kernel_tables.curve_rows import CurveRow, blended_rows_seconds, curve_row, log_linear, row_seconds
from simulator.cost.kernel_tables.parquet import codes, numbers, read_parquet
from simulator.cost.kernel_tables.table import TableOrigin, mean_grid, suffix_minimum
from simulator.cost.tracing import is_traced, scalar_call
from simulator.errors import InputError
from simulator.model.step import Number, Step

ATTENTION_INCLUDES = ("CUDA-graph replay device time of one attention layer (no host launch): the KV-cache write "
                      "and the attention kernel (TensorRT-LLM: with its fused RoPE)")

PHASES = ("context", "generation")

Key = tuple[int, int, int, str, str, int]
"""(heads, KV heads, head dim, attention dtype, KV-cache dtype, window; 0: none)"""


@dataclass(frozen=True)
class AttentionGrid:
    """Measured seconds of one attention shape in one phase: ``seconds[i, j]`` at ``batch[i]`` sequences of
    ``length[j]`` tokens (context: prompt tokens; generation: keys per sequence), NaN where not measured."""

    batch: np.ndarray
    length: np.ndarray
    seconds: np.ndarray
    cut: float = 0.0
    """the largest relative cut the smoothing made to this shape's latencies (:attr:`AttentionTable.smoothing`)"""

    def rows(self) -> list[tuple[float, np.ndarray, np.ndarray]]:
        """(batch, log lengths, log seconds) of each measured batch with at least one length."""
        out = []
        for i, b in enumerate(self.batch):
            have = np.isfinite(self.seconds[i])
            if have.any():
                out.append((float(b), np.log(self.length[have].astype(float)), np.log(self.seconds[i, have])))
        return out


@dataclass(frozen=True)
class AttentionTable:
    """One phase's measured attention latencies (module docstring): rows grouped by shape key, each key's grid
    built (duplicates averaged, then smoothed) when a run first asks for it."""

    origin: TableOrigin
    phase: str
    rows: dict[tuple, np.ndarray]
    """row indices of each shape key (:data:`Key`; MLA's tables key by their own tuple, :mod:`.mla`)"""
    batch: np.ndarray
    length: np.ndarray
    seconds: np.ndarray
    _grids: dict = field(default_factory=dict, compare=False, repr=False)

    def grid(self, key: tuple) -> AttentionGrid | None:
        """The smoothed grid of one shape, or None where the table does not measure it."""
        if key not in self._grids:
            rows = self.rows.get(key)
            self._grids[key] = None if rows is None else _grid(self.batch[rows], self.length[rows], self.seconds[rows])
        return self._grids[key]

    @property
    def smoothing(self) -> float:
        """The largest relative cut made so that a latency does not fall as the batch or length grows (a smaller
        problem can run as a larger one: the excess is the kernel choice's or the clock's noise), over every shape."""
        return max((grid.cut for grid in map(self.grid, self.rows) if grid is not None), default=0.0)


def _grid(batch: np.ndarray, length: np.ndarray, seconds: np.ndarray) -> AttentionGrid:
    (bu, lu), raw = mean_grid(seconds, batch, length)
    smooth, cut = suffix_minimum(raw)
    return AttentionGrid(bu, lu, smooth, cut)


def attention_table(origin: TableOrigin, phase: str, keys: Sequence[tuple], batch: np.ndarray, length: np.ndarray,
                    seconds: np.ndarray) -> AttentionTable:
    """An :class:`AttentionTable` from rows (key, batch, length, seconds)."""
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return _table(origin, phase, {key: np.asarray(rows) for key, rows in groups.items()}, batch, length, seconds)


def _table(origin: TableOrigin, phase: str, rows: dict[tuple, np.ndarray], batch: np.ndarray, length: np.ndarray,
           seconds: np.ndarray) -> AttentionTable:
    if phase not in PHASES:
        raise InputError(f"{origin.path}: attention phase '{phase}' is not one of {', '.join(PHASES)}")
    batch, length = np.asarray(batch, dtype=np.int64), np.asarray(length, dtype=np.int64)
    seconds = np.asarray(seconds, dtype=float)
    if (batch < 1).any() or (length < 1).any() or not np.isfinite(seconds).all() or (seconds <= 0).any():
        raise InputError(f"{origin.path}: {phase} attention rows need batch, length >= 1 and finite latencies > 0")
    return AttentionTable(origin, phase, rows, batch, length, seconds)


COLUMNS = ("kernel_source", "batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim",
           "attn_dtype", "kv_cache_dtype", "window_size", "latency")
DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}
"""the database's attention / KV-cache dtypes -> memwall's (fp16 runs the bf16 kernels at the same speed)"""


def _codes(table, name: str) -> tuple[np.ndarray, list[str]]:
    """A string column as integer codes and the names they stand for."""
    code, names = codes(table, name)
    return code, [str(n) for n in names]


@functools.lru_cache(maxsize=16)
def read_attention_table(path: str, phase: str, gpu: str, engine: str, version: str) -> AttentionTable:
    """One ``context_attention_perf.parquet`` or ``generation_attention_perf.parquet`` (module docstring)."""
    try:
        # Older releases (vLLM 0.14.0's A100 table) have no window_size column: every row is full attention.
        table = read_parquet(path, COLUMNS, dictionary=["kernel_source", "attn_dtype", "kv_cache_dtype"])
        missing = [c for c in COLUMNS if c not in table.column_names and c != "window_size"]
        if missing:
            raise KeyError(f"no column(s) {', '.join(missing)}")
        source, _ = _codes(table, "kernel_source")
        adt, adt_names = _codes(table, "attn_dtype")
        kvdt, kvdt_names = _codes(table, "kv_cache_dtype")
    except Exception as exc:  # pyarrow raises its own error types for a damaged or foreign file
        raise InputError(f"{path}: cannot read the {phase} attention table ({exc})") from None
    ints = {name: np.nan_to_num(numbers(table.column(name)).astype(float)).astype(np.int64)
            for name in ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "window_size")
            if name in table.column_names}
    ints.setdefault("window_size", np.zeros(table.num_rows, dtype=np.int64))
    columns = (ints["num_heads"], ints["num_key_value_heads"], ints["head_dim"], adt, kvdt, ints["window_size"])
    bits = (10, 10, 12, 4, 4, 20)  # one int64 per shape (60 bits), so grouping the rows is one sort
    for name, column, width in zip(("num_heads", "num_key_value_heads", "head_dim", "attn_dtype", "kv_cache_dtype",
                                    "window_size"), columns, bits):
        if ((column < 0) | (column >= 1 << width)).any():
            raise InputError(f"{path}: {name} must lie in 0..{(1 << width) - 1} (or name fewer kinds)")
    packed_rows = np.zeros(len(ints["batch_size"]), dtype=np.int64)
    for column, width in zip(columns, bits):
        packed_rows = (packed_rows << width) | column
    packed, key_of = np.unique(packed_rows, return_inverse=True)
    shifts = np.cumsum((0,) + bits[::-1])[:-1][::-1]  # the shift of each field, first field highest
    keys = [tuple((int(p) >> int(shift)) & ((1 << width) - 1) for shift, width in zip(shifts, bits)) for p in packed]
    # Per key, the kernel with the most rows in the file (the engine's default where a shape has two).
    rank = np.bincount(source)
    best = np.full(len(packed), -1)
    np.maximum.at(best, key_of, rank[source])
    keep = rank[source] == best[key_of]
    rows: dict[tuple, np.ndarray] = {}
    order = np.argsort(key_of, kind="stable")
    bounds = np.searchsorted(key_of[order], np.arange(len(packed) + 1))
    for k, (heads, kv, dim, a, c, window) in enumerate(keys):
        if adt_names[a] not in DTYPES or kvdt_names[c] not in DTYPES:
            continue
        chosen = order[bounds[k]:bounds[k + 1]]
        rows[(heads, kv, dim, DTYPES[adt_names[a]], DTYPES[kvdt_names[c]], window)] = chosen[keep[chosen]]
    # Context: the prompt length; generation: the keys each query attends, its cached tokens plus itself.
    length = ints["isl"] if phase == "context" else ints["step"] + 1
    seconds = numbers(table.column("latency")).astype(float) * 1e-3  # stored in milliseconds
    origin = TableOrigin(gpu, engine, version, path, ATTENTION_INCLUDES)
    return _table(origin, phase, rows, ints["batch_size"], length, seconds)


@dataclass(frozen=True)
class AttentionShape:
    """The speed of light of one attention layer's shape on one GPU, for the edge scaling (SI units)."""

    heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_element: float
    activation_bytes_per_element: float
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float
    window: int = 0

    def roofline_seconds(self, batch: Number, queries: Number, keys_before: Number) -> Number:
        """Seconds of ``batch`` sequences each adding ``queries`` tokens on ``keys_before`` cached ones, causal:
        ``max(4 n d pairs / peak, (K/V read and written + q and o) bytes / bandwidth)``."""
        keys = keys_before + queries
        pairs = queries * keys_before + queries * (queries + 1) / 2.0
        if self.window:
            pairs = np.minimum(pairs, queries * self.window)
            keys = np.minimum(keys, self.window + queries)
        n, g, d = self.heads, self.kv_heads, self.head_dim
        flops = 4.0 * n * d * pairs * batch
        moved = batch * (2.0 * g * d * self.kv_bytes_per_element * (keys + queries)
                         + 2.0 * n * d * self.activation_bytes_per_element * queries)
        return np.maximum(flops / self.peak_flops_per_second, moved / self.bandwidth_bytes_per_second)

    def sequence_seconds(self, queries: float, keys_before: float) -> float:
        """:meth:`roofline_seconds` of one sequence, in plain floats (the edge scaling's, :class:`PhaseCurve`)."""
        return _sequence_roofline(self, queries, keys_before)


class SequenceRoofline(Protocol):
    """The speed of light of one sequence of a kernel's shape, which scales a measured edge (:class:`PhaseCurve`)."""

    def sequence_seconds(self, queries: float, keys_before: float) -> float:
        """Seconds of one sequence adding ``queries`` tokens on ``keys_before`` cached ones."""
        ...


def _sequence_roofline(shape: AttentionShape, queries: float, keys_before: float) -> float:
    """:meth:`AttentionShape.roofline_seconds` of one sequence, in plain floats (the scalar lookup's)."""
    keys = keys_before + queries
    pairs = queries * keys_before + queries * (queries + 1) / 2.0
    if shape.window:
        pairs = min(pairs, queries * shape.window)
        keys = min(keys, shape.window + queries)
    n, g, d = shape.heads, shape.kv_heads, shape.head_dim
    flops = 4.0 * n * d * pairs
    moved = 2.0 * g * d * shape.kv_bytes_per_element * (keys + queries) + 2.0 * n * d * shape.activation_bytes_per_element * queries
    return max(flops / shape.peak_flops_per_second, moved / shape.bandwidth_bytes_per_second)


BATCH_MEMO_MAX = 4096
"""(lower row, upper row, weight, clipped batch) remembered per batch size by :meth:`PhaseCurve.batch_weights`"""


@dataclass(frozen=True)
class PhaseCurve:
    """One shape's measured grid in one phase, ready to look up (module docstring)."""

    shape: SequenceRoofline
    phase: str
    batches: np.ndarray
    """measured batch sizes, ascending"""
    rows: tuple[tuple[np.ndarray, np.ndarray], ...]
    """(log lengths, log seconds) per measured batch"""
    lines: tuple[CurveRow, ...] = ()
    """``rows`` ready for the lookup (:class:`~simulator.cost.kernel_tables.curve_rows.CurveRow`)"""
    batch_list: tuple[float, ...] = ()
    _batch_memo: dict = field(default_factory=dict, compare=False, repr=False)

    def _sequence(self, length: float) -> float:
        if self.phase == "context":
            return self.shape.sequence_seconds(length, 0.0)
        return self.shape.sequence_seconds(1.0, length - 1.0)

    def _scalar_row(self, index: int, length: float) -> float:
        """Log seconds of measured batch ``index`` at ``length``: linear in (log length, log seconds) between its
        rows, the roofline's ratio beyond them."""
        line = self.lines[index]
        clipped = min(max(length, line.first), line.last)
        value = log_linear(line.log_lengths, line.log_seconds, math.log(clipped))
        if clipped != length:
            value += math.log(self._sequence(length) / self._sequence(clipped))
        return value

    def length_seconds(self, batch: float) -> Callable[[float], float]:
        """``scalar_seconds(batch, length)`` as a function of the length alone, the batch's rows and weight resolved
        once: a traced decode tick (simulator.cost.tracing) calls it for every tick of that batch. The same
        operations in the same order as :meth:`scalar_seconds`, so the same floats."""
        lower, upper, w, b_clip = self.batch_weights(batch)
        if w == 0.0 or w == 1.0:
            return row_seconds(self.lines[lower if w == 0.0 else upper], batch / b_clip, self._sequence)
        return blended_rows_seconds(self.lines[lower], self.lines[upper], w, batch / b_clip, self._sequence)

    def batch_weights(self, batch: float) -> tuple[int, int, float, float]:
        """(lower row, upper row, weight of the upper, clipped batch) of a batch size: linear in log batch between the
        measured batches, clipped to them. Remembered per batch (a run asks the same few again and again)."""
        hit = self._batch_memo.get(batch)
        if hit is not None:
            return hit
        batches = self.batch_list
        b_clip = min(max(batch, batches[0]), batches[-1])
        if len(batches) == 1:
            out = (0, 0, 0.0, b_clip)
        else:
            upper = min(max(bisect.bisect_left(batches, b_clip), 1), len(batches) - 1)
            lower = upper - 1
            w = (math.log(b_clip) - math.log(batches[lower])) / (math.log(batches[upper]) - math.log(batches[lower]))
            out = (lower, upper, min(max(w, 0.0), 1.0), b_clip)
        if len(self._batch_memo) >= BATCH_MEMO_MAX:
            self._batch_memo.clear()
        self._batch_memo[batch] = out
        return out

    def cached_ratio(self, chunk: float, cached: float) -> float:
        """The roofline's seconds of a ``chunk``-token prefill after ``cached`` cached tokens over the same chunk
        alone: the context tables measure prompts without a cache, and a cached prefix scales them by this."""
        return self.shape.sequence_seconds(chunk, cached) / self.shape.sequence_seconds(chunk, 0.0)

    def prefill_seconds(self, prefill: float, sequences: float, decoders: float, prefill_pairs: float,
                        share: float) -> float:
        """Seconds of the context kernel of a step's prefilling sequences (plain floats): ``prefill`` tokens over the
        ``sequences - decoders`` sequences that prefill (at least one), each chunk after the cached tokens its
        ``prefill_pairs`` imply, ``share`` of them on this GPU.

        A speculative verification step decodes k + 1 queries per sequence, so its decode tokens can reach the
        sequence count: the table measures one query per sequence, and each query is charged as a one-query
        sequence of its own."""
        prefillers = max(sequences - decoders, 1.0)
        chunk = prefill / max(prefillers, 1e-300)
        cached = max(prefill_pairs / prefill - (chunk + 1.0) / 2.0, 0.0)
        p = max(chunk, 1.0)
        seconds = self.scalar_seconds(max(prefillers * share, 1e-9), p)
        if cached > 0:
            seconds *= self.cached_ratio(p, cached)
        return seconds

    def scalar_seconds(self, batch: float, length: float) -> float:
        """Seconds of ``batch`` sequences of ``length`` (plain floats): log-log between the measured batches' rows."""
        lower, upper, w, b_clip = self.batch_weights(batch)
        # (1 - w) a + w b is a exactly where w = 0 and b where w = 1 (every log latency is finite): one row suffices.
        if w == 0.0:
            value = self._scalar_row(lower, length)
        elif w == 1.0:
            value = self._scalar_row(upper, length)
        else:
            value = (1.0 - w) * self._scalar_row(lower, length) + w * self._scalar_row(upper, length)
        return math.exp(value) * (batch / b_clip)

    def _array_row(self, index: int, length: np.ndarray) -> np.ndarray:
        """:meth:`_scalar_row` of an array of lengths: the same IEEE operations entry by entry (logarithms by
        ``math.log``, as the scalar path takes them: numpy's may differ in the last bit), so bit for bit equal."""
        line = self.lines[index]
        lens, secs = line.log_lengths_array, line.log_seconds_array
        clipped = np.minimum(np.maximum(length, line.first), line.last)
        x = np.fromiter(map(math.log, clipped.tolist()), dtype=float, count=clipped.size)
        if len(lens) == 1:
            value = np.full(x.shape, secs[0])
        else:
            j = np.minimum(np.maximum(np.searchsorted(lens, x, side="left"), 1), len(lens) - 1)
            below, low = lens[j - 1], secs[j - 1]
            inner = low + (x - below) / (lens[j] - below) * (secs[j] - low)
            value = np.where(x <= lens[0], secs[0], np.where(x >= lens[-1], secs[-1], inner))
        beyond = np.nonzero(clipped != length)[0]
        for k in beyond.tolist():
            value[k] += math.log(self._sequence(float(length[k])) / self._sequence(float(clipped[k])))
        return value

    def seconds_array(self, batch: np.ndarray, length: np.ndarray) -> np.ndarray:
        """:meth:`scalar_seconds` of 1-d arrays of batches and lengths, entry by entry equal to it bit for bit: each
        measured batch's row is looked up once for every entry that needs it."""
        sizes, where = np.unique(batch, return_inverse=True)
        weights = [self.batch_weights(size) for size in sizes.tolist()]
        lower, upper, w, b_clip = (np.array(column)[where] for column in zip(*weights))
        lower_value = np.zeros(len(batch))
        upper_value = np.zeros(len(batch))
        needs_lower, needs_upper = w != 1.0, w != 0.0
        for row in np.unique(np.concatenate([lower[needs_lower], upper[needs_upper]])).tolist():
            as_lower = np.nonzero(needs_lower & (lower == row))[0]
            as_upper = np.nonzero(needs_upper & (upper == row))[0]
            entries = np.concatenate([as_lower, as_upper])
            value = self._array_row(row, length[entries])
            lower_value[as_lower] = value[:len(as_lower)]
            upper_value[as_upper] = value[len(as_lower):]
        # As the scalar path: the lower row alone where w = 0, the upper alone where w = 1, else the blend.
        blend = (1.0 - w) * lower_value + w * upper_value
        value = np.where(w == 0.0, lower_value, np.where(w == 1.0, upper_value, blend))
        exps = np.fromiter(map(math.exp, value.tolist()), dtype=float, count=value.size)
        return exps * (batch / b_clip)


def phase_curve(grid: AttentionGrid | None, shape: SequenceRoofline, phase: str) -> PhaseCurve | None:
    if grid is None:
        return None
    rows = grid.rows()
    if not rows:
        return None
    return PhaseCurve(shape, phase, np.array([r[0] for r in rows]), tuple((r[1], r[2]) for r in rows),
                      tuple(curve_row(r[1], r[2]) for r in rows), tuple(r[0] for r in rows))


ARRAY_LOOKUP_FROM = 8
"""Entries from which an array step's lookup runs on arrays (fewer: entry by entry, cheaper for a handful)"""


@dataclass(frozen=True)
class AttentionCurve:
    """Measured seconds of one attention operator (one layer on one GPU) as a function of the step."""

    context: PhaseCurve
    generation: PhaseCurve
    data_parallel: int = 1

    def step_seconds(self, step: Step) -> Number:
        """Seconds of one layer's attention in ``step``: the context kernel for the prefilling sequences plus the
        generation kernel for the decoding ones (module docstring); 0 for a step with neither."""
        share = 1.0 / self.data_parallel  # this GPU's share of the sequences
        arrays = (step.tokens, step.prefill_tokens, step.sequences, step.attention_pairs, step.prefill_attention_pairs)
        if is_traced(*arrays):
            # A decode tick traced as a function of its keys (simulator.cost.tracing): the lookup is one call.
            return self._traced_step_seconds(*arrays, share)
        if not (isinstance(arrays[0], np.ndarray) or isinstance(arrays[1], np.ndarray)
                or isinstance(arrays[2], np.ndarray) or isinstance(arrays[3], np.ndarray)
                or isinstance(arrays[4], np.ndarray)):
            return self._scalar_step_seconds(step, share)
        # An array step equals its entries costed one at a time bit for bit, as the engine's decode stretches need
        # (simulator.engine.engine): the same float arithmetic entry by entry.
        columns = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in arrays))
        shape = columns[0].shape
        flat = [c.reshape(-1) for c in columns]
        if flat[0].size < ARRAY_LOOKUP_FROM:
            out = [self._scalar_step_seconds(Step(tokens=t, prefill_tokens=p, sequences=q, logit_tokens=0.0,
                                                  attention_pairs=a, prefill_attention_pairs=pa, score_elements=0.0,
                                                  context_tokens=0.0), share)
                   for t, p, q, a, pa in zip(*(c.tolist() for c in flat))]
            return np.array(out, dtype=float).reshape(shape)
        tokens, prefill, sequences, pairs, prefill_pairs = flat
        return self._array_step_seconds(tokens, prefill, sequences, pairs, prefill_pairs, share).reshape(shape)

    def _scalar_step_seconds(self, step: Step, share: float) -> float:
        """:meth:`step_seconds` of a step of plain numbers, in plain floats (the same formulas)."""
        return self._scalar_fields_seconds(step.tokens, step.prefill_tokens, step.sequences, step.attention_pairs,
                                           step.prefill_attention_pairs, share)

    def _scalar_fields_seconds(self, tokens: Number, prefill_tokens: Number, sequences: Number, pairs: Number,
                               prefill_pairs: Number, share: float) -> float:
        """:meth:`_scalar_step_seconds` of the step's fields it reads."""
        decoders = float(tokens - prefill_tokens)
        prefill = float(prefill_tokens)
        out = 0.0
        if decoders > 0:
            keys = float(pairs - prefill_pairs) / decoders
            out += self.generation.scalar_seconds(max(decoders * share, 1e-9), max(keys, 1.0))
        if prefill > 0:
            out += self.context.prefill_seconds(prefill, float(sequences), decoders, float(prefill_pairs), share)
        return out

    def _traced_step_seconds(self, tokens: Number, prefill_tokens: Number, sequences: Number, pairs: Number,
                             prefill_pairs: Number, share: float) -> Number:
        """:meth:`_scalar_fields_seconds` where some field is traced: one recorded call. A decode tick whose batch is a
        plain number (the engine's traced ticks) calls the generation lookup of that batch, resolved once
        (:meth:`PhaseCurve.length_seconds`), with the keys per sequence: the same floats as the scalar path."""
        if not is_traced(tokens, prefill_tokens) and float(prefill_tokens) == 0.0 and float(tokens) > 0:
            decoders = float(tokens - prefill_tokens)
            lookup = self.generation.length_seconds(max(decoders * share, 1e-9))
            keys = np.maximum((pairs - prefill_pairs) / decoders, 1.0)
            return scalar_call(lookup, keys)
        return scalar_call(self._scalar_fields_seconds, tokens, prefill_tokens, sequences, pairs, prefill_pairs, share)

    def _array_step_seconds(self, tokens: np.ndarray, prefill: np.ndarray, sequences: np.ndarray, pairs: np.ndarray,
                            prefill_pairs: np.ndarray, share: float) -> np.ndarray:
        """:meth:`_scalar_step_seconds` of 1-d arrays: the same operations in the same order, entry by entry."""
        decoders = tokens - prefill
        out = np.zeros(len(tokens))
        decoding = np.flatnonzero(decoders > 0)
        if len(decoding):
            d = decoders[decoding]
            keys = (pairs[decoding] - prefill_pairs[decoding]) / d
            out[decoding] = self.generation.seconds_array(np.maximum(d * share, 1e-9), np.maximum(keys, 1.0))
        filling = np.flatnonzero(prefill > 0)
        if len(filling):
            chunk_tokens = prefill[filling]
            prefillers = np.maximum(sequences[filling] - decoders[filling], 1.0)  # as in the scalar path
            chunk = chunk_tokens / np.maximum(prefillers, 1e-300)
            cached = np.maximum(prefill_pairs[filling] / chunk_tokens - (chunk + 1.0) / 2.0, 0.0)
            p = np.maximum(chunk, 1.0)
            ctx = self.context.seconds_array(np.maximum(prefillers * share, 1e-9), p)
            for k in np.flatnonzero(cached > 0).tolist():
                ctx[k] *= self.context.cached_ratio(float(p[k]), float(cached[k]))
            out[filling] = out[filling] + ctx
        return out


@dataclass(frozen=True)
class AttentionTables:
    """The context and generation tables of one run."""

    context: AttentionTable
    generation: AttentionTable

    def curve(self, shape: AttentionShape, compute_dtype: str, data_parallel: int = 1) -> AttentionCurve | None:
        """The curve of ``shape``, or None where either phase lacks it (then the roofline times the operator).

        The context kernel runs in FP8 where the operator computes in FP8 over an FP8 cache and the table has
        that shape (TensorRT-LLM's FP8 FMHA), else in bf16; the generation kernel always in bf16."""
        kv = "fp8" if shape.kv_bytes_per_element <= 1 else "bf16"
        if shape.kv_bytes_per_element not in (1, 2):
            return None
        base = (shape.heads, shape.kv_heads, shape.head_dim)
        ctx_grid = None
        if compute_dtype == "fp8" and kv == "fp8":
            ctx_grid = self.context.grid((*base, "fp8", kv, shape.window))
        ctx_grid = ctx_grid or self.context.grid((*base, "bf16", kv, shape.window))
        context = phase_curve(ctx_grid, shape, "context")
        generation = phase_curve(self.generation.grid((*base, "bf16", kv, shape.window)), shape, "generation")
        if context is None or generation is None:
            return None
        return AttentionCurve(context, generation, data_parallel)


def measured_attention(root, folder: str, display: str, family: str,
                       version: str) -> tuple[AttentionTables | None, str]:
    """The attention tables of an AIConfigurator system folder under ``family``, from the release nearest the
    GEMMs' ``version`` (so one run's kernels come from one release where possible), and that release ("" if none)."""
    from simulator.cost.kernel_tables import aiconfigurator

    files = {phase: f"{phase}_attention_perf.parquet" for phase in PHASES}
    both = set(aiconfigurator.measured_versions(root, folder, "attention", family, files["context"]))
    versions = [v for v in aiconfigurator.measured_versions(root, folder, "attention", family, files["generation"])
                if v in both]
    if not versions:
        return None, ""
    chosen = aiconfigurator.nearest_release(versions, aiconfigurator.release(version))
    context, generation = (read_attention_table(str(root / folder / "attention" / family / chosen / files[phase]),
                                                phase, display, family, chosen) for phase in PHASES)
    return AttentionTables(context, generation), chosen
