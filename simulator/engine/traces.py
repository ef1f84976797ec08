"""Trace files: one request per row, with its arrival time, prompt tokens and output tokens.

The format is recognised by its column names (case, spaces and underscores ignored):

================  ===========================  ===================  ===================  ===========
format            arrival                      prompt tokens        output tokens        0 tokens
================  ===========================  ===================  ===================  ===========
memwall (ours)    arrival_seconds (arrival,    prompt_tokens        output_tokens        an error
                  time, timestamp)             (input_tokens)       (generated_tokens)
Azure 2023/2024   TIMESTAMP                    ContextTokens        GeneratedTokens      row skipped
Vidur             arrived_at (optional)        num_prefill_tokens   num_decode_tokens    row skipped
BurstGPT          Timestamp                    Request tokens       Response tokens      row skipped
vLLM result JSON  start_times (if present)     input_lens           output_lens          row skipped
Mooncake (JSONL)  timestamp (milliseconds)     input_length         output_length        row skipped
================  ===========================  ===================  ===================  ===========

A Mooncake (FAST'25) trace's ``hash_ids`` (512-token prefix blocks) are read as conversations by
:func:`simulator.engine.sessions.with_hash_prefixes` (kvcache-ai/Mooncake ``FAST25-release/README.md``).

Sources: the Azure LLM inference trace schemas (Azure/AzurePublicDataset,
AzureLLMInferenceDataset2023.md and 2024.md: TIMESTAMP is a date-time, written
``2023-11-16 18:15:46.6805900`` in 2023 and ``2024-05-10 00:00:00.009930+00:00`` in 2024);
Vidur's processed traces (microsoft/vidur ``data/processed_traces/splitwise_*.csv``;
its length-only traces have no ``arrived_at``); the BurstGPT schema (HPMLL/BurstGPT README:
Timestamp in seconds from the first day, ``Response tokens`` 0 marks a failed request);
vLLM's ``benchmark_serving.py`` / ``vllm bench serve`` result JSON (``input_lens``,
``output_lens`` with 0 for a failed request, ``errors``, and in recent versions
``start_times`` per request). External traces record failed requests with 0 tokens, so
there such rows are skipped and counted in a note; in our own format 0 is an error.

Arrival times are numbers of seconds or ISO 8601 date-times (``YYYY-MM-DD[ T]hh:mm:ss[.f]``,
up to 9 fractional digits, optional ``Z`` or ``+hh:mm`` offset; without an offset a
date-time is taken as UTC). The first data row decides which of the two a column holds.
Every cell is checked: times finite (within +-1e12 s), token counts whole numbers in
[1, 2^31) (0 allowed where the format skips such rows); an error names the file, line and
column. Files are UTF-8, with or without a byte-order mark.

CSV is read column-wise by pyarrow when it is installed (from the clone: ``pip install '.[traces]'``, or ``pip install pyarrow``)
and otherwise by the csv module into numpy arrays chunk by chunk; both give identical
arrays (the columnar path hands any file it finds a fault in to the csv path, so error
messages come from one place). JSONL (``.jsonl``/``.ndjson``: one object per line) and
JSON (``.json``: a vLLM result or a list of objects) are read by the json module.

Why this module is over 600 lines: each format in the table above differs from the others only in
its columns and cell rules, and all share one checked reader (csv, pyarrow, JSON lines), so a cell
is judged by the same rules whichever reader met it.
"""

from __future__ import annotations

import codecs
import csv
import gc
import json
import math
import re
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import InputError
from simulator.files import path_kind

MAX_TOKENS_EXCLUSIVE = 2**31
"""Token counts must be below this (int32 range, what serving engines index tokens with)."""

MAX_TIME_SECONDS = 1e12
"""Largest |arrival time| accepted, seconds (~31,700 years): keeps spans finite and catches milliseconds."""

CHUNK_ROWS = 1 << 16
"""Rows held as Python objects (cell text, JSON values) before they are converted into numpy (bounds memory)."""

