"""Decode stretches: planning runs of decode ticks in which only completions change the batch, and the short ones' path.

See :mod:`simulator.engine.engine` for what a stretch is. Here: how far one may run (:meth:`DecodeStretches._horizon`),
its ticks as arrays (:meth:`DecodeStretches._plan_stretch`), and a stretch of at most :data:`SCALAR_TICKS` ticks
planned, costed and replayed in plain Python (:meth:`DecodeStretches._short_stretch`). The choice between the two
paths and the vectorised one are :meth:`Engine._stretch <simulator.engine.engine.Engine._stretch>`, and a tick's traced
cost is ``Engine._tick_cost``: like every call into the cost model they stay in :mod:`simulator.engine.engine`, whose
module globals they read (:data:`STRETCH_MAX`, :data:`SCALAR_TICKS`, ``trace_scalar``; tests patch them there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator

import numpy as np
import simpy

from simulator.engine.admission import Admission
from simulator.engine.engine_state import InFlight
from simulator.engine.iteration import _prefix_sums
from simulator.engine.metrics import DECODING

if TYPE_CHECKING:
    from simulator.engine.scheduler import Chunk

STRETCH_MAX = 4096
"""Most decode iterations costed in one vectorised call (bounds the arrays' size)."""

SCALAR_TICKS = 64
"""A decode stretch planned at most this many ticks long is planned, costed and replayed in plain Python
(numpy's per-call overhead dominates arrays this short); a longer one takes the vectorised path, unless
measured kernel tables time the ticks (``Engine.measured_ticks``: then every stretch is costed tick by tick).
Both give the same run bit for bit (tests/test_engine.py)."""

TICK_MEMO_MAX = 1 << 17
"""Decode ticks' totals remembered by (System, batch, keys attended) in one process, all together; past it every
memo starts again empty. About 270 bytes of objects a tick (tracemalloc: 60,221 ticks, 16 MB), so 35 MB at most;
the resident set grows by more, as the memo's long-lived objects pin the allocator's arenas (a measured run of
3 x 10^5 requests: 97 MB more peak RSS than with the memo forgotten every 16 ticks). The same
tick recurs often, as a batch's keys attended are a sum of whole lengths: 90% of the short stretches' ticks
in ``benchmarks.bench_engine``'s measured run at 10^5 requests are found in it (561,321 of 620,040); with
varied lengths 30% (59% if nothing were forgotten, at twice the entries)."""


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


class DecodeStretches(Admission):
    """Planning and the plain-Python path of decode stretches (a part of :class:`~simulator.engine.engine.Engine`)."""

    if TYPE_CHECKING:  # defined by Engine (simulator.engine.engine), which holds every call into the cost model
        def _iteration(self, env: simpy.Environment, chunks: list[Chunk], decode: bool) -> Generator: ...

        def _charge(self, seconds, flops, moved, compute_bound, memory_bound, communication, iterations: int,
                    decode: bool, mixed: bool = False) -> None: ...

        def _cost_scalar(self, fields: tuple[float, ...]) -> tuple[float, ...]: ...

        def _note_decode_step(self, step: tuple, mixed: bool) -> None: ...

        def _tick_cost(self, batch: int) -> Callable[[float], tuple[float, ...]] | None: ...

        def _forget_ticks(self) -> None: ...

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
        cost_batch, cost, memo, entries = -1, None, self.tick_memo, self.tick_memo_entries
        seen: dict[float, tuple[float, ...]] = {}
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
                seen = memo.setdefault(batch, {})
                if not j:
                    first_context = context
            if cost is not None:
                totals = seen.get(context)
                if totals is None:
                    totals = seen[context] = cost(context)
                    entries[0] += 1
                    if entries[0] > TICK_MEMO_MAX:
                        self._forget_ticks()  # in place: ``seen`` stays this batch's
                tick_seconds, tick_flops, tick_bytes, tick_compute, tick_memory, tick_communication = totals
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
