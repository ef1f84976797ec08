"""Admission and preemption: whether the queue's head may start, taking it in, and freeing blocks for a decode tick.

Blocks are counted as the KV admission policy says (``incremental``, ``reserve``, ``fit``; see
:mod:`simulator.engine.scheduler`), less a prefix shared with the cache (:mod:`simulator.engine.prefix_cache`); a
preempted request is queued first and recomputed. The scheduler's policies call :meth:`Admission.admissible` and
:meth:`Admission.admit`; these are the only methods that take blocks for a request that was waiting.
"""

from __future__ import annotations

import numpy as np

from simulator.engine.kvcache import blocks_for
from simulator.engine.metrics import DECODING, PREFILLING, WAITING
from simulator.engine.prefix_cache import reusable_blocks
from simulator.engine.sequences import SequenceLife


class Admission(SequenceLife):
    """The queue's head in, the newest running request out (a part of :class:`~simulator.engine.engine.Engine`)."""

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

    # -- preemption ----------------------------------------------------------------------------------------

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
