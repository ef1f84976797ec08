"""Automatic prefix caching: KV blocks of shared prompt prefixes kept and reused across requests.

vLLM's automatic prefix caching (on by default in the V1 engine) and SGLang's RadixAttention
(on by default) keep the KV blocks of prompts after their requests finish and hand them to later
requests whose prompts start with the same tokens, which then skip that part of the prefill.
Modelled as vLLM does it:

- Only whole blocks are shared (vLLM hashes full blocks), and at least one prompt token is
  always computed (the last token's logits are needed): a request whose prompt starts with a
  prefix of ``P`` tokens can reuse ``floor(min(P, prompt - 1) / block_size)`` blocks.
- A prefix becomes reusable once the request that computes it has finished its prefill; a
  request admitted before that computes its own copy (a miss).
- Blocks referenced by running requests are in use once, however many share them. Unreferenced
  cached blocks stay resident but count as free: an allocation that needs them evicts whole
  prefixes, least recently released first (vLLM's free-block queue is LRU).
- A hit skips the prefill of the cached tokens: the request's prefill starts at that offset and
  its attention still reads the cached keys (the step's ``cached`` tokens).

Sessions (:mod:`simulator.engine.sessions`): a finished turn's whole blocks, prompt and output, join its session's
prefix (:meth:`PrefixCache.extend`), so the next turn, whose prompt starts with them, reuses them. An offload
tier (:mod:`simulator.engine.kv_offload`) keeps what is evicted and loads it back on a later miss.

Requests carry a prefix id (-1: none) and its length in tokens (:class:`~simulator.engine.workload.Workload`
``prefix_id``/``prefix_tokens``): from a trace's ``prefix_id``/``prefix_tokens`` columns, or a shared
system prompt drawn for a share of a synthetic workload (:func:`with_shared_prefix`).
"""

from __future__ import annotations

import csv
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.engine.kv_offload import OffloadTier
from simulator.engine.kvcache import BlockAllocator
from simulator.errors import InputError


@dataclass
class PrefixStats:
    """Prefix-cache counters of a run: admissions with a prefix, hits, prefill tokens saved, prefixes evicted."""

    lookups: int = 0
    hits: int = 0
    saved_tokens: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def add(self, other: PrefixStats) -> None:
        self.lookups += other.lookups
        self.hits += other.hits
        self.saved_tokens += other.saved_tokens
        self.evictions += other.evictions


