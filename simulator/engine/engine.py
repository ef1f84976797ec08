"""The discrete-event serving loop (simpy): arrivals, scheduling, KV blocks, and the cost of each iteration.

The engine only schedules; the time of every iteration is ``system.step_totals(step).seconds`` for a
:class:`~simulator.model.step.Step` built from running totals of the sequences in it, so building
a step costs O(sequences that changed), not O(sequences).

Token accounting per request (prompt ``p``, output ``o``): the prefill processes ``p``
tokens and emits output token 1; decode tick k (k = 1 .. o - 1) feeds token k back,
attends ``p + k`` keys (itself included) and emits token k + 1. A sequence holding ``t``
cached tokens holds ceil(t / block_size) KV blocks. A preempted request is recomputed: its
prompt and the tokens it has emitted are prefilled again, which emits its next token.

Decode *stretches*: while no sequence joins, every decode iteration has the same batch (less the
decoders that finished) and a context sum that grows by the batch size per iteration, so the engine
plans up to :data:`STRETCH_MAX` iterations at once, stopping at the first iteration that would need a
block that is not free, (when a new arrival could be admitted) the first iteration boundary after the
next arrival, and at the next completion where a waiting request might take the freed slot (with
nobody waiting, a stretch runs on across completions: ``across_completions``). A stretch of at most
:data:`SCALAR_TICKS` ticks is planned, costed and replayed in plain Python, each tick costed
by a function traced from the cost model (:mod:`simulator.cost.tracing`) and remembered
(:data:`~simulator.engine.stretch.TICK_MEMO_MAX`); a longer one is costed in one vectorised
cost-model call, except where measured kernel tables time the ticks, whose array lookups save
nothing over remembered ticks. Both give the same run bit for bit, and the per-iteration log and
latencies are those of stepping one iteration at a time.

Streaming (``records``, :mod:`simulator.engine.records`): only a window of requests is held;
the records of finished ones go to files.

:class:`Engine` is one simpy process whose methods all read and write the same per-request lists and
block allocator; they are split by concept into the classes it inherits, one module each, each building
on the one before: the shared state's declarations (:mod:`simulator.engine.engine_state`), the request
window (:mod:`simulator.engine.request_window`: arrivals, sends, streaming), sequence life
(:mod:`simulator.engine.sequences`), admission and preemption (:mod:`simulator.engine.admission`) and the
planning of decode stretches (:mod:`simulator.engine.stretch`). This module keeps the simpy loop, every
call into the cost model and what it charges, and the result. What does not touch the run's state lives
beside them: the iteration's step and cost fields (:mod:`simulator.engine.iteration`), the result types
(:mod:`simulator.engine.engine_result`), the scheduler's policies (:mod:`simulator.engine.scheduler`) and
the caches (``kvcache``, ``prefix_cache``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generator

import numpy as np
import simpy

from simulator.cost.kernel_tables.source import source_of
from simulator.cost.system import System
from simulator.cost.tracing import trace_scalar
from simulator.engine.engine_result import EngineResult, Totals
from simulator.engine.engine_state import PER_REQUEST, InFlight
from simulator.engine.iteration import _as_step, _decode_step, _in_order, iteration_fields
from simulator.engine.kv_offload import OffloadTier
from simulator.engine.kvcache import BlockAllocator
from simulator.engine.metrics import iteration_log, itl_samples
from simulator.engine.prefix_cache import PrefixAllocator, PrefixCache
from simulator.engine.records import RECORD_FIELDS, RecordFiles
from simulator.engine.request_window import STREAM_WINDOW
from simulator.engine.scheduler import (
    Chunk,
    SchedulerConfig,
    plan_chunked,
    plan_continuous,
    plan_prefill_first,
    plan_static,
)
from simulator.engine.sessions import SessionWorkload, is_sessions
from simulator.engine.stretch import SCALAR_TICKS, STRETCH_MAX, DecodeStretches
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.model.step import Step

if TYPE_CHECKING:
    from simulator.cost.pipeline import PipelineSystem

COST_CACHE_MAX = 1 << 16
"""Scalar steps remembered (identical steps recur in closed batches and fixed-length workloads)."""

CHARGED_TOTALS = 6
"""The leading StepTotals fields the engine charges (seconds, FLOPs, bytes, compute-bound, memory-bound and
communication seconds); the launch wait is in ``seconds``, and the run's host share is what the others leave."""

