"""The request window: which requests the engine holds, when each reaches it, what happens as they arrive and finish.

Arrivals (open loop, closed loop, sessions' later turns), the per-request state built from the workload's columns, and
streaming (:mod:`simulator.engine.records`): only a window of requests is held, and the records of finished ones go to
files. These methods touch the per-request lists and the queue, never the KV blocks, so they sit apart from admission.
"""

from __future__ import annotations

import heapq
from collections import deque
from pathlib import Path

import numpy as np

from simulator.cost.client_path import engine_arrivals
from simulator.engine.engine_state import PER_REQUEST, EngineState
from simulator.engine.iteration import reject_reasons
from simulator.engine.metrics import DONE, REJECTED, WAITING
from simulator.engine.prefix_cache import reusable_blocks
from simulator.engine.records import RECORD_FIELDS
from simulator.engine.sessions import is_sessions
from simulator.engine.workload import Workload
from simulator.errors import InputError

STREAM_WINDOW = 1 << 16
"""Requests taken in at a time when streaming records to disk (see :mod:`simulator.engine.records`)."""


class RequestWindow(EngineState):
    """Arrivals, sends and the window of requests held (a part of :class:`~simulator.engine.engine.Engine`)."""

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

    # -- arrivals ------------------------------------------------------------------------------------------

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

    def _next_arrival_seconds(self) -> float | None:
        """When the next request not yet seen arrives (None: no more are known)."""
        released = self.released[0][0] if self.released else None
        if self.next_arrival >= (self.n if self.follower is None else self.roots) and not self._load_more():
            return released
        upcoming = float(self.arrival[self.next_arrival])
        if upcoming == np.inf:  # a closed loop's request, or a session's later turn, not sent yet
            return released
        return upcoming if released is None else min(upcoming, released)