ARROW_BLOCK_BYTES = 1 << 20
"""pyarrow CSV block size, bytes: 1 MiB keeps its buffers small (16 MiB blocks peaked ~270 MB higher
on a 10^7-row file) at no loss of speed (benchmarks/bench_traces.py)."""

_NS_PER_SECOND = 10**9
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_DIGITS = re.compile(r"\d+")
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?)?"
    r"(Z|[+-]\d{2}(?::?\d{2})?)?"
)


MOONCAKE = "Mooncake"
"""The Mooncake (FAST'25) trace format's name."""


@dataclass(frozen=True)
class TraceFormat:
    """Column names of one trace format (normalised: lower case, letters and digits only)."""

    name: str
    arrival: tuple[str, ...]
    prompt: tuple[str, ...]
    output: tuple[str, ...]
    columns: str
    """the column names as the format's documentation writes them, for messages"""
    zero_skips: bool = True
    """a 0 token count marks a failed request: the row is skipped and counted, not an error"""
    arrival_optional: bool = False
    arrival_seconds_per_unit: float = 1.0
    """seconds per unit of the arrival column when it holds numbers (Mooncake: milliseconds, 1e-3)"""


FORMATS = (
    TraceFormat("memwall", ("arrivalseconds", "arrival", "time", "timestamp"), ("prompttokens", "inputtokens"),
                ("outputtokens", "generatedtokens"), "arrival_seconds, prompt_tokens, output_tokens", zero_skips=False),
    TraceFormat("Azure LLM inference", ("timestamp",), ("contexttokens",), ("generatedtokens",),
                "TIMESTAMP, ContextTokens, GeneratedTokens"),
    TraceFormat("Vidur", ("arrivedat",), ("numprefilltokens",), ("numdecodetokens",),
                "arrived_at, num_prefill_tokens, num_decode_tokens", arrival_optional=True),
    TraceFormat("BurstGPT", ("timestamp",), ("requesttokens",), ("responsetokens",),
                "Timestamp, Request tokens, Response tokens"),
    # kvcache-ai/Mooncake FAST25-release/README.md: JSONL, timestamp in milliseconds, hash_ids of 512-token prefix
    # blocks (read by simulator.engine.sessions.with_hash_prefixes).
    TraceFormat(MOONCAKE, ("timestamp",), ("inputlength",), ("outputlength",),
                "timestamp (ms), input_length, output_length, hash_ids", arrival_seconds_per_unit=1e-3),
)
VLLM_FORMAT = TraceFormat("vLLM benchmark result", ("starttimes",), ("inputlens",), ("outputlens",),
                          "input_lens, output_lens, start_times", arrival_optional=True)


@dataclass(frozen=True)
class Trace:
    """A trace's requests in file order: arrival seconds from the earliest request, token counts.

    ``timed`` is False for a trace without arrival times (all zeros then); ``notes`` are
    warnings for the user (rows skipped, no arrival times).
    """

    path: Path
    arrival_seconds: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    format: str = "memwall"
    timed: bool = True
    notes: tuple[str, ...] = field(default=())
    prefix_id: np.ndarray | None = None
    """our format's optional ``prefix_id`` column (-1: no shared prefix); see simulator.engine.prefix_cache"""
    prefix_tokens: np.ndarray | None = None
    """our format's optional ``prefix_tokens`` column: the shared prefix's length, part of the prompt"""

    def __len__(self) -> int:
        return len(self.arrival_seconds)


class _BadCell(ValueError):
    """A cell that fails its check; the caller adds where it is."""