TickCosts = dict[int, Callable[[float], tuple[float, ...]] | None]
"""A system's traced decode-tick costs by batch (None: not traceable)."""
TickMemo = dict[int, dict[float, tuple[float, ...]]]
"""A system's decode ticks' totals by batch, then keys attended (simulator.engine.stretch.TICK_MEMO_MAX)."""

_TICK_COSTS: OrderedDict[int, tuple[object, TickCosts, TickMemo]] = OrderedDict()

_TICK_MEMO_ENTRIES = [0]
"""Ticks remembered in every kept system's memo together (one count, so that the bound holds per process)."""

TICK_COST_SYSTEMS = 8
"""Systems whose traced decode-tick costs are kept (the most recently used)."""


def _tick_costs_of(system: object) -> tuple[TickCosts, TickMemo]:
    """The traced decode-tick costs of ``system`` and their remembered results (the entry holds the system, so its
    id stays its own): shared by every engine costing the same System object (replicas, repeated runs)."""
    entry = _TICK_COSTS.get(id(system))
    if entry is None or entry[0] is not system:
        if entry is not None:
            _drop_memo(entry[2])
        entry = _TICK_COSTS[id(system)] = (system, {}, {})
        while len(_TICK_COSTS) > TICK_COST_SYSTEMS:
            _drop_memo(_TICK_COSTS.popitem(last=False)[1][2])
    _TICK_COSTS.move_to_end(id(system))
    return entry[1], entry[2]


def _drop_memo(memo: TickMemo) -> None:
    _TICK_MEMO_ENTRIES[0] -= sum(len(remembered) for remembered in memo.values())


class Engine(DecodeStretches):
    """State of one serving run; :meth:`run` drives it with simpy and returns an :class:`EngineResult`."""

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
        # not traceable), and their results by batch and keys attended (pure functions, so a remembered tick is the
        # same floats): both shared by every engine costing the same System object (replicas, repeated runs).
        self.tick_costs, self.tick_memo = _tick_costs_of(system)
        self.tick_memo_entries = _TICK_MEMO_ENTRIES
        # Measured kernel tables time this system's ticks (PipelineSystem: never): their array lookups repeat the
        # scalar arithmetic entry by entry, so a vectorised stretch saves nothing over traced, remembered ticks.
        kernels = source_of(system)
        self.measured_ticks = kernels is not None and kernels.measured
        self.first_prefill_step: Step | None = None
        # First and last decode steps, decode-only ones preferred over mixed ones (index 0: decode-only); a
        # decode-only step is kept as (batch, keys attended) and built once the run is over.
        self.first_decode: list[tuple | None] = [None, None]
        self.last_decode: list[tuple | None] = [None, None]

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
        # Measured kernels: every stretch in plain Python where the tick is traced (benchmarks.bench_engine's
        # measured run at 10^5 requests: 3.44 s of CPU against 3.82 s with long stretches vectorised).
        if reach <= SCALAR_TICKS or (self.measured_ticks and self._tick_cost(self.decoding) is not None):
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

    def _forget_ticks(self) -> None:
        """Empty every kept system's tick memo (:data:`~simulator.engine.stretch.TICK_MEMO_MAX` reached), in place:
        the dicts the engines hold stay theirs."""
        for _, _, memo in _TICK_COSTS.values():
            for remembered in memo.values():
                remembered.clear()
        _TICK_MEMO_ENTRIES[0] = 0

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