class PrefixCache:
    """Resident prefixes: blocks each holds, running requests referencing it, and the LRU of unreferenced ones."""

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}  # resident prefix id -> blocks
        self.refs: dict[int, int] = {}  # resident prefix id -> running requests sharing it
        self.idle: OrderedDict[int, None] = OrderedDict()  # resident, unreferenced; least recently released first
        self.idle_blocks = 0
        self.stats = PrefixStats()
        self.tier: OffloadTier | None = None  # where evicted prefixes go (simulator.engine.kv_offload), if anywhere

    def referenced(self, prefix: int) -> bool:
        return self.refs.get(prefix, 0) > 0

    def peek(self, prefix: int, blocks: int) -> tuple[int, int]:
        """(blocks a request wanting ``blocks`` of ``prefix`` would reuse, cached blocks it would take back from the free pool)."""
        resident = self.blocks.get(prefix, 0)
        if not resident or not blocks:
            return 0, 0
        return min(resident, blocks), resident if self.refs[prefix] == 0 else 0

    def claim(self, prefix: int, blocks: int, block_size: int) -> tuple[int, int]:
        """An admitted request wants ``blocks`` blocks of ``prefix``: as :meth:`peek`, and the prefix is now referenced.

        A resident copy shorter than wanted is still a hit on its blocks (a prefix of the same
        tokens). A hit on an unreferenced prefix takes it off the evictable list; its blocks are
        in use again (the caller allocates them).
        """
        self.stats.lookups += 1
        hit, retake = self.peek(prefix, blocks)
        if not hit:
            return 0, 0
        if retake:
            del self.idle[prefix]
            self.idle_blocks -= retake
        self.refs[prefix] += 1
        self.stats.hits += 1
        self.stats.saved_tokens += hit * block_size
        return hit, retake

    def register(self, prefix: int, blocks: int) -> bool:
        """A request finished computing ``blocks`` blocks of ``prefix``: they become shared (False if already resident)."""
        if prefix in self.blocks:
            return False
        self.blocks[prefix] = blocks
        self.refs[prefix] = 1
        return True

    def drop(self, prefix: int, alloc: BlockAllocator) -> None:
        """A sharing request left: the last one out leaves the blocks cached but free (evictable)."""
        left = self.refs[prefix] - 1
        self.refs[prefix] = left
        if left == 0:
            blocks = self.blocks[prefix]
            alloc.release(blocks)
            self.idle[prefix] = None
            self.idle_blocks += blocks

    def warm(self, prefixes: dict[int, int], room: int) -> int:
        """Start with ``prefixes`` (id -> blocks) resident and unreferenced, as a server that served them before
        holds them; in id order while they take at most ``room`` blocks. Returns the blocks they hold."""
        for prefix in sorted(prefixes):
            blocks = prefixes[prefix]
            if blocks <= 0 or prefix in self.blocks or self.idle_blocks + blocks > room:
                continue
            self.blocks[prefix] = blocks
            self.refs[prefix] = 0
            self.idle[prefix] = None
            self.idle_blocks += blocks
        return self.idle_blocks

    def evict_to(self, room: int) -> None:
        """Evict unreferenced prefixes, least recently released first, until they take at most ``room`` blocks."""
        while self.idle_blocks > room:
            prefix, _ = self.idle.popitem(last=False)
            blocks = self.blocks.pop(prefix)
            del self.refs[prefix]
            self.idle_blocks -= blocks
            self.stats.evictions += 1
            if self.tier is not None:
                self.tier.store(prefix, blocks)

    def extend(self, prefix: int, shared: int, full: int, own: int) -> int:
        """A request of ``prefix`` finished holding ``full`` whole blocks of its sequence (prompt and output), ``shared``
        of them the cache's and ``own`` its own: its blocks past the resident copy join the cache (a session's next
        turn starts with this whole conversation). Returns how many of its own blocks moved to the cache.

        Only when the request is the prefix's only user (or the prefix is not resident: it then becomes resident,
        referenced once, and the caller drops that reference as for a shared one).
        """
        resident = self.blocks.get(prefix)
        if resident is None:
            moved = min(full, own)
            if moved > 0:
                self.blocks[prefix] = moved
                self.refs[prefix] = 1
            return max(moved, 0)
        if not shared or self.refs[prefix] != 1 or full <= resident:
            return 0
        moved = min(full - resident, own)
        self.blocks[prefix] = resident + moved
        return moved


class PrefixAllocator(BlockAllocator):
    """A block allocator whose free blocks include the cached, unreferenced prefixes (evicted when needed)."""

    __slots__ = ("cache",)

    def __init__(self, total: int, cache: PrefixCache) -> None:
        super().__init__(total)
        self.cache = cache

    def allocate(self, blocks: int) -> None:
        super().allocate(blocks)
        self.cache.evict_to(self.total - self.used)


