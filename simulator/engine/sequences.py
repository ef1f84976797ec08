"""Sequence life: a running request ends its prefill, decodes and finishes; and the running sums a decode tick moves.

A decoding sequence's cached tokens are not stored per tick: each holds its count and the decode clock when it joined,
and the engine keeps the sums over all decoders (``decoding``, ``decode_cached``, ``phase_counts``) and a heap of
finish ticks, so a tick's bookkeeping never walks the decoders (only those that join or leave).
"""

from __future__ import annotations

import heapq

import numpy as np

from simulator.engine.kvcache import blocks_for
from simulator.engine.metrics import DECODING, DONE
from simulator.engine.request_window import RequestWindow


class SequenceLife(RequestWindow):
    """Joining, ticking and leaving the decode batch (a part of :class:`~simulator.engine.engine.Engine`)."""

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