def _normalise(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


# -- cells ----------------------------------------------------------------------------------------------


def _count_from_float(number: float, zero_ok: bool) -> int:
    if not math.isfinite(number):
        raise _BadCell("is not a finite number")
    if number != math.floor(number):
        raise _BadCell("is not a whole number of tokens")
    return _count_in_range(int(number), zero_ok)


def _count_in_range(number: int, zero_ok: bool) -> int:
    low = 0 if zero_ok else 1
    if number < low:
        raise _BadCell(f"must be >= {low} tokens")
    if number >= MAX_TOKENS_EXCLUSIVE:
        raise _BadCell(f"must be < 2^31 = {MAX_TOKENS_EXCLUSIVE:,} tokens")
    return number


def _count_text(text: str, zero_ok: bool) -> int:
    try:
        number = float(text)
    except ValueError:
        raise _BadCell("is not a number") from None
    return _count_from_float(number, zero_ok)


def _count_value(value: Any, zero_ok: bool) -> int:
    """A token count from JSON: a number or a numeric string."""
    if isinstance(value, bool) or value is None:
        raise _BadCell("is not a number")
    if isinstance(value, int):
        return _count_in_range(value, zero_ok)
    if isinstance(value, float):
        return _count_from_float(value, zero_ok)
    if isinstance(value, str):
        return _count_text(value, zero_ok)
    raise _BadCell("is not a number")


_BEYOND = f"is beyond +-{MAX_TIME_SECONDS:g} s (milliseconds or nanoseconds, not seconds?)"


def _seconds_from_float(number: float) -> float:
    if not math.isfinite(number):
        raise _BadCell("is not a finite number of seconds")
    if abs(number) > MAX_TIME_SECONDS:
        raise _BadCell(_BEYOND)
    return number


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def datetime_ns(text: str) -> int | None:
    """ISO 8601 date-time -> integer nanoseconds since 1970-01-01 UTC; None if ``text`` is not one.

    No offset means UTC (not the local zone, so a trace reads the same on every machine).
    Up to 9 fractional digits are kept exactly (the Azure 2023 trace writes 7).
    """
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return _datetime_ns_regex(text)
    delta = stamp - (_EPOCH if stamp.tzinfo is None else _EPOCH_UTC)
    ns = ((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000
    # fromisoformat keeps microseconds and drops further digits; add them back.
    dot = text.find(".", 10)
    if dot < 0:
        dot = text.find(",", 10)
    if dot >= 0 and text[dot + 7:dot + 8].isdigit():
        digits = _DIGITS.match(text, dot + 1)
        width = digits.end() - dot - 1 if digits else 0
        if width > 9:
            return None
        if width > 6:
            ns += int(text[dot + 7:dot + 1 + width].ljust(3, "0"))
    return ns


def _datetime_ns_regex(text: str) -> int | None:
    """The forms fromisoformat refuses that pyarrow's ISO 8601 parser takes (surrounding blanks)."""
    match = _ISO.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        days = date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None
    h, m, s = int(hour or 0), int(minute or 0), int(second or 0)
    if h > 23 or m > 59 or s > 59:
        return None
    ns = (((days * 24 + h) * 60 + m) * 60 + s) * _NS_PER_SECOND + int((fraction or "").ljust(9, "0"))
    if zone and zone != "Z":
        offset_h, offset_m = int(zone[1:3]), int(zone[-2:]) if len(zone) > 3 else 0
        if offset_h > 23 or offset_m > 59:
            return None
        ns -= (1 if zone[0] == "+" else -1) * (offset_h * 60 + offset_m) * 60 * _NS_PER_SECOND
    return ns


def _datetime_cell(text: str) -> int:
    ns = datetime_ns(text)
    if ns is None:
        raise _BadCell("is not a number of seconds nor an ISO date-time (YYYY-MM-DD hh:mm:ss[.f][+hh:mm])")
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise _BadCell("is outside 1677-09-21 .. 2262-04-11 (the range of nanosecond timestamps)")
    return ns


class _TimeColumn:
    """Parses one trace's arrival cells: seconds or date-times, as its first value was."""

    def __init__(self, first: Any) -> None:
        self.datetime = isinstance(first, str) and not _is_number(first)
        self.dtype = np.int64 if self.datetime else np.float64

    def text(self, text: str) -> float | int:
        if self.datetime:
            if datetime_ns(text) is None and _is_number(text):
                raise _BadCell("is a number, but the first row's arrival was a date-time")
            return _datetime_cell(text)
        try:
            number = float(text)
        except ValueError:
            if datetime_ns(text) is not None:
                raise _BadCell("is a date-time, but the first row's arrival was a number of seconds") from None
            raise _BadCell("is not a number of seconds nor an ISO date-time") from None
        return _seconds_from_float(number)

    def value(self, value: Any) -> float | int:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _BadCell("is not a number of seconds nor an ISO date-time")
        if self.datetime:
            raise _BadCell("is a number, but the first row's arrival was a date-time")
        if isinstance(value, int) and abs(value) > MAX_TIME_SECONDS:
            raise _BadCell(_BEYOND)
        return _seconds_from_float(float(value))


# -- columns ----------------------------------------------------------------------------------------------


class _Columns:
    """Arrival, prompt and output columns filled in place in arrays sized by the file's line count.

    ``capacity`` is an upper bound on the rows (lines in the file); pages never written are
    never resident, so the peak stays near one copy of the data (24 bytes a row).
    """

    def __init__(self, capacity: int, time_dtype: type) -> None:
        self.times: np.ndarray = np.empty(capacity, dtype=time_dtype)
        self.prompt = np.empty(capacity, dtype=np.int64)
        self.output = np.empty(capacity, dtype=np.int64)
        self.rows = 0
        self.pending: tuple[list, list, list] = ([], [], [])
        self.skipped = 0
        self.skipped_what = "rows with 0 prompt or output tokens"

    def add(self, arrival: float, prompt: int, output: int) -> None:
        times, prompts, outputs = self.pending
        times.append(arrival)
        prompts.append(prompt)
        outputs.append(output)
        if len(times) >= CHUNK_ROWS:
            self.flush()

    def add_chunk(self, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
        self.flush()
        self._put(arrival, prompt, output)

    def _put(self, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
        start, stop = self.rows, self.rows + len(arrival)
        if stop > len(self.times):  # more rows than lines: cannot happen for a file, kept for safety
            size = max(stop, 2 * len(self.times))
            self.times, self.prompt, self.output = (np.resize(a, size) for a in (self.times, self.prompt, self.output))
        self.times[start:stop], self.prompt[start:stop], self.output[start:stop] = arrival, prompt, output
        self.rows = stop

    def flush(self) -> None:
        times, prompts, outputs = self.pending
        if times:
            self._put(np.array(times, dtype=self.times.dtype), np.array(prompts), np.array(outputs))
            for values in self.pending:
                values.clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(arrival seconds from the earliest request, prompt tokens, output tokens); converts in place."""
        self.flush()
        n = self.rows
        times = self.times[:n]
        if n:
            times -= times.min()
        if times.dtype == np.int64:
            seconds = self.times.view(np.float64)[:n]
            for start in range(0, n, CHUNK_ROWS):
                part = slice(start, start + CHUNK_ROWS)
                # Wrapping int64 subtraction read as uint64 is the exact span even beyond 2^63 ns.
                seconds[part] = times[part].view(np.uint64) / _NS_PER_SECOND
        else:
            seconds = times
        return seconds, self.prompt[:n], self.output[:n]


def _finish(path: Path, fmt: TraceFormat, columns: _Columns, timed: bool, notes: list[str]) -> Trace:
    columns.flush()
    if columns.skipped:
        notes.insert(0, f"{path.name}: skipped {columns.skipped:,} of {columns.rows + columns.skipped:,} "
                        f"{columns.skipped_what} (failed requests, as the {fmt.name} format records them)")
    seconds, prompts, outputs = columns.arrays()
    if fmt.arrival_seconds_per_unit != 1.0 and timed:
        seconds = seconds * fmt.arrival_seconds_per_unit
    if not len(seconds):
        skipped = f" (all {columns.skipped:,} rows had 0 tokens)" if columns.skipped else ""
        raise InputError(f"{path}: the trace has no requests{skipped}")
    return Trace(path, seconds, prompts, outputs, fmt.name, timed, tuple(notes))


def _untimed_note(path: Path, fmt: TraceFormat, hint: str = "") -> str:
    return (f"{path.name}: a {fmt.name} file without arrival times: all requests arrive at t = 0 "
            f"(a closed batch) unless --qps draws arrivals{hint}")


# -- format detection -------------------------------------------------------------------------------------


def _detect(path: Path, names: list[str]) -> tuple[TraceFormat, int | None, int, int]:
    """(format, arrival index or None, prompt index, output index) from a header's names."""
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault(_normalise(name), i)

    def find(candidates: tuple[str, ...]) -> int | None:
        return next((index[c] for c in candidates if c in index), None)

    best: tuple[int, TraceFormat] | None = None
    for fmt in FORMATS:
        arrival, prompt, output = find(fmt.arrival), find(fmt.prompt), find(fmt.output)
        if prompt is not None and output is not None and (arrival is not None or fmt.arrival_optional):
            return fmt, arrival, prompt, output
        found = sum(i is not None for i in (prompt, output))
        if found and (best is None or found > best[0]):
            best = (found, fmt)
    shown = ", ".join(names) or "none"
    known = "; ".join(f"{f.name} ({f.columns})" for f in FORMATS)
    if best is not None:
        raise InputError(f"{path}: missing a column of the {best[1].name} format, which needs "
                         f"{best[1].columns}; found: {shown}")
    raise InputError(f"{path}: no trace format has these columns: {shown}; known formats: {known}")


# -- text -------------------------------------------------------------------------------------------------


def check_utf8(path: Path) -> int:
    """The number of lines in ``path``; InputError naming the line and byte unless it is UTF-8 (BOM allowed)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, lines = 0, 1
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
            if head in (b"\xff\xfe", b"\xfe\xff"):
                raise InputError(f"{path}: the file is UTF-16; save it as UTF-8")
            handle.seek(0)
            while block := handle.read(1 << 22):
                try:
                    if not (block.isascii() and not decoder.getstate()[0]):  # ASCII needs no decoding
                        decoder.decode(block)
                except UnicodeDecodeError as exc:
                    bad = block[exc.start]
                    line = lines + block.count(b"\n", 0, exc.start)
                    raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{bad:02x} at offset "
                                     f"{offset + exc.start:,}); save the file as UTF-8") from None
                offset += len(block)
                lines += block.count(b"\n")
            decoder.decode(b"", final=True)
        return lines
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (the file ends inside a character); save it as UTF-8") from None
    except OSError as exc:
        raise InputError(f"--trace: cannot read {path}: {exc.strerror}") from None


def _csv_rows(path: Path) -> Generator[tuple[int, list[str]], None, None]:
    """(line number, cells) of non-blank rows; csv errors become InputErrors."""
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        try:
            for row in reader:
                if row and (len(row) > 1 or row[0].strip()):  # blank lines are skipped, as pyarrow does
                    yield reader.line_num, row
        except csv.Error as exc:
            raise InputError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None


# -- CSV --------------------------------------------------------------------------------------------------


def _counts_ok(values: np.ndarray, zero_ok: bool) -> bool:
    """The vectorised form of the count checks: finite whole numbers in [low, 2^31) (nan fails)."""
    low = 0 if zero_ok else 1
    return bool(np.all((values >= low) & (values < MAX_TOKENS_EXCLUSIVE) & (values == np.floor(values))))


def _seconds_ok(values: np.ndarray) -> bool:
    return bool(np.all(np.abs(values) <= MAX_TIME_SECONDS))  # false for nan and inf


def _add_checked(columns: _Columns, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
    """Append a validated chunk, skipping (and counting) rows with a 0 token count."""
    keep = (prompt != 0) & (output != 0)
    kept = int(np.count_nonzero(keep))
    columns.skipped += len(keep) - kept
    if kept < len(keep):
        arrival, prompt, output = arrival[keep], prompt[keep], output[keep]
    columns.add_chunk(arrival, prompt, output)


class _CsvChunks:
    """The csv path: cells gathered as text CHUNK_ROWS rows at a time, converted column-wise."""

    def __init__(self, path: Path, fmt: TraceFormat, names: list[str], index: tuple[int | None, int, int],
                 capacity: int) -> None:
        self.path, self.fmt, self.names, self.index, self.capacity = path, fmt, names, index, capacity
        self.times: _TimeColumn | None = None
        self.columns: _Columns | None = None
        self.cells: tuple[list[str], list[str], list[str]] = ([], [], [])
        self.lines: list[int] = []

    def add(self, rows: list[list[str]], lines: list[int]) -> None:
        """Convert ``rows`` (at most CHUNK_ROWS, from ``lines``) column-wise into the columns."""
        if not rows:
            return
        ia, ip, io_ = self.index
        if self.times is None:
            self.times = _TimeColumn(rows[0][ia] if ia is not None else 0.0)
            self.columns = _Columns(self.capacity, self.times.dtype)
        assert self.columns is not None
        self.cells = (list(map(itemgetter(ia), rows)) if ia is not None else [],
                      list(map(itemgetter(ip), rows)), list(map(itemgetter(io_), rows)))
        self.lines = lines
        times, prompts, outputs = self.cells
        zero_ok = self.fmt.zero_skips
        try:
            if self.index[0] is None:
                arrival = np.zeros(len(prompts))
            elif self.times.datetime:
                arrival = np.fromiter(map(_datetime_or_raise, times), dtype=np.int64, count=len(times))
            else:
                arrival = np.fromiter(map(float, times), dtype=np.float64, count=len(times))
            prompt = np.fromiter(map(float, prompts), dtype=np.float64, count=len(prompts))
            output = np.fromiter(map(float, outputs), dtype=np.float64, count=len(outputs))
            good = (_counts_ok(prompt, zero_ok) and _counts_ok(output, zero_ok)
                    and (self.times.datetime or _seconds_ok(arrival)))
        except (ValueError, OverflowError):
            good = False
        if not good:
            self.locate()
        _add_checked(self.columns, arrival, prompt, output)

    def locate(self) -> None:
        """Check the chunk cell by cell and raise the InputError for the first bad one."""
        assert self.times is not None
        ia, ip, io_ = self.index
        checks = ((0, ia, self.times.text), (1, ip, self._count), (2, io_, self._count))
        for k, line in enumerate(self.lines):
            for slot, column, check in checks:
                if column is None:
                    continue
                value = self.cells[slot][k]
                try:
                    check(value)
                except _BadCell as bad:
                    raise InputError(f"{self.path}:{line}: {self.names[column]} {value!r} {bad}") from None
        raise InputError(f"{self.path}: lines {self.lines[0]}-{self.lines[-1]} hold a value that cannot be read")

    def _count(self, text: str) -> int:
        return _count_text(text, self.fmt.zero_skips)


def _datetime_or_raise(text: str) -> int:
    ns = datetime_ns(text)
    if ns is None:
        raise ValueError(text)
    return ns


def _read_csv_python(path: Path, capacity: int) -> Trace:
    rows = _csv_rows(path)
    header = next(rows, None)
    if header is None:
        raise InputError(f"{path}: the file is empty (no header line)")
    names = [name.strip() for name in header[1]]
    fmt, ia, ip, io_ = _detect(path, names)
    chunks = _CsvChunks(path, fmt, names, (ia, ip, io_), capacity)
    width = len(names)
    batch: list[list[str]] = []
    lines: list[int] = []
    # Row lists hold no cycles; the cyclic collector rescanning a chunk of them cost ~17% of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for line, row in rows:
            if len(row) != width:
                raise InputError(f"{path}:{line}: {len(row)} cells, but the header names {width} columns")
            batch.append(row)
            lines.append(line)
            if len(batch) >= CHUNK_ROWS:
                chunks.add(batch, lines)
                batch, lines = [], []
        chunks.add(batch, lines)
    finally:
        if collecting:
            gc.enable()
    if chunks.columns is None:
        raise InputError(f"{path}: the trace has no requests (a header and no rows)")
    notes = [] if ia is not None else [_untimed_note(path, fmt)]
    return _finish(path, fmt, chunks.columns, ia is not None, notes)


def _read_csv_arrow(path: Path, capacity: int) -> Trace | None:
    """The columnar reader; None when pyarrow is missing or the file has anything the csv path must report."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.csv as pacsv  # type: ignore[import-untyped]
    except ImportError:
        return None
    rows = _csv_rows(path)
    header = next(rows, None)
    first = next(rows, None)
    rows.close()
    if header is None or first is None:
        return None
    raw = header[1]
    names = [name.strip() for name in raw]
    fmt, ia, ip, io_ = _detect(path, names)
    if len(set(raw)) != len(raw) or ia is None or len(first[1]) != len(raw):
        return None
    times = _TimeColumn(first[1][ia])
    if times.datetime:
        zone = _ISO.fullmatch(first[1][ia].strip())
        time_type = pa.timestamp("ns", "UTC") if zone is not None and zone.group(8) else pa.timestamp("ns")
    else:
        time_type = pa.float64()
    selected = [raw[ia], raw[ip], raw[io_]]
    convert = pacsv.ConvertOptions(
        column_types={selected[0]: time_type, selected[1]: pa.float64(), selected[2]: pa.float64()},
        include_columns=selected,
    )
    columns = _Columns(capacity, times.dtype)
    try:
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=ARROW_BLOCK_BYTES), convert_options=convert)
        for batch in reader:
            arrays = [batch.column(i) for i in range(3)]
            if any(a.null_count for a in arrays):
                return None
            if times.datetime:
                arrival = arrays[0].to_numpy(zero_copy_only=False).view(np.int64)
            else:
                arrival = arrays[0].to_numpy()
                if not _seconds_ok(arrival):
                    return None
            prompt, output = arrays[1].to_numpy(), arrays[2].to_numpy()
            if not (_counts_ok(prompt, fmt.zero_skips) and _counts_ok(output, fmt.zero_skips)):
                return None
            _add_checked(columns, arrival, prompt, output)
    except (pa.ArrowException, OSError, ValueError):
        return None
    if not columns.rows and not columns.skipped:
        return None
    return _finish(path, fmt, columns, True, [])


# -- JSON -------------------------------------------------------------------------------------------------


def _read_records(path: Path, records: Iterable[tuple[str, Any]], capacity: int) -> Trace:
    """Rows from JSON objects: ``(location, object)`` pairs, location like ``t.jsonl:3``."""
    fmt: TraceFormat | None = None
    keys: tuple[str | None, str, str] = ("", "", "")
    times: _TimeColumn | None = None
    columns: _Columns | None = None
    for where, record in records:
        if not isinstance(record, dict):
            raise InputError(f"{where}: each row must be a JSON object")
        if fmt is None:
            names = list(record)
            fmt, ia, ip, io_ = _detect(path, names)
            keys = (names[ia] if ia is not None else None, names[ip], names[io_])
            times = _TimeColumn(record[keys[0]] if keys[0] is not None else 0.0)
            columns = _Columns(capacity, times.dtype)
        assert times is not None and columns is not None
        for key in keys:
            if key is not None and key not in record:
                raise InputError(f"{where}: no {key!r} key (the first row has it)")
        cell = 0
        try:
            arrival = times.value(record[keys[0]]) if keys[0] is not None else 0.0
            cell = 1
            prompt = _count_value(record[keys[1]], fmt.zero_skips)
            cell = 2
            output = _count_value(record[keys[2]], fmt.zero_skips)
        except _BadCell as bad:
            raise InputError(f"{where}: {keys[cell]} {record[keys[cell]]!r} {bad}") from None
        if prompt == 0 or output == 0:
            columns.skipped += 1
            continue
        columns.add(arrival, prompt, output)
    if fmt is None or columns is None:
        raise InputError(f"{path}: the trace has no requests")
    timed = keys[0] is not None
    return _finish(path, fmt, columns, timed, [] if timed else [_untimed_note(path, fmt)])


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None


def _read_vllm(path: Path, doc: dict) -> Trace:
    """A vLLM benchmark_serving result: per-request ``input_lens``/``output_lens`` (+ ``start_times``)."""
    lists: dict[str, list] = {}
    for key in ("input_lens", "output_lens", "start_times", "errors"):
        value = doc.get(key)
        if isinstance(value, list):
            lists[key] = value
        elif value is not None or key in ("input_lens", "output_lens"):
            raise InputError(f"{path}: {key} must be a list, one entry per request (vLLM writes it with --save-detailed)")
    n = len(lists["input_lens"])
    for key, values in lists.items():
        if len(values) != n:
            raise InputError(f"{path}: {key} has {len(values)} entries but input_lens has {n}")
    starts, errors = lists.get("start_times"), lists.get("errors")
    times = _TimeColumn(starts[0] if starts else 0.0)
    columns = _Columns(n, times.dtype)
    columns.skipped_what = "requests with an error or 0 tokens"
    for i in range(n):
        key = "errors"
        try:
            failed = bool(errors[i]) if errors is not None else False
            key = "start_times"
            arrival = times.value(starts[i]) if starts is not None else 0.0
            key = "input_lens"
            prompt = _count_value(lists["input_lens"][i], zero_ok=True)
            key = "output_lens"
            output = _count_value(lists["output_lens"][i], zero_ok=True)
        except _BadCell as bad:
            raise InputError(f"{path}: {key}[{i}] {lists[key][i]!r} {bad}") from None
        if failed or prompt == 0 or output == 0:
            columns.skipped += 1
            continue
        columns.add(arrival, prompt, output)
    notes = []
    if starts is None:
        rate, burstiness = doc.get("request_rate"), doc.get("burstiness")
        hint = ""
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate):
            hint = f" (the benchmark ran at request_rate {rate:g}"
            if isinstance(burstiness, (int, float)) and not isinstance(burstiness, bool):
                hint += f", burstiness {burstiness:g}: --qps {rate:g} --arrival gamma --burstiness {burstiness:g}"
            hint += ")"
        notes.append(_untimed_note(path, VLLM_FORMAT, hint))
    return _finish(path, VLLM_FORMAT, columns, starts is not None, notes)


def _read_json(path: Path) -> Trace:
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if isinstance(doc, dict) and "input_lens" in doc:
        return _read_vllm(path, doc)
    if isinstance(doc, list):
        return _read_records(path, ((f"{path}: row {i}", record) for i, record in enumerate(doc)), len(doc))
    raise InputError(f"{path}: a JSON trace is a vLLM benchmark result (with input_lens, output_lens) "
                     "or a list of row objects")


# -- entry point ------------------------------------------------------------------------------------------


def read_trace(path: str | Path, reader: str = "auto") -> Trace:
    """Read a trace file (format by suffix and column names, see the module docstring).

    ``reader`` picks the CSV reader: ``auto`` (pyarrow if installed), ``arrow`` or ``python``.
    InputError naming file, line and column for anything wrong.
    """
    path = Path(path)
    if reader not in ("auto", "arrow", "python"):
        raise InputError(f"trace reader: unknown {reader!r}; allowed: auto, arrow, python")
    kind = path_kind(path, "--trace")
    if kind != "file":
        raise InputError(f"--trace: cannot read {path}: " + ("no such file" if kind is None else f"a {kind}, not a file"))
    lines = check_utf8(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _read_records(path, _jsonl_records(path), lines)
    if suffix == ".json":
        return _read_json(path)
    if reader != "python":
        trace = _read_csv_arrow(path, lines)
        if trace is not None:
            return trace
        if reader == "arrow":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise InputError("trace reader 'arrow' needs pyarrow: pip install pyarrow (or, from the clone, pip install '.[traces]')") from None
    return _read_csv_python(path, lines)
