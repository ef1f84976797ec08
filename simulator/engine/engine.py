"""The discrete-event serving loop (simpy): arrivals, scheduling, KV blocks, and the cost of each iteration.

The engine only schedules; the time of every iteration is ``system.step_totals(step).seconds`` for a
:class:`~simulator.model.step.Step` built from running totals of the sequences in it, so building
a step costs O(sequences that changed), not O(sequences).

Token accounting per request (prompt ``p``, output ``o``): the prefill processes ``p``
tokens and emits output token 1; decode tick k (k = 1 .. o - 1) feeds token k back,
attends ``p + k`` keys (itself included) and emits token k + 1. A sequence holding ``t``
cached tokens holds ceil(t / block_size) KV blocks. A preempted request is recomputed: its
prompt and the tokens it has emitted are prefilled again, which emits its next token.

Decode *stretches*: while no sequence joins or leaves, every decode iteration has the same
batch and a context sum that grows by the batch size per iteration, so the engine plans up
to :data:`STRETCH_MAX` iterations at once, stopping at the next completion, the first
iteration that would need a block that is not free, and (when a new arrival could be
admitted) the first iteration boundary after the next arrival. A stretch of at most
:data:`SCALAR_TICKS` ticks is planned, costed and replayed in plain Python, each tick costed
by a function traced from the cost model (:mod:`simulator.cost.tracing`); a longer one is
costed in one vectorised cost-model call. Both give the same run bit for bit, and the
per-iteration log and latencies are those of stepping one iteration at a time.

Streaming (``records``, :mod:`simulator.engine.records`): only a window of requests is held;
the records of finished ones go to files.

Why this module is over 600 lines: :class:`Engine` is one simpy process whose admission,
preemption, prefix-cache and stretch methods all read and write the same per-request arrays and
block allocator in the same iteration; kept in one class, the order of those writes is visible in
one place. What does not touch that state lives beside it: the iteration's step and cost fields
(:mod:`simulator.engine.iteration`), the result types (:mod:`simulator.engine.engine_result`), the
scheduler's policies (:mod:`simulator.engine.scheduler`) and the caches (``kvcache``, ``prefix_cache``).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generator

import numpy as np
import simpy

from simulator.cost.client_path import engine_arrivals
from simulator.cost.system import System
from simulator.cost.tracing import trace_scalar
from simulator.engine.engine_result import EngineResult, Totals
from simulator.engine.iteration import _as_step, _decode_step, _in_order, _prefix_sums, iteration_fields, reject_reasons
from simulator.engine.kv_offload import OffloadTier
from simulator.engine.kvcache import BlockAllocator, blocks_for
from simulator.engine.metrics import (
    DECODING,
    DONE,
    PREFILLING,
    REJECTED,
    WAITING,
    iteration_log,
    itl_samples,
)
from simulator.engine.prefix_cache import PrefixAllocator, PrefixCache, reusable_blocks
from simulator.engine.records import RECORD_FIELDS, RecordFiles
from simulator.engine.scheduler import (
    Chunk,
    SchedulerConfig,
    plan_chunked,
    plan_continuous,
    plan_prefill_first,
    plan_static,
)
from simulator.engine.sessions import SessionWorkload, is_sessions
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.model.step import Step

if TYPE_CHECKING:
    from simulator.cost.pipeline import PipelineSystem

PER_REQUEST: dict[str, type] = {
    "arrival": np.float64, "prompt": np.int64, "output": np.int64, "prefix_id": np.int64, "prefix_blocks": np.int64,
    "shared": np.int64, "status": np.int8, "reject_reason": np.int8, "first_scheduled": np.float64,
    "first_token": np.float64, "finish": np.float64, "last_token": np.float64, "join_time": np.float64,
    "preemptions": np.int32, "queued_mark": np.int64, "waited_for_kv": np.bool_, "emitted": np.int64,
    "target": np.int64, "prefilled": np.int64, "held": np.int64, "base_cached": np.int64, "base_clock": np.int64,
    "finish_clock": np.int64, "admit_serial": np.int64, "cached_tokens": np.int64,
}
"""The engine's per-request state (name: dtype of the result array), kept as Python lists during a run: an
element of a list is read and written several times faster than one of a numpy array."""

STREAM_WINDOW = 1 << 16
"""Requests taken in at a time when streaming records to disk (see :mod:`simulator.engine.records`)."""

STRETCH_MAX = 4096
"""Most decode iterations costed in one vectorised call (bounds the arrays' size)."""

COST_CACHE_MAX = 1 << 16
"""Scalar steps remembered (identical steps recur in closed batches and fixed-length workloads)."""

SCALAR_TICKS = 64
"""A decode stretch planned at most this many ticks long is planned, costed and replayed in plain Python
(numpy's per-call overhead dominates arrays this short); a longer one takes the vectorised path. Both
give the same run bit for bit (tests/test_engine.py)."""







@dataclass(frozen=True)
class Stretch:
    """Planned decode ticks: ``steps`` runnable; per tick j (arrays over the horizon): decoders,
    keys attended in total, new blocks, blocks freed by completions so far; the tick index at
    which each finishing decoder is gone (sorted)."""

    steps: int
    batch: np.ndarray
    context: np.ndarray
    needs: np.ndarray | None
    freed_by: np.ndarray
    leave_at: np.ndarray


@dataclass(frozen=True)
class InFlight:
    """A decode stretch under way: tick end times, blocks in use during each tick, and the tick
    index at which each finishing decoder is gone (see :class:`Stretch`); numpy arrays or lists."""

    ends: np.ndarray | list[float]
    used: np.ndarray | list[int]
    leave_at: np.ndarray | list[int]










CHARGED_TOTALS = 6
"""The leading StepTotals fields the engine charges (seconds, FLOPs, bytes, compute-bound, memory-bound and
communication seconds); the launch wait is in ``seconds``, and the run's host share is what the others leave."""












_TICK_COSTS: OrderedDict[int, tuple[object, dict[int, Callable[[float], tuple[float, ...]] | None]]] = OrderedDict()


TICK_COST_SYSTEMS = 8
"""Systems whose traced decode-tick costs are kept (the most recently used)."""


def _tick_costs_of(system: object) -> dict[int, Callable[[float], tuple[float, ...]] | None]:
    """The traced decode-tick costs of ``system`` by batch (the entry holds the system, so its id stays its own)."""
    entry = _TICK_COSTS.get(id(system))
    if entry is None or entry[0] is not system:
        entry = _TICK_COSTS[id(system)] = (system, {})
        while len(_TICK_COSTS) > TICK_COST_SYSTEMS:
            _TICK_COSTS.popitem(last=False)
    _TICK_COSTS.move_to_end(id(system))
    return entry[1]


class Engine:
    """State of one serving run; :meth:`run` drives it with simpy and returns an :class:`EngineResult`."""

    # Per-request state (PER_REQUEST), indexed by local request id (set by __init__ from _new_requests).
    arrival: list[float]
    prompt: list[int]
    output: list[int]
    prefix_id: list[int]
    prefix_blocks: list[int]
    shared: list[int]
    status: list[int]
    reject_reason: list[int]
    first_scheduled: list[float]
    first_token: list[float]
    finish: list[float]
    last_token: list[float]
    join_time: list[float]
    preemptions: list[int]
    queued_mark: list[int]
    waited_for_kv: list[bool]
    emitted: list[int]
    target: list[int]
    prefilled: list[int]
    held: list[int]
    base_cached: list[int]
    base_clock: list[int]
    finish_clock: list[int]
    admit_serial: list[int]
    cached_tokens: list[int]

    def __init__(
        self,
        system: "System | PipelineSystem",
        workload: Workload,
        config: SchedulerConfig,
        kv_blocks: int,
        progress: Callable[[int, int], None] | None = None,
        records: Path | str | None = None,
        window: int = STREAM_WINDOW,
        offload: Callable[[], OffloadTier | None] | None = None,
    ) -> None:
        n = len(workload)
        self.system, self.workload, self.config = system, workload, config
        self.total = n  # requests in the workload
        self.bs = config.block_size
        self.incremental = config.incremental_blocks
        self.fit_admission = config.fit_admission
        self.chunked = config.prefills_in_pieces
        self.alloc = BlockAllocator(kv_blocks)
        self.progress = progress
        # Prefix caching (simulator.engine.prefix_cache): the prefix each request starts with (-1: none), its
        # reusable whole blocks, and the blocks of it the request shares with the cache (0: none, or not yet).
        self.prefixes: PrefixCache | None = None
        if config.prefix_caching:
            self.prefixes = PrefixCache()
            self.alloc = PrefixAllocator(kv_blocks, self.prefixes)
            # An offload tier (simulator.engine.kv_offload) keeps evicted prefixes; a load's seconds are due at the
            # next iteration, overlapped with its compute.
            self.prefixes.tier = None if offload is None else offload()
        self.load_due = 0.0
        # Sessions (simulator.engine.sessions): a later turn is sent when the one it follows finishes; a finished
        # turn's whole blocks join its session's cached prefix.
        self.grow = self.prefixes is not None and is_sessions(workload)
        self.follower: list[int] | None = None
        # A finish that sends a request (a closed loop's client, a session's next turn) ends a decode stretch.
        self.sends_on_finish = workload.concurrency is not None or is_sessions(workload)
        self.released: list[tuple[float, int]] = []  # (engine arrival, rid) of sent followers, earliest first
        if is_sessions(workload):
            if records is not None:
                raise InputError("--records: a session workload is held in memory; run it without --records")
            assert isinstance(workload, SessionWorkload) and workload.think_seconds is not None
            self.follower = workload.followers().tolist()
            self.think = workload.think_seconds.tolist()
            # Requests are ordered those sent at their arrival first, then the followers (sessions.turn_order): the
            # arrival walk stops before the followers, which come in through ``released`` as they are sent.
            self.roots = int(np.count_nonzero(np.asarray(workload.previous) < 0))
        # Whole-workload columns (the engine's own request state is built from them, window by window when streaming).
        self._prompts = workload.prompt_tokens.astype(np.int64, copy=False)
        self._outputs = workload.output_tokens.astype(np.int64, copy=False)
        self._reasons = self._reject_reasons(kv_blocks)
        self._arrivals = self._client_arrivals(workload, records)
        if config.prefix_cache_warm:
            self._warm_prefix_cache(kv_blocks)
        # A request waited for KV if the queue head was refused for lack of free blocks while it was queued:
        # kv_refusals counts refusals, queued_mark holds its value when the request (re)joined the queue.
        self.kv_refusals = 0
        # Streaming (simulator.engine.records): only a window of requests is held; local request k is request
        # offset + k of the workload.
        self.records = None if records is None else RecordFiles(Path(records) / "requests")
        self.window = window
        self.offset = 0
        self.n = n if self.records is None else min(n, window)  # requests held
        for name, values in self._new_requests(0, self.n).items():
            setattr(self, name, values)

        self.clock = 0  # decode ticks so far: every decoding sequence advances one token per tick
        self.decoding = 0
        self.decode_cached = 0  # cached tokens summed over decoding sequences
        self.phase_counts = [0] * self.bs  # decoders by (cached - clock) mod block size
        self.finish_heap: list[tuple[int, int, int]] = []  # (finish clock, rid, admission serial)
        self.admission_order: list[tuple[int, int]] = []  # (serial, rid), newest last; stale entries skipped
        self.serial = 0
        self.waiting: deque[int] = deque()
        self.partials: list[int] = []  # chunked: admitted, prompt not fully prefilled (FIFO)
        self.running = 0
        self.max_running = 0
        self.next_arrival = 0
        self.last_tick = 0.0
        self.pending_joins: dict[float, int] = {}  # decoders that have not ticked yet, by the time of their last token
        self.done = 0
        self.last_decode_seconds = 0.0  # duration of the latest decode tick (sizes the next stretch)
        self.in_flight: InFlight | None = None  # the decode stretch under way, if any

        self.log = iteration_log()
        self.itl = itl_samples()
        if records is not None:
            self.log.spill_to(Path(records) / "iterations")
            self.itl.spill_to(Path(records) / "itl")
        self.totals = Totals()
        self.cost_cache: dict[tuple, tuple] = {}
        # A decode tick's totals as a function of the keys it attends, per batch (simulator.cost.tracing; None:
        # not traceable), shared by every engine costing the same System object (replicas, repeated runs).
        self.tick_costs = _tick_costs_of(system)
        self.first_prefill_step: Step | None = None
        # First and last decode steps, decode-only ones preferred over mixed ones (index 0: decode-only); a
        # decode-only step is kept as (batch, keys attended) and built once the run is over.
        self.first_decode: list[tuple | None] = [None, None]
        self.last_decode: list[tuple | None] = [None, None]

    def _client_arrivals(self, workload: Workload, records: Path | str | None) -> np.ndarray:
        """When each request reaches this engine (seconds): its send time plus its client path
        (simulator.cost.client_path), in the order sent. A closed loop (simulator.engine.closed_loop) knows only
        its first ``concurrency`` sends, at t = 0; the others are sent as requests finish (:meth:`_send_next`)."""
        self.response = workload.response_seconds  # engine token -> client's chunk, added to every token time
        self.concurrency = workload.concurrency
        n = len(workload)
        pre = np.zeros(n) if workload.client_seconds is None else workload.client_seconds.astype(float)
        if self.concurrency is None:
            if is_sessions(workload):
                self._pre = pre.tolist()
                self.sent = np.where(np.isfinite(workload.arrival_seconds), workload.arrival_seconds, np.nan).tolist()
            return workload.arrival_seconds if workload.client_seconds is None else engine_arrivals(workload.arrival_seconds, pre)
        if records is not None:
            raise InputError("--records: a closed loop (--max-concurrency) is held in memory; run it without --records")
        first = min(self.concurrency, n)
        arrivals = np.full(n, np.inf)  # not sent yet
        arrivals[:first] = engine_arrivals(np.zeros(first), pre[:first])
        self._pre = pre.tolist()
        self.sent = [0.0] * first + [np.nan] * (n - first)
        self.next_send = first
        self.handed = float(arrivals[first - 1]) if first else 0.0  # the latest request handed to the engine
        return arrivals

    def _send_next(self, when: float) -> None:
        """Closed loop: a client got its answer at ``when`` and sends the next request at once; it reaches the
        engine after its client path, never before the request sent ahead of it."""
        k = self.next_send
        if k >= self.n:
            return
        self.next_send = k + 1
        self.sent[k] = when
        self.handed = max(when + self._pre[k], self.handed)
        self.arrival[k] = self.handed

    def _release(self, rid: int, when: float) -> None:
        """Sessions: the client got ``rid``'s answer (or its error) at ``when``; the turn after it is sent a think time
        later and reaches the engine after its client path."""
        if self.follower is None:
            return
        follower = self.follower[rid]
        if follower < 0:
            return
        sent = when + self.think[follower]
        self.sent[follower] = sent
        self.arrival[follower] = sent + self._pre[follower]
        heapq.heappush(self.released, (self.arrival[follower], follower))

    def _warm_prefix_cache(self, kv_blocks: int) -> None:
        """Every prefix of the workload starts resident and unreferenced (the server served these prompts before)."""
        workload = self.workload
        if self.prefixes is None or workload.prefix_id is None or workload.prefix_tokens is None:
            return  # no cache, or no request with a prefix
        ids = workload.prefix_id.astype(np.int64)
        blocks = reusable_blocks(self._prompts, workload.prefix_tokens.astype(np.int64), self.bs)
        largest: dict[int, int] = {}
        for prefix, count in zip(ids[ids >= 0].tolist(), blocks[ids >= 0].tolist(), strict=True):
            if count > largest.get(prefix, 0):
                largest[prefix] = count
        self.prefixes.warm(largest, kv_blocks)

    def _new_requests(self, lo: int, hi: int) -> dict[str, list]:
        """The initial per-request state (:data:`PER_REQUEST`) of requests ``lo`` to ``hi`` - 1 of the workload."""
        count = hi - lo
        workload = self.workload
        prompt = self._prompts[lo:hi]
        state: dict[str, list] = {
            "arrival": self._arrivals[lo:hi].tolist(), "prompt": prompt.tolist(),
            "output": self._outputs[lo:hi].tolist(), "reject_reason": self._reasons[lo:hi].tolist(),
        }
        prefix_id, prefix_blocks = [-1] * count, [0] * count
        if self.prefixes is not None and workload.prefix_id is not None and workload.prefix_tokens is not None:
            ids = workload.prefix_id[lo:hi].astype(np.int64)
            blocks = reusable_blocks(prompt, workload.prefix_tokens[lo:hi].astype(np.int64), self.bs)
            prefix_id, prefix_blocks = ids.tolist(), np.where(ids < 0, 0, blocks).tolist()
        state["prefix_id"], state["prefix_blocks"] = prefix_id, prefix_blocks
        for name, dtype in PER_REQUEST.items():
            if name not in state:
                nan = name in ("first_scheduled", "first_token", "finish", "last_token", "join_time")
                state[name] = [np.nan if nan else np.zeros((), dtype=dtype).item()] * count
        return state

    # -- streaming (simulator.engine.records) ------------------------------------------------------------------

    def _load_more(self) -> bool:
        """Streaming: write and drop the finished requests at the start of the window, then take in the next
        requests of the workload. False when every request has been taken in (or not streaming)."""
        if self.records is None or self.offset + self.n >= self.total:
            return False
        self._drop_finished()
        lo = self.offset + self.n
        hi = min(self.total, lo + self.window)
        for name, values in self._new_requests(lo, hi).items():
            getattr(self, name).extend(values)
        self.n += hi - lo
        return True

    def _drop_finished(self) -> None:
        """Write the records of the finished requests before the first unfinished one, drop them, renumber."""
        assert self.records is not None
        status, low = self.status, 0
        while low < self.next_arrival and status[low] in (DONE, REJECTED):
            low += 1
        if not low:
            return
        self.records.write({name: getattr(self, name)[:low] for name in RECORD_FIELDS})
        for name in PER_REQUEST:
            del getattr(self, name)[:low]
        self.offset += low
        self.n -= low
        self.next_arrival -= low
        # Requests still referred to are unfinished, so at or after ``low``; stale entries of finished ones go.
        self.waiting = deque(rid - low for rid in self.waiting)
        self.partials = [rid - low for rid in self.partials]
        self.finish_heap = [(clock, rid - low, serial) for clock, rid, serial in self.finish_heap if rid >= low]
        heapq.heapify(self.finish_heap)
        self.admission_order = [(serial, rid - low) for serial, rid in self.admission_order if rid >= low]
        self.log.spill()
        self.itl.spill()

    def _write_all(self) -> None:
        """Streaming, at the end of the run: write every request's record."""
        assert self.records is not None
        self.records.write({name: getattr(self, name) for name in RECORD_FIELDS})
        for name in PER_REQUEST:
            del getattr(self, name)[:]
        self.offset += self.n
        self.next_arrival -= self.n
        self.n = 0
        self.log.spill()
        self.itl.spill()

    # -- admission -----------------------------------------------------------------------------------------

    def _reject_reasons(self, kv_blocks: int) -> np.ndarray:
        """Reason code per request (0: admissible), see metrics.REJECT_REASONS."""
        return reject_reasons(self._prompts, self._outputs, self.config, self.system.model.max_context, kv_blocks)

    def _arrive(self, now: float) -> None:
        if self.next_arrival >= self.n and self._load_more():
            self._arrive(now)
            return
        n, arrival = (self.n if self.follower is None else self.roots), self.arrival
        while self.next_arrival < n and arrival[self.next_arrival] <= now:
            rid = self.next_arrival
            self.next_arrival += 1
            self._enqueue(rid, now)
        released = self.released
        while released and released[0][0] <= now:
            self._enqueue(heapq.heappop(released)[1], now)
        if self.next_arrival >= n and self._load_more():
            self._arrive(now)

    def _enqueue(self, rid: int, now: float) -> None:
        """``rid`` has arrived: it waits for admission, or is rejected."""
        if self.reject_reason[rid]:
            self.status[rid] = REJECTED
            self.done += 1
            if self.concurrency is not None:
                self._send_next(now + self.response)  # the client gets its error and sends the next request
            self._release(rid, now + self.response)
            return
        self.status[rid] = WAITING
        self.target[rid] = self.prompt[rid]
        self.queued_mark[rid] = self.kv_refusals
        self.waiting.append(rid)

    def admission_blocks(self, rid: int) -> int:
        """Free blocks ``rid`` needs to start (less a cached prefix it shares, plus one it takes back from the free pool)."""
        if self.incremental:
            blocks = blocks_for(self.target[rid], self.bs)
        else:
            blocks = blocks_for(self.prompt[rid] + self.output[rid] - 1, self.bs)
        if self.prefixes is not None and self.prefix_blocks[rid]:
            hit, retake = self.prefixes.peek(self.prefix_id[rid], self.prefix_blocks[rid])
            blocks += retake - hit
        return blocks

    def admissible(self, rid: int) -> bool:
        """Would ``rid``'s blocks fit now (and, under ``fit`` admission, every output still to come)? (A refusal is
        counted: see ``waited_for_kv``.)"""
        if self.admission_blocks(rid) <= self.alloc.free and (not self.fit_admission or self._fits_through_completion(rid)):
            return True
        self.kv_refusals += 1
        return False

    def _fits_through_completion(self, rid: int) -> bool:
        """SGLang's test for ``fit`` admission (simulator.engine.scheduler), in tokens as SGLang counts them: a
        request holds its prompt and what it has emitted, and has ``output - emitted`` tokens left.

        SGLang refuses at zero headroom; here zero headroom admits, so a request that fills the cache alone
        (which ``reject_reasons`` lets through) still runs.
        """
        clock, status, serials = self.clock, self.status, self.admit_serial
        left: list[int] = []
        held: list[int] = []
        used = 0
        for serial, r in self.admission_order:
            if serials[r] != serial:
                continue  # stale: finished or preempted since
            if status[r] == DECODING:
                cached = self._cached(r)
                left.append(self.finish_clock[r] - clock)
                held.append(cached + 1)
                used += cached
            elif status[r] == PREFILLING:
                left.append(self.output[r] - self.emitted[r])
                held.append(self.prompt[r] + self.emitted[r])
                used += self.target[r]
        left.append(self.output[rid] - self.emitted[rid])
        held.append(self.target[rid])
        free = self.alloc.total * self.bs - used - self.target[rid]
        pairs = sorted((n, h) for n, h in zip(left, held) if n > 0)
        freed = 0
        for i, (n, h) in enumerate(pairs):
            steps = pairs[i + 1][0] if i + 1 < len(pairs) else n
            if free + freed - steps * (len(pairs) - i) < 0:
                return False
            freed += h
        return True

    def _head_admissible(self) -> bool:
        return bool(self.waiting) and self.running < self.config.max_num_seqs and self.admissible(self.waiting[0])

    def admit(self, rid: int) -> int:
        """Take ``rid`` (the head of the queue) into the running set; its blocks are allocated."""
        assert self.waiting[0] == rid
        self.waiting.popleft()
        blocks = self.admission_blocks(rid)
        hit = retake = loaded = 0
        if self.prefixes is not None and self.prefix_blocks[rid]:
            # Claimed before allocating, so the allocation cannot evict the prefix it is about to share.
            hit, retake = self.prefixes.claim(self.prefix_id[rid], self.prefix_blocks[rid], self.bs)
        self.alloc.allocate(blocks)
        self.held[rid] = blocks - retake  # the request's own blocks (the prefix's belong to the cache)
        tier = None if self.prefixes is None else self.prefixes.tier
        if not hit and tier is not None and self.prefix_blocks[rid]:
            # Not on the GPU but in the offload tier: loaded into blocks just allocated, which become the cache's.
            loaded, seconds = tier.load(self.prefix_id[rid], self.prefix_blocks[rid])
            if loaded and tier is not None and self.prefixes is not None and self.prefixes.register(self.prefix_id[rid], loaded):
                self.held[rid] -= loaded
                self.load_due += seconds
                hit = loaded
            else:
                loaded = 0
        self.shared[rid] = hit
        self.cached_tokens[rid] = hit * self.bs
        if self.kv_refusals > self.queued_mark[rid]:
            self.waited_for_kv[rid] = True
        self.status[rid] = PREFILLING
        self.prefilled[rid] = hit * self.bs  # a hit's prefill starts after the cached tokens
        self.running += 1
        if self.running > self.max_running:
            self.max_running = self.running
        self.serial += 1
        self.admit_serial[rid] = self.serial
        order = self.admission_order
        order.append((self.serial, rid))
        if len(order) > 4 * self.running + 1024:
            # Drop entries of requests that finished or were preempted since (keeps the list O(running)).
            self.admission_order = [(serial, r) for serial, r in order
                                    if self.admit_serial[r] == serial and self.status[r] in (PREFILLING, DECODING)]
        if self.first_scheduled[rid] != self.first_scheduled[rid]:  # NaN: first time scheduled
            self.first_scheduled[rid] = self._now
        if self.chunked:
            self.partials.append(rid)
        return rid

    def partial_prefills(self) -> list[int]:
        return list(self.partials)

    # -- sequence life -------------------------------------------------------------------------------------

    def _prefill_done(self, rid: int, now: float) -> None:
        """``rid``'s prompt is all cached: it emits a token, then decodes or finishes."""
        if self.prefixes is not None and self.prefix_blocks[rid] and not self.shared[rid]:
            blocks = self.prefix_blocks[rid]
            if self.prefixes.register(self.prefix_id[rid], blocks):  # its prefix blocks now belong to the cache
                self.shared[rid] = blocks
                self.held[rid] -= blocks
        cached = self.target[rid]
        emitted = self.emitted[rid] + 1
        self.emitted[rid] = emitted
        if emitted == 1:
            self.first_token[rid] = now + self.response  # as the client sees it (simulator.cost.client_path)
        else:
            self.itl.add(now - self.last_token[rid], 1)
        self.last_token[rid] = now
        if emitted >= self.output[rid]:
            self._finish(rid, now, self.held[rid])
            return
        self.status[rid] = DECODING
        self.base_cached[rid] = cached
        self.base_clock[rid] = self.clock
        self.phase_counts[(cached - self.clock) % self.bs] += 1
        self.decoding += 1
        self.decode_cached += cached
        finish_clock = self.clock + self.output[rid] - emitted
        self.finish_clock[rid] = finish_clock
        heapq.heappush(self.finish_heap, (finish_clock, rid, self.admit_serial[rid]))
        self.join_time[rid] = now
        self.pending_joins[now] = self.pending_joins.get(now, 0) + 1

    def _drop_prefix(self, rid: int) -> None:
        if self.shared[rid]:
            assert self.prefixes is not None
            self.prefixes.drop(self.prefix_id[rid], self.alloc)
            self.shared[rid] = 0

    def _cached(self, rid: int) -> int:
        return self.base_cached[rid] + self.clock - self.base_clock[rid]

    def _leave_decode(self, rid: int) -> int:
        """Remove a decoder from the running sums; returns its cached tokens."""
        cached = self._cached(rid)
        self.decoding -= 1
        self.decode_cached -= cached
        self.phase_counts[(self.base_cached[rid] - self.base_clock[rid]) % self.bs] -= 1
        return cached

    def _finish(self, rid: int, now: float, blocks: int) -> None:
        """``rid`` is done: its own ``blocks`` are freed (a shared prefix's only when its last user leaves)."""
        self.status[rid] = DONE
        self.finish[rid] = now + self.response  # as the client sees it (simulator.cost.client_path)
        if self.concurrency is not None:
            self._send_next(now + self.response)
        self._release(rid, now + self.response)
        if self.grow and self.prefix_id[rid] >= 0:
            assert self.prefixes is not None
            # The KV of prompt + output - 1 tokens was computed (the last token is not fed back): its whole blocks
            # stay cached under the session's prefix for the next turn.
            full = (self.prompt[rid] + self.output[rid] - 1) // self.bs
            moved = self.prefixes.extend(self.prefix_id[rid], self.shared[rid], full, blocks)
            if moved and not self.shared[rid]:
                self.shared[rid] = moved  # newly resident, referenced by this request: dropped just below
            blocks -= moved
        self.alloc.release(blocks)
        self._drop_prefix(rid)
        self.running -= 1
        self.done += 1

    def _finish_decoders(self, now: float) -> None:
        heap, clock, status, serials = self.finish_heap, self.clock, self.status, self.admit_serial
        while heap and heap[0][0] <= clock:
            _, rid, serial = heapq.heappop(heap)
            if status[rid] != DECODING or serials[rid] != serial:
                continue  # stale: the sequence was preempted after this entry was pushed
            cached = self._leave_decode(rid)
            blocks = blocks_for(cached, self.bs) - self.shared[rid] if self.incremental else self.held[rid]
            self.emitted[rid] = self.output[rid]
            self.last_token[rid] = now
            self._finish(rid, now, blocks)

    def _clean_heap(self) -> None:
        heap = self.finish_heap
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)

    def _current(self, entry: tuple[int, int, int]) -> bool:
        """Is this finish-heap entry the live one of a decoding sequence (not left by a preemption)?"""
        _, rid, serial = entry
        return self.status[rid] == DECODING and self.admit_serial[rid] == serial

    def _horizon(self, limit: int, across_completions: bool) -> tuple[int, list[tuple[int, int]]]:
        """Ticks a stretch may run and the (finish tick, rid) of the decoders finishing within them.

        Without ``across_completions`` a stretch stops at the first completion (a waiting request
        might take the freed slot); with it, it runs to ``limit`` or until the last decoder finishes.
        """
        clock = self.clock
        first = self.finish_heap[0][0] - clock
        if across_completions:
            leaving = self._finishing_by(clock + limit)
            if len(leaving) == self.decoding:
                return leaving[-1][0] - clock, leaving  # everyone finishes inside the horizon
            return limit, leaving
        horizon = min(first, limit)
        return horizon, (self._finishing_by(first + clock) if first <= horizon else [])

    def _finishing_by(self, last_clock: int) -> list[tuple[int, int]]:
        """(finish clock, rid) of the live decoders finishing by ``last_clock``, sorted.

        Walks only the part of the heap at or below ``last_clock`` (a heap's children are never
        smaller than their parent), so the cost is the number of entries found, not the heap size.
        """
        heap, status, serials = self.finish_heap, self.status, self.admit_serial
        size = len(heap)
        found = []
        pending = [0] if heap else []
        while pending:
            index = pending.pop()
            clock, rid, serial = heap[index]
            if clock > last_clock:
                continue
            if status[rid] == DECODING and serials[rid] == serial:  # see _current
                found.append((clock, rid))
            child = 2 * index + 1
            if child < size:
                pending.append(child)
                if child + 1 < size:
                    pending.append(child + 1)
        found.sort()
        return found

    def _preempt_newest(self) -> None:
        """Free the newest running request's blocks and queue it (first) for recomputation."""
        order = self.admission_order
        while True:
            serial, rid = order.pop()
            if self.admit_serial[rid] == serial and self.status[rid] in (PREFILLING, DECODING):
                break
        if self.status[rid] == DECODING:
            ticked = self.clock - int(self.base_clock[rid])
            blocks = blocks_for(self._leave_decode(rid), self.bs) - int(self.shared[rid])
            self.emitted[rid] += ticked
            if ticked:
                self.last_token[rid] = self.last_tick
            else:
                self.pending_joins[float(self.join_time[rid])] -= 1
            self.finish_clock[rid] = -1
        else:
            blocks = int(self.held[rid])
            if rid in self.partials:
                self.partials.remove(rid)
        self.alloc.release(blocks)
        self._drop_prefix(rid)
        self.status[rid] = WAITING
        self.running -= 1
        self.preemptions[rid] += 1
        self.target[rid] = self.prompt[rid] + self.emitted[rid]
        self.prefilled[rid] = 0
        self.waited_for_kv[rid] = True  # preempted for lack of blocks: it waits for KV by definition
        self.waiting.appendleft(rid)

    def _make_room_for_decode(self) -> int:
        """Allocate the blocks the next decode tick needs, preempting the newest requests until they fit.

        Returns how many requests were preempted (an iteration that preempts admits nobody, as in vLLM,
        so a victim is not readmitted into the blocks it just gave up).
        """
        preempted = 0
        if self.incremental:
            while self.decoding:
                need = int(self.phase_counts[(-self.clock) % self.bs])
                if need <= self.alloc.free:
                    self.alloc.allocate(need)
                    break
                self._preempt_newest()
                preempted += 1
        return preempted

    def _ticks(self, ends: np.ndarray | list[float]) -> None:
        """Bookkeeping after ``len(ends)`` decode ticks ending at times ``ends`` (blocks already allocated)."""
        first = float(ends[0])
        itl, joins, ticks = self.itl, self.pending_joins, len(ends)
        if joins:
            old = self.decoding - sum(joins.values())
            if old > 0:
                itl.add(first - self.last_tick, old)
            for when, count in joins.items():
                if count > 0:
                    itl.add(first - when, count)
            joins.clear()
        elif self.decoding:
            itl.add(first - self.last_tick, self.decoding)
        if ticks > 1:
            gaps = np.diff(ends) if isinstance(ends, np.ndarray) else [b - a for a, b in zip(ends, ends[1:])]
            itl.add_rows(gaps, self.decoding)
        self.last_tick = float(ends[-1])
        self.clock += ticks
        self.decode_cached += self.decoding * ticks

    # -- costing -------------------------------------------------------------------------------------------

    def _cost_scalar(self, fields: tuple[float, ...]) -> tuple[float, ...]:
        """(seconds, FLOPs, bytes, compute-bound s, memory-bound s, communication s) of the step with these
        fields (in Step's order), memoised."""
        hit = self.cost_cache.get(fields)
        if hit is not None:
            return hit
        self.totals.cost_calls += 1
        value = tuple(float(v) for v in self.system.step_totals(Step(*fields))[:CHARGED_TOTALS])
        if len(self.cost_cache) < COST_CACHE_MAX:
            self.cost_cache[fields] = value
        return value

    def _note_decode_step(self, step: tuple, mixed: bool) -> None:
        """Remember a decode step: a decode tick's (batch, keys attended), or a mixed iteration's Step fields."""
        kind = 1 if mixed else 0
        if self.first_decode[kind] is None:
            self.first_decode[kind] = step
        self.last_decode[kind] = step

    def _charge(self, seconds, flops, moved, compute_bound, memory_bound, communication, iterations: int,
                decode: bool, mixed: bool = False) -> None:
        """Add ``iterations`` iterations to the totals; ``decode``: they decode, ``mixed``: they also prefill
        (counted apart so that a decode step's FLOPs are not averaged with prefill chunks')."""
        t = self.totals
        if isinstance(seconds, np.ndarray):  # arrays over the iterations of a stretch
            # Summed in tick order (cumsum), as the scalar path adds tick by tick: both paths agree bit for bit.
            seconds, flops, moved = _in_order(seconds), _in_order(flops), _in_order(moved)
            compute_bound, memory_bound = _in_order(compute_bound), _in_order(memory_bound)
            communication = _in_order(communication)
        if decode:
            t.decode_iterations += iterations
            t.decode_flops += flops
            t.decode_bytes += moved
            if not mixed:
                t.decode_only_iterations += iterations
                t.decode_only_flops += flops
                t.decode_only_bytes += moved
        t.busy_seconds += seconds
        t.flops += flops
        t.bytes += moved
        t.compute_bound_seconds += compute_bound
        t.memory_bound_seconds += memory_bound
        t.communication_seconds += communication
        t.iterations += iterations

    # -- iterations ----------------------------------------------------------------------------------------

    def _iteration(self, env: simpy.Environment, chunks: list[Chunk], decode: bool) -> Generator:
        """One iteration: ``chunks`` of prefill plus (``decode``) one token for every decoding sequence."""
        decoders = self.decoding if decode else 0
        fields = iteration_fields(chunks, decoders, self.decode_cached)
        if chunks and self.first_prefill_step is None:
            self.first_prefill_step = Step(*fields)
        if decoders:
            self._note_decode_step(fields, mixed=bool(chunks))
        seconds, flops, moved, compute_bound, memory_bound, communication = self._cost_scalar(fields)
        if self.load_due:
            # Offload-tier loads overlap the iteration's compute layer by layer: it lasts max(compute, load).
            exposed = max(0.0, self.load_due - seconds)
            assert self.prefixes is not None and self.prefixes.tier is not None
            self.prefixes.tier.stats.exposed_seconds += exposed
            seconds += exposed
            self.load_due = 0.0
        self._charge(seconds, flops, moved, compute_bound, memory_bound, communication, 1, decoders > 0, bool(chunks))
        yield env.timeout(seconds)
        now = env.now
        self._now = now
        self.log.add(now, seconds, int(fields[1]), decoders, self.alloc.used, self.running)
        if decoders:
            self._ticks([now])
        for chunk in chunks:
            self.prefilled[chunk.rid] += chunk.tokens
            if chunk.emits:
                if self.chunked:
                    self.partials.remove(chunk.rid)
                self._prefill_done(chunk.rid, now)
        self._finish_decoders(now)

    def _plan_stretch(self, across_completions: bool, limit: int = STRETCH_MAX) -> "Stretch":
        """The decode ticks that can run before anything but completions changes the batch.

        Without ``across_completions`` the stretch ends at the first completion (a waiting request
        might take the freed slot); with it, completions only shrink the batch, and the stretch
        runs on to :data:`STRETCH_MAX` ticks or until the last decoder finishes. Either way it stops
        before the first tick whose new blocks are not free.
        """
        self._clean_heap()
        clock, bs = self.clock, self.bs
        horizon, leaving = self._horizon(limit, across_completions)
        if not leaving:
            return self._plain_stretch(horizon)
        rids = [rid for _, rid in leaving]
        leave_at = np.array([fc for fc, _ in leaving], dtype=np.int64) - clock  # first tick index they are gone
        base_cached = np.array([self.base_cached[rid] for rid in rids], dtype=np.int64)
        start_phase = base_cached - np.array([self.base_clock[rid] for rid in rids], dtype=np.int64)
        cached_now = start_phase + clock
        ticks = np.arange(horizon)
        gone = np.searchsorted(leave_at, ticks, side="right")  # decoders finished before tick j
        batch = self.decoding - gone
        gone_cached = _prefix_sums(cached_now)[gone]
        context = (self.decode_cached - gone_cached) + batch * (ticks + 1.0)
        if self.incremental:
            # A shared prefix is not freed by one user.
            freed = -(-(cached_now + leave_at) // bs) - np.array([self.shared[rid] for rid in rids], dtype=np.int64)
        else:
            freed = np.array([self.held[rid] for rid in rids], dtype=np.int64)
        freed_by = _prefix_sums(freed)[gone]
        needs = None
        steps = horizon
        if self.incremental:
            phases = (-(clock + ticks)) % bs
            # Decoders leaving by tick and block phase, counted as one flat (tick, phase) index.
            cells = leave_at * bs + start_phase % bs
            finished_by_phase = np.bincount(cells, minlength=(horizon + 1) * bs).reshape(horizon + 1, bs)
            finished_by_phase = np.cumsum(finished_by_phase, axis=0)[:horizon]
            needs = np.array(self.phase_counts)[phases] - finished_by_phase[ticks, phases]
            short = np.flatnonzero(np.cumsum(needs) > self.alloc.free + freed_by)
            if len(short):
                steps = int(short[0])
        return Stretch(steps, batch, context, needs, freed_by, leave_at)

    def _stretch_costs(self, batch: np.ndarray, contexts: np.ndarray) -> list[np.ndarray]:
        """Cost totals (see :meth:`System.step_totals`) of decode ticks with ``batch`` decoders attending ``contexts`` keys.

        One vectorised call: a constant batch is passed as a scalar, and a batch that shrinks as
        decoders finish costs the token-only operators once per batch size (step_totals' memo), so
        every tick equals the same tick costed alone, bit for bit.
        """
        self.totals.cost_calls += 1
        size = float(batch[0]) if batch[0] == batch[-1] else batch  # the batch only shrinks within a stretch
        totals = self.system.step_totals(_decode_step(size, contexts))
        shape = contexts.shape
        return [value if isinstance(value, np.ndarray) and value.shape == shape else np.broadcast_to(value, shape)
                for value in totals[:CHARGED_TOTALS]]

    def _plain_stretch(self, horizon: int) -> "Stretch":
        """:meth:`_plan_stretch` when nobody finishes within ``horizon`` ticks (the common case: fewer numpy calls)."""
        ticks = np.arange(horizon)
        batch = np.full(horizon, self.decoding)
        context = self.decode_cached + self.decoding * (ticks + 1.0)
        freed_by = np.zeros(horizon, dtype=np.int64)
        leave_at = np.zeros(0, dtype=np.int64)
        if not self.incremental:
            return Stretch(horizon, batch, context, None, freed_by, leave_at)
        needs = np.array(self.phase_counts)[(-(self.clock + ticks)) % self.bs]
        short = np.flatnonzero(np.cumsum(needs) > self.alloc.free)
        return Stretch(int(short[0]) if len(short) else horizon, batch, context, needs, freed_by, leave_at)

    def _stretch(self, env: simpy.Environment, cut_at_arrival: bool, across_completions: bool) -> Generator:
        """Decode ticks costed in one vectorised call (see module docstring); falls back to one tick with preemption."""
        limit = STRETCH_MAX
        next_arrival = self._next_arrival_seconds() if cut_at_arrival else None
        if next_arrival is not None and self.last_decode_seconds > 0:
            # Costing ticks past the next arrival is wasted work: plan a little beyond where it lands.
            gap = next_arrival - env.now
            limit = max(1, min(STRETCH_MAX, int(1.25 * gap / self.last_decode_seconds) + 4))
        if self.fit_admission and self.waiting:
            # fit's test moves with every tick (the others' tokens left fall, the waiting one's do not): one tick,
            # then the engine tests the queue's head again, as SGLang does every iteration.
            limit = 1
        self._clean_heap()
        reach = limit if across_completions else min(self.finish_heap[0][0] - self.clock, limit)
        if reach <= SCALAR_TICKS:
            yield from self._short_stretch(env, next_arrival, across_completions, limit)
            return
        plan = self._plan_stretch(across_completions, limit)
        steps = plan.steps
        if steps == 0:
            self._make_room_for_decode()
            if self.decoding:
                yield from self._iteration(env, [], decode=True)
            return
        now = env.now
        batch, contexts = plan.batch[:steps].astype(float), plan.context[:steps]
        seconds, flops, moved, compute_bound, memory_bound, communication = self._stretch_costs(batch, contexts)
        ends = now + np.cumsum(seconds)
        if next_arrival is not None:
            first_after = int(np.searchsorted(ends, next_arrival, side="left"))
            steps = min(steps, first_after + 1)
        ends, seconds = ends[:steps], seconds[:steps]
        self.last_decode_seconds = float(seconds[-1])
        self._charge(seconds, flops[:steps], moved[:steps], compute_bound[:steps], memory_bound[:steps],
                     communication[:steps], steps, True)
        self._note_decode_step((int(batch[0]), float(contexts[0])), mixed=False)
        if steps > 1:
            self._note_decode_step((int(batch[steps - 1]), float(contexts[steps - 1])), mixed=False)
        used = self.alloc.used - plan.freed_by[:steps]
        if plan.needs is not None:
            used = used + np.cumsum(plan.needs[:steps])
        running = self.running - (self.decoding - plan.batch[:steps])
        self.in_flight = InFlight(ends, used, plan.leave_at)
        yield env.timeout(float(ends[-1]) - now)
        self.in_flight = None
        self._now = env.now
        self.log.append(end=ends, seconds=seconds, prefill_tokens=0, decode_seqs=plan.batch[:steps],
                        blocks_used=used, running=running)
        # Replay the ticks segment by segment (the batch changes only where decoders finish).
        start = 0
        leaving = dict.fromkeys(tick for tick in plan.leave_at.tolist() if tick <= steps)  # sorted, no repeats
        for stop in [*leaving, steps]:
            if stop <= start:
                continue
            if plan.needs is not None:
                self.alloc.allocate(int(plan.needs[start:stop].sum()))
            self._ticks(ends[start:stop])
            self._finish_decoders(float(ends[stop - 1]))
            start = stop

    def _short_stretch(self, env: simpy.Environment, next_arrival: float | None, across_completions: bool,
                       limit: int) -> Generator:
        """:meth:`_stretch` for a stretch of at most :data:`SCALAR_TICKS` ticks, in plain Python.

        The same plan as :meth:`_plan_stretch`, walked tick by tick (decoders leave at their finish
        tick; a tick needs a block for every decoder whose cache fills its last block, and the stretch
        stops before the first tick whose blocks are not free), each tick costed as it is planned
        (by :meth:`_tick_cost`), up to the first iteration boundary at or after the next arrival; then
        the same replay.
        """
        clock, bs, incremental = self.clock, self.bs, self.incremental
        horizon, leaving = self._horizon(limit, across_completions)
        leave_at = [finish - clock for finish, _ in leaving]  # first tick index each is gone
        phase_counts = self.phase_counts.copy() if incremental else []
        decoding, cached_sum, free = self.decoding, self.decode_cached, self.alloc.free
        used_before, running_before = self.alloc.used, self.running
        now = env.now
        arrival = np.inf if next_arrival is None else next_arrival
        batches: list[int] = []
        needed_by: list[int] = []  # new blocks of ticks 0..j
        used: list[int] = []
        ends: list[float] = []
        seconds: list[float] = []
        add_batch, add_needed, add_used, add_end, add_seconds = (
            batches.append, needed_by.append, used.append, ends.append, seconds.append)
        elapsed = flops = moved = compute_bound = memory_bound = communication = 0.0
        gone = gone_cached = freed = needed = 0
        k, count = 0, len(leaving)
        next_leave = leave_at[0] if count else horizon + 1
        cost_batch, cost = -1, None
        first_context = last_context = 0.0
        phase = (-clock) % bs  # decoders in this block phase need a new block at the tick
        steps = horizon
        for j in range(horizon):
            while next_leave <= j:
                rid = leaving[k][1]
                start_phase = self.base_cached[rid] - self.base_clock[rid]
                cached_now = start_phase + clock
                gone += 1
                gone_cached += cached_now
                if incremental:
                    freed += -(-(cached_now + next_leave) // bs) - self.shared[rid]
                    phase_counts[start_phase % bs] -= 1
                else:
                    freed += self.held[rid]
                k += 1
                next_leave = leave_at[k] if k < count else horizon + 1
            batch = decoding - gone
            if incremental:
                needed += phase_counts[phase]
                if needed > free + freed:
                    steps = j  # this tick's blocks are not free
                    break
                phase = phase - 1 if phase else bs - 1
            context = (cached_sum - gone_cached) + batch * (j + 1.0)
            if batch != cost_batch:  # the first tick, or decoders left
                cost_batch, cost = batch, self._tick_cost(batch)
                if not j:
                    first_context = context
            if cost is not None:
                tick_seconds, tick_flops, tick_bytes, tick_compute, tick_memory, tick_communication = cost(context)
            else:
                tick_seconds, tick_flops, tick_bytes, tick_compute, tick_memory, tick_communication = self._cost_scalar(
                    (float(batch), 0.0, float(batch), float(batch), context, 0.0, context, context))
            elapsed += tick_seconds
            end = now + elapsed
            flops += tick_flops
            moved += tick_bytes
            compute_bound += tick_compute
            memory_bound += tick_memory
            communication += tick_communication
            add_batch(batch)
            add_needed(needed)
            add_used(used_before - freed + needed)
            add_end(end)
            add_seconds(tick_seconds)
            last_context = context
            if end >= arrival:
                steps = j + 1  # the first iteration boundary at or after the next arrival
                break
        if steps == 0:
            self._make_room_for_decode()
            if self.decoding:
                yield from self._iteration(env, [], decode=True)
            return
        self.last_decode_seconds = seconds[-1]
        self._charge(elapsed, flops, moved, compute_bound, memory_bound, communication, steps, True)
        self._note_decode_step((batches[0], first_context), mixed=False)
        self._note_decode_step((batches[-1], last_context), mixed=False)
        self.in_flight = InFlight(ends, used, leave_at)
        yield env.timeout(ends[-1] - now)
        self.in_flight = None
        self._now = env.now
        self.log.add_rows(ends, seconds, 0, batches, used, [running_before - (decoding - batch) for batch in batches])
        start = 0
        for stop in [*dict.fromkeys(tick for tick in leave_at if tick <= steps), steps]:
            if stop <= start:
                continue
            if incremental:
                self.alloc.allocate(needed_by[stop - 1] - (needed_by[start - 1] if start else 0))
            self._ticks(ends[start:stop])
            self._finish_decoders(ends[stop - 1])
            start = stop

    def _tick_cost(self, batch: int) -> Callable[[float], tuple[float, ...]] | None:
        """The totals of a decode tick of ``batch`` sequences as a function of the keys attended, traced from
        the cost model once per batch (equal to step_totals bit for bit; None where it cannot be traced)."""
        if batch in self.tick_costs:
            return self.tick_costs[batch]
        system, size = self.system, float(batch)
        self.totals.cost_calls += 1
        cost = trace_scalar(lambda keys: system.step_totals(_decode_step(size, keys))[:CHARGED_TOTALS],
                            (size, 1e3 * size, 1e6 * size))
        self.tick_costs[batch] = cost
        return cost

    def _serve(self, env: simpy.Environment) -> Generator:
        scheduler = self.config.scheduler
        wall_start = time.perf_counter()
        last_report = wall_start
        loops = 0
        while True:
            now = env.now
            self._now = now
            self._arrive(now)
            loops += 1
            if self.progress is not None and loops % 64 == 0:
                wall = time.perf_counter()
                if wall - last_report > 0.1:
                    self.progress(self.done, self.total)
                    last_report = wall
            if scheduler == "static":
                chunks = plan_static(self)
                if chunks:
                    yield from self._iteration(env, chunks, decode=False)
                    continue
                if chunks is not None:
                    yield from self._stretch(env, cut_at_arrival=False, across_completions=True)
                    continue
            elif scheduler in ("continuous", "prefill-first"):
                # Both run prefills alone and decode only when no prefill can run.
                chunks = plan_continuous(self) if scheduler == "continuous" else plan_prefill_first(self)
                if chunks:
                    yield from self._iteration(env, chunks, decode=False)
                    continue
                if chunks is not None:
                    idle_queue = not self.waiting
                    # In a closed loop a completion sends the next request: a stretch stops at each one.
                    yield from self._stretch(env, cut_at_arrival=idle_queue,
                                             across_completions=idle_queue and not self.sends_on_finish)
                    continue
            else:
                if self.decoding and not self.partials and not self._head_admissible():
                    idle_queue = not self.waiting
                    # In a closed loop a completion sends the next request: a stretch stops at each one.
                    yield from self._stretch(env, cut_at_arrival=idle_queue,
                                             across_completions=idle_queue and not self.sends_on_finish)
                    continue
                preempted = self._make_room_for_decode()
                chunks = plan_chunked(self, admit=preempted == 0 or not self.decoding)
                if chunks is not None:
                    yield from self._iteration(env, chunks, decode=True)
                    continue
            if self.running or self.waiting:
                raise RuntimeError("engine stalled with work left")  # a bug, not bad input
            wake = self._idle_event(env, now)
            if wake is None:
                return
            yield wake

    def _next_arrival_seconds(self) -> float | None:
        """When the next request not yet seen arrives (None: no more are known)."""
        released = self.released[0][0] if self.released else None
        if self.next_arrival >= (self.n if self.follower is None else self.roots) and not self._load_more():
            return released
        upcoming = float(self.arrival[self.next_arrival])
        if upcoming == np.inf:  # a closed loop's request, or a session's later turn, not sent yet
            return released
        return upcoming if released is None else min(upcoming, released)

    def _idle_event(self, env: simpy.Environment, now: float) -> simpy.Event | None:
        """What an idle engine waits for (the next arrival), or None when the run is over."""
        if self.follower is not None:  # sessions: idle with nothing sent means every turn has been served
            upcoming_turn = self._next_arrival_seconds()
            return None if upcoming_turn is None else env.timeout(max(0.0, upcoming_turn - now))
        if self.next_arrival >= self.n and not self._load_more():
            return None
        upcoming = float(self.arrival[self.next_arrival])
        if upcoming == np.inf:
            # A closed loop sends a request whenever one finishes, so an idle engine has nothing unsent.
            raise RuntimeError("closed loop stalled with requests unsent")  # a bug, not bad input
        return env.timeout(upcoming - now)

    def run(self) -> EngineResult:
        env = simpy.Environment()
        self._now = 0.0
        started = time.perf_counter()
        env.process(self._serve(env))
        env.run()
        if self.records is not None:
            self._write_all()
        if self.progress is not None:
            self.progress(self.done, self.total)
        return self.result(time.perf_counter() - started)

    def _array(self, name: str) -> np.ndarray:
        """Per-request state ``name`` as a numpy array of its result dtype (streaming: mapped from its file)."""
        if self.records is not None and name in RECORD_FIELDS:
            return self.records.array(name)
        return np.array(getattr(self, name), dtype=PER_REQUEST[name])

    def result(self, wall_seconds: float = 0.0) -> EngineResult:
        """What the run produced so far (the whole run once its simpy process has returned)."""
        workload = self.workload
        if self.concurrency is not None or self.follower is not None:  # the send times chosen (NaN: never sent)
            workload = replace(workload, arrival_seconds=np.array(self.sent, dtype=float))
        extra: dict = {}
        if self.prefixes is not None:
            extra = {"prefix_cache": self.prefixes.stats}
            if self.records is None:  # per request: prompt tokens served from a cache at its (last) admission
                extra["cached_tokens"] = self._array("cached_tokens")
            if self.prefixes.tier is not None:
                extra["offload"] = self.prefixes.tier.stats
        return EngineResult(
            workload=workload,
            config=self.config,
            kv_blocks=self.alloc.total,
            status=self._array("status"),
            reject_reason=self._array("reject_reason"),
            first_scheduled=self._array("first_scheduled"),
            first_token=self._array("first_token"),
            finish=self._array("finish"),
            preemptions=self._array("preemptions"),
            log=self.log,
            itl=self.itl,
            totals=self.totals,
            kv_high_water_blocks=self.alloc.high_water,
            max_running=self.max_running,
            first_prefill_step=self.first_prefill_step,
            first_decode_step=_as_step(self.first_decode[0] or self.first_decode[1]),
            last_decode_step=_as_step(self.last_decode[0] or self.last_decode[1]),
            wall_seconds=wall_seconds,
            waited_for_kv=self._array("waited_for_kv"),
            extra=extra,
        )


def simulate(
    system: "System | PipelineSystem",
    workload: Workload,
    config: SchedulerConfig,
    kv_blocks: int,
    progress: Callable[[int, int], None] | None = None,
    records: Path | str | None = None,
    offload: Callable[[], OffloadTier | None] | None = None,
) -> EngineResult:
    """Serve ``workload`` on ``system`` with ``config`` and a KV cache of ``kv_blocks`` blocks.

    ``records``: a folder to stream the per-request records, the iteration log and the inter-token gaps to
    (:mod:`simulator.engine.records`); the result's arrays then map those files. None: all held in memory.
    """
    return Engine(system, workload, config, kv_blocks, progress, records, offload=offload).run()