def reusable_blocks(prompt: np.ndarray, prefix_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Whole blocks of each request's prefix that a hit can reuse: floor(min(prefix, prompt - 1) / block size)."""
    return np.maximum(np.minimum(prefix_tokens, prompt - 1), 0) // block_size


def with_shared_prefix(workload, tokens: int, ratio: float, seed: int = 0):
    """``workload`` with a ``tokens``-long system prompt (prefix id 0) put before the prompts of a ``ratio`` share of its requests.

    The requests that share it are drawn with a generator seeded by ``seed`` (a stream of its own,
    so arrivals and lengths do not move); their prompts grow by ``tokens``.
    """
    if tokens < 1:
        raise InputError(f"--shared-prefix-tokens: must be >= 1 (got {tokens})")
    if not 0 < ratio <= 1:
        raise InputError(f"--shared-prefix-ratio: must be in (0, 1] (got {ratio})")
    n = len(workload)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    shared = rng.random(n) < ratio if ratio < 1 else np.ones(n, dtype=bool)
    prefix_id = np.where(shared, 0, -1).astype(np.int64)
    prefix_tokens = np.where(shared, tokens, 0).astype(np.int64)
    prompts = workload.prompt_tokens + prefix_tokens
    count = int(shared.sum())
    note = f"; a {tokens}-token shared system prompt before {count} of them ({100 * count / max(n, 1):.0f}%)"
    return replace(workload, prompt_tokens=prompts, prefix_id=prefix_id, prefix_tokens=prefix_tokens,
                   description=workload.description + note)


PREFIX_COLUMNS = ("prefixid", "prefixtokens")
"""Our trace format's optional columns (names normalised as the trace reader does: lower case, letters and digits)."""


def _normalised(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def _prefix_rows(path: Path) -> list[tuple[int, Any, Any]] | None:
    """(line, prefix_id cell, prefix_tokens cell) per data row, or None when the file has no prefix columns."""
    suffix = path.suffix.lower()
    with open(path, encoding="utf-8-sig", newline="") as handle:
        if suffix in (".jsonl", ".ndjson", ".json"):
            if suffix == ".json":
                records = json.load(handle)
                if not isinstance(records, list):
                    return None  # a vLLM result: no per-request prefixes
                numbered = list(enumerate(records, start=1))
            else:
                numbered = [(line, json.loads(text)) for line, text in enumerate(handle, start=1) if text.strip()]
            rows = []
            for line, record in numbered:
                keys = {_normalised(key): value for key, value in record.items()} if isinstance(record, dict) else {}
                rows.append((line, keys.get(PREFIX_COLUMNS[0]), keys.get(PREFIX_COLUMNS[1])))
            return rows if any(cells[1] is not None or cells[2] is not None for cells in rows) else None
        reader = csv.reader(handle)
        header = [_normalised(name) for name in next(reader, [])]
        if not all(column in header for column in PREFIX_COLUMNS):
            if any(column in header for column in PREFIX_COLUMNS):
                raise InputError(f"{path}: give both prefix_id and prefix_tokens columns, or neither")
            return None
        id_at, tokens_at = (header.index(column) for column in PREFIX_COLUMNS)

        def cell(row: list[str], index: int) -> str:
            return row[index] if index < len(row) else ""

        return [(line, cell(row, id_at), cell(row, tokens_at))
                for line, row in enumerate(reader, start=2) if any(text.strip() for text in row)]


def _whole(value: Any, path: Path, line: int, column: str, low: int) -> int:
    text = "" if value is None else str(value).strip()
    if text == "":
        return -1 if column == "prefix_id" else 0
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number.is_integer() and low <= number < 2**31):
        raise InputError(f"{path}:{line}: {column} {text!r} is not a whole number >= {low}")
    return int(number)


def with_trace_prefixes(trace):
    """``trace`` with its ``prefix_id``/``prefix_tokens`` columns read, when our format's file has them.

    Both columns or neither; a row without a prefix leaves them empty (or gives -1 and 0). A
    prefix longer than its prompt is an error (the prefix is the start of the prompt).
    """
    if trace.format != "memwall":
        return trace
    path = Path(trace.path)
    rows = _prefix_rows(path)
    if rows is None:
        return trace
    if len(rows) != len(trace):
        raise InputError(f"{path}: {len(rows)} rows with prefix columns for {len(trace)} requests")
    ids = np.array([_whole(cells[1], path, cells[0], "prefix_id", -1) for cells in rows], dtype=np.int64)
    tokens = np.array([_whole(cells[2], path, cells[0], "prefix_tokens", 0) for cells in rows], dtype=np.int64)
    longer = np.flatnonzero(tokens > trace.prompt_tokens)
    if len(longer):
        line = rows[int(longer[0])][0]
        raise InputError(f"{path}:{line}: prefix_tokens {int(tokens[longer[0]])} exceeds the prompt's "
                         f"{int(trace.prompt_tokens[longer[0]])} tokens (the prefix is the start of the prompt)")
    return replace(trace, prefix_id=ids, prefix_tokens=tokens)
