"""Data-parallel serving: ``replicas`` copies of one deployment behind a router, fed by one arrival stream.

Each replica is the ordinary engine (:class:`~simulator.engine.engine.Engine`: its own scheduler,
paged KV cache and iteration costs); the router (:mod:`simulator.engine.router`) picks a replica
for every arriving request. Two ways to run them, both exact:

- ``round_robin`` ignores replica state, so the stream is split up front (the k-th admissible
  request to replica k mod R) and each replica runs alone on its share: the cost per simulated
  request does not depend on R.
- ``least_outstanding`` and ``least_kv`` read replica state at each arrival, so every replica
  is a :class:`Replica` process in ONE simpy environment with the router process. A replica learns
  its requests from the router: at each iteration boundary it asks the router to route every
  arrival up to now, and an idle replica sleeps until the router hands it one. The router reads
  each replica's state at the arrival time: requests finished and KV blocks in use by then,
  including the ticks of a vectorised decode stretch that have ended (the stretch is visible while
  in flight), so routing is as if every replica stepped one iteration at a time. A replica's
  stretch is cut at the first iteration boundary after the next arrival anywhere in the cluster
  (it may be routed there), so the cost per request grows mildly with R for these policies.

Requests no replica could ever serve (too long for the model or for a whole cache) are rejected at
the router. Per-request arrays of the merged result are indexed like the workload; ``extra`` holds
``replica`` (the replica of each request, -1 if rejected) and ``replicas`` (each replica's own
EngineResult). Totals of the merged result: counts, FLOPs and bytes are sums over replicas; busy and
bound seconds are means over replicas (so shares and busy fractions read as for one replica);
``kv_blocks``, ``kv_high_water_blocks`` and ``max_running`` are sums (the high water is an upper
bound of what was held at one time across the cluster).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Generator
from pathlib import Path

import numpy as np
import simpy

from simulator.cost.client_path import engine_arrivals
from simulator.cost.pipeline import PipelineSystem
from simulator.cost.system import System
from simulator.engine.engine import PER_REQUEST, Engine, simulate
from simulator.engine.engine_result import EngineResult, Totals
from simulator.engine.iteration import reject_reasons
from simulator.engine.kv_offload import OffloadTier, TierStats
from simulator.engine.kvcache import blocks_for
from simulator.engine.metrics import REJECTED, iteration_log, itl_samples
from simulator.engine.prefix_cache import PrefixStats
from simulator.engine.prefix_router import PrefixRouter
from simulator.engine.router import ReplicaLoad, Router, check_router, round_robin_split
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.sessions import SessionWorkload, is_sessions, sent_workload
from simulator.engine.workload import Workload
from simulator.errors import InputError

REPLICA_ARRAYS = ("global_ids", "queued_share")
"""A replica's own per-request arrays (besides the engine's per-request lists, engine.PER_REQUEST)."""


def _subset(workload: Workload, ids: np.ndarray, label: str) -> Workload:
    prefix_id, prefix_tokens = workload.prefix_id, workload.prefix_tokens
    return Workload(workload.arrival_seconds[ids], workload.prompt_tokens[ids], workload.output_tokens[ids],
                    workload.kind, f"{workload.description} ({label})",
                    prefix_id=None if prefix_id is None else prefix_id[ids],
                    prefix_tokens=None if prefix_tokens is None else prefix_tokens[ids],
                    client_seconds=None if workload.client_seconds is None else workload.client_seconds[ids],
                    response_seconds=workload.response_seconds)


class Replica(Engine):
    """An engine whose requests are handed over by a :class:`Cluster` router as they arrive."""

    def __init__(self, cluster: Cluster, index: int, system: System | PipelineSystem, config: SchedulerConfig, kv_blocks: int,
                 capacity: int, offload: Callable[[], OffloadTier | None] | None = None) -> None:
        empty = Workload(np.zeros(capacity), np.ones(capacity, dtype=np.int64), np.ones(capacity, dtype=np.int64),
                         cluster.workload.kind, "")
        super().__init__(system, empty, config, kv_blocks, offload=offload)
        # Sessions: a finished turn's blocks join its session's prefix, and its finish sends the next turn.
        self.grow = self.prefixes is not None and cluster.sessions
        self.sends_on_finish = cluster.sessions
        self.arrival = self.arrival.copy()
        self.response = cluster.workload.response_seconds
        self.cluster, self.index = cluster, index
        self.capacity = capacity
        self.n = 0
        self.global_ids = np.zeros(capacity, dtype=np.int64)
        self.queued_share = np.zeros(capacity, dtype=np.int64)  # what each queued request adds to queued_blocks
        self.wake: simpy.Event | None = None
        self.queued_blocks = 0  # blocks the queued (routed, not running) requests need to start

    # -- requests handed over by the router ------------------------------------------------------------------

    def _grow(self) -> None:
        size = 2 * self.capacity
        for name, dtype in PER_REQUEST.items():
            getattr(self, name).extend([np.zeros((), dtype=dtype).item()] * self.capacity)
        for name in REPLICA_ARRAYS:
            grown = np.zeros(size, dtype=np.int64)
            grown[: self.capacity] = getattr(self, name)
            setattr(self, name, grown)
        self.capacity = size

    def hand_over(self, rid: int, arrival: float, prompt: int, output: int, prefix: int = -1,
                  prefix_tokens: int = 0) -> None:
        """Request ``rid`` of the cluster's workload, routed here at time ``arrival`` (with its shared prefix, if any)."""
        if self.n == self.capacity:
            self._grow()
        local = self.n
        self.arrival[local], self.prompt[local], self.output[local] = arrival, prompt, output
        self.reject_reason[local] = 0
        for name in ("first_scheduled", "first_token", "finish", "last_token", "join_time"):
            getattr(self, name)[local] = np.nan
        self.prefix_id[local] = prefix
        self.prefix_blocks[local] = max(0, min(prefix_tokens, prompt - 1)) // self.bs if prefix >= 0 else 0
        self.global_ids[local] = rid
        self.n += 1
        self._queue(local, blocks_for(prompt if self.incremental else prompt + output - 1, self.bs))
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def load(self, now: float) -> ReplicaLoad:
        """Requests in flight and KV blocks in use at ``now``, counting the ended ticks of a stretch in flight."""
        finished, used = self.done, self.alloc.used
        flight = self.in_flight
        if flight is not None:
            ticks = int(np.searchsorted(flight.ends, now, side="right"))
            finished += int(np.searchsorted(flight.leave_at, ticks, side="right"))
            used = int(flight.used[min(ticks, len(flight.used) - 1)])
        return ReplicaLoad(self.n - finished, used, self.queued_blocks, self.alloc.total)

    # -- engine hooks ----------------------------------------------------------------------------------------

    def _arrive(self, now: float) -> None:
        self.cluster.route_until(now)
        super()._arrive(now)

    def _queue(self, rid: int, blocks: int) -> None:
        self.queued_share[rid] = blocks
        self.queued_blocks += blocks

    def admit(self, rid: int) -> int:
        self.queued_blocks -= int(self.queued_share[rid])
        return super().admit(rid)

    def _preempt_newest(self) -> None:
        super()._preempt_newest()
        victim = self.waiting[0]
        self._queue(victim, blocks_for(int(self.target[victim]), self.bs))

    def _next_arrival_seconds(self) -> float | None:
        if self.next_arrival < self.n:
            return float(self.arrival[self.next_arrival])
        return self.cluster.next_arrival_seconds()

    def _release(self, rid: int, when: float) -> None:
        if self.cluster.sessions:
            self.cluster.release(int(self.global_ids[rid]), when)

    def _idle_event(self, env: simpy.Environment, now: float) -> simpy.Event | None:
        if self.next_arrival < self.n:
            return env.timeout(max(0.0, float(self.arrival[self.next_arrival]) - now))
        if self.cluster.next_arrival_seconds() is None and not self.cluster.unreleased:
            return None
        self.wake = env.event()
        return self.wake

    def finished_result(self) -> EngineResult:
        """This replica's result, its arrays cut to the requests it served (in its own order)."""
        n = self.n
        for name in (*PER_REQUEST, *REPLICA_ARRAYS):
            setattr(self, name, getattr(self, name)[:n])
        self.workload = Workload(self._array("arrival"), self._array("prompt"), self._array("output"),
                                 self.cluster.workload.kind, f"replica {self.index}: {n} requests")
        return self.result()


class Cluster:
    """The router and the replicas of a co-simulated run (see the module docstring)."""

    def __init__(self, system: System | PipelineSystem, workload: Workload, config: SchedulerConfig, kv_blocks: int,
                 replicas: int, router: str, admitted: np.ndarray, offload: Callable[[], OffloadTier | None] | None = None,
                 staleness: float = 0.0) -> None:
        self.workload = workload
        self.router = PrefixRouter(replicas, staleness) if router == "prefix" else Router(router, replicas)
        self.admitted = admitted
        # Sessions (simulator.engine.sessions): the first turns arrive in order, each later turn is released when the
        # turn before it finishes (``release``) and routed from the heap ``released``.
        self.sessions = is_sessions(workload)
        self.order = np.flatnonzero(admitted)
        self.released: list[tuple[float, int]] = []
        self.unreleased = 0
        # The router sees a request when it reaches the engines, after its client path (simulator.cost.client_path).
        self.arrival = (workload.arrival_seconds if workload.client_seconds is None
                        else engine_arrivals(workload.arrival_seconds, workload.client_seconds))
        if self.sessions:
            assert isinstance(workload, SessionWorkload) and workload.previous is not None
            self.arrival = self.arrival.astype(float).copy()
            self.order = np.flatnonzero(workload.previous < 0)  # not-admitted ones release their next turn at arrival
            self.follower = workload.followers()
            self.pre = np.zeros(len(workload)) if workload.client_seconds is None else workload.client_seconds
            self.sent = np.where(np.isfinite(workload.arrival_seconds), workload.arrival_seconds, np.nan)
            self.unreleased = int((workload.previous >= 0).sum())
        self.next = 0  # index into self.order of the next request to route
        self.assignment = np.full(len(workload), -1, dtype=np.int64)
        capacity = max(64, int(1.25 * len(workload) / replicas) + 64)
        self.replicas = [Replica(self, r, system, config, kv_blocks, capacity, offload) for r in range(replicas)]
        self.env: simpy.Environment | None = None

    def next_arrival_seconds(self) -> float | None:
        """Arrival time of the next request not yet routed (None: none is known yet)."""
        upcoming = float(self.arrival[self.order[self.next]]) if self.next < len(self.order) else None
        if self.released and (upcoming is None or self.released[0][0] < upcoming):
            return self.released[0][0]
        return upcoming

    def release(self, rid: int, when: float) -> None:
        """Sessions: the client got request ``rid``'s answer at ``when``; the turn after it is sent a think time later."""
        follower = int(self.follower[rid])
        if follower < 0:
            return
        sent = when + float(self.workload.think_seconds[follower])  # type: ignore[attr-defined]
        self.sent[follower] = sent
        self.arrival[follower] = at = sent + float(self.pre[follower])
        self.unreleased -= 1
        heapq.heappush(self.released, (at, follower))
        assert self.env is not None
        self.env.process(self._route_at(at))

    def _route_at(self, at: float) -> Generator:
        assert self.env is not None
        yield self.env.timeout(max(0.0, at - self.env.now))
        self.route_until(self.env.now)

    def route_until(self, now: float) -> None:
        """Route every request that has arrived by ``now``, each by the replicas' state at its arrival."""
        order, arrival, workload, released = self.order, self.arrival, self.workload, self.released
        while True:
            if released and released[0][0] <= now and (self.next >= len(order) or released[0][0] < arrival[order[self.next]]):
                rid = heapq.heappop(released)[1]
            elif self.next < len(order) and arrival[order[self.next]] <= now:
                rid = int(order[self.next])
                self.next += 1
            else:
                break
            at = float(arrival[rid])
            if not self.admitted[rid]:  # rejected at the router: its client sends the next turn
                self.release(rid, at + workload.response_seconds)
                continue
            loads = [replica.load(at) for replica in self.replicas]
            prefix, tokens = -1, 0
            if workload.prefix_id is not None and workload.prefix_tokens is not None:
                prefix, tokens = int(workload.prefix_id[rid]), int(workload.prefix_tokens[rid])
            if isinstance(self.router, PrefixRouter):
                wanted = max(0, min(tokens, int(workload.prompt_tokens[rid]) - 1)) // self.replicas[0].bs if prefix >= 0 else 0
                self.router.observe([replica.prefixes for replica in self.replicas], at)
                cached = self.router.cached(prefix) if wanted else [0] * len(self.replicas)
                chosen = self.router.choose_by_prefix(loads, cached, wanted)
            else:
                chosen = self.router.choose(loads)
            self.assignment[rid] = chosen
            self.replicas[chosen].hand_over(rid, at, int(workload.prompt_tokens[rid]), int(workload.output_tokens[rid]),
                                            prefix, tokens)
        if self.sessions and self.next >= len(order) and not released and not self.unreleased:
            self._wake_all()  # every request routed: idle replicas wake up to finish

    def _wake_all(self) -> None:
        for replica in self.replicas:
            if replica.wake is not None and not replica.wake.triggered:
                replica.wake.succeed()

    def _arrivals(self, env: simpy.Environment) -> Generator:
        while True:
            upcoming = self.next_arrival_seconds()
            if upcoming is None:
                break
            if upcoming > env.now:
                yield env.timeout(upcoming - env.now)
            self.route_until(env.now)
        for replica in self.replicas:  # the stream is over: idle replicas wake up to finish
            if replica.wake is not None and not replica.wake.triggered:
                replica.wake.succeed()

    def run(self) -> list[EngineResult]:
        env = simpy.Environment()
        self.env = env
        for replica in self.replicas:
            replica._now = 0.0
            env.process(replica._serve(env))
        env.process(self._arrivals(env))
        env.run()
        return [replica.finished_result() for replica in self.replicas]


def _merge_totals(parts: list[Totals]) -> Totals:
    count = len(parts)
    merged = Totals()
    for part in parts:
        merged.flops += part.flops
        merged.bytes += part.bytes
        merged.iterations += part.iterations
        merged.cost_calls += part.cost_calls
        merged.decode_iterations += part.decode_iterations
        merged.decode_flops += part.decode_flops
        merged.decode_bytes += part.decode_bytes
        merged.decode_only_iterations += part.decode_only_iterations
        merged.decode_only_flops += part.decode_only_flops
        merged.decode_only_bytes += part.decode_only_bytes
        merged.busy_seconds += part.busy_seconds / count
        merged.compute_bound_seconds += part.compute_bound_seconds / count
        merged.memory_bound_seconds += part.memory_bound_seconds / count
        merged.communication_seconds += part.communication_seconds / count
    return merged


def merge(workload: Workload, config: SchedulerConfig, parts: list[EngineResult], ids: list[np.ndarray],
          assignment: np.ndarray, reasons: np.ndarray, wall_seconds: float) -> EngineResult:
    """One EngineResult for the whole cluster (see the module docstring for how totals combine)."""
    n = len(workload)
    status = np.full(n, REJECTED, dtype=np.int8)
    nan = np.full(n, np.nan)
    first_scheduled, first_token, finish = nan.copy(), nan.copy(), nan.copy()
    preemptions = np.zeros(n, dtype=np.int32)
    waited = np.zeros(n, dtype=bool)
    itl, log = itl_samples(), iteration_log()
    for part, where in zip(parts, ids):
        status[where] = part.status
        first_scheduled[where], first_token[where], finish[where] = part.first_scheduled, part.first_token, part.finish
        preemptions[where] = part.preemptions
        if part.waited_for_kv is not None:
            waited[where] = part.waited_for_kv
        if part.itl.size:
            itl.append(seconds=part.itl["seconds"], weight=part.itl["weight"])
        if part.log.size:
            log.append(**{name: part.log[name] for name in ("end", "seconds", "prefill_tokens", "decode_seqs",
                                                             "blocks_used", "running")})
    first = next((part for part in parts if part.first_prefill_step is not None), parts[0])
    extra: dict = {"replica": assignment, "replicas": parts}
    if any("prefix_cache" in part.extra for part in parts):
        stats = PrefixStats()
        cached = np.zeros(n, dtype=np.int64)
        for part, where in zip(parts, ids):
            if "prefix_cache" in part.extra:
                stats.add(part.extra["prefix_cache"])
                cached[where] = part.extra.get("cached_tokens", 0)
        extra["prefix_cache"] = stats
        extra["cached_tokens"] = cached
    tiers = [part.extra["offload"] for part in parts if "offload" in part.extra]
    if tiers:
        tier = TierStats(tiers[0].kind)
        for one in tiers:
            tier.add(one)
        extra["offload"] = tier
    return EngineResult(
        workload=workload, config=config, kv_blocks=sum(part.kv_blocks for part in parts), status=status,
        reject_reason=reasons, first_scheduled=first_scheduled, first_token=first_token, finish=finish,
        preemptions=preemptions, log=log, itl=itl, totals=_merge_totals([part.totals for part in parts]),
        kv_high_water_blocks=sum(part.kv_high_water_blocks for part in parts),
        max_running=sum(part.max_running for part in parts), first_prefill_step=first.first_prefill_step,
        first_decode_step=first.first_decode_step, last_decode_step=first.last_decode_step,
        wall_seconds=wall_seconds, extra=extra, waited_for_kv=waited,
    )


def simulate_cluster(
    system: System | PipelineSystem,
    workload: Workload,
    config: SchedulerConfig,
    kv_blocks: int,
    replicas: int,
    router: str = "round_robin",
    progress: Callable[[int, int], None] | None = None,
    cosimulate: bool = False,
    records: Path | str | None = None,
    offload: Callable[[], OffloadTier | None] | None = None,
    router_staleness: float = 0.0,
) -> EngineResult:
    """Serve ``workload`` on ``replicas`` copies of ``system`` (each with ``kv_blocks`` blocks) behind ``router``.

    ``cosimulate`` runs round-robin through the shared simpy environment too (a check of the
    co-simulation: it gives the same result as the up-front split). ``records``: stream one
    replica's per-request records and iteration log to this folder (simulator.engine.records).
    """
    if replicas < 1:
        raise InputError(f"--replicas: must be >= 1 (got {replicas})")
    check_router(router)
    if workload.concurrency is not None and replicas > 1:
        raise InputError(f"--max-concurrency: a closed loop is simulated on one replica; run with --replicas 1 (got {replicas})")
    if records is not None and replicas > 1:
        raise InputError(f"--records: streams the records of one replica; run with --replicas 1 (got {replicas})")
    if replicas == 1:
        result = simulate(system, workload, config, kv_blocks, progress, records, offload=offload)
        result.extra["replica"] = np.where(result.status == REJECTED, -1, 0)
        result.extra["replicas"] = [result]
        return result
    started = time.perf_counter()
    prompt = workload.prompt_tokens.astype(np.int64)
    output = workload.output_tokens.astype(np.int64)
    reasons = reject_reasons(prompt, output, config, system.model.max_context, kv_blocks)
    admitted = reasons == 0
    if router == "round_robin" and not cosimulate and not is_sessions(workload) and offload is None:
        assignment = round_robin_split(admitted, replicas)
        ids = [np.flatnonzero(assignment == r) for r in range(replicas)]
        parts = []
        finished = 0
        for r, where in enumerate(ids):
            share = _subset(workload, where, f"replica {r}")
            report = None if progress is None else (lambda done, _n, base=finished: progress(base + done, len(workload)))
            parts.append(simulate(system, share, config, kv_blocks, report) if len(where) else _idle(system, share, config, kv_blocks))
            finished += len(where)
    else:
        cluster = Cluster(system, workload, config, kv_blocks, replicas, router, admitted, offload, router_staleness)
        parts = cluster.run()
        assignment = cluster.assignment
        ids = [replica.global_ids for replica in cluster.replicas]
        if cluster.sessions:
            workload = sent_workload(workload, cluster.sent)
    if progress is not None:
        progress(len(workload), len(workload))
    return merge(workload, config, parts, ids, assignment, reasons, time.perf_counter() - started)


def _idle(system: System | PipelineSystem, workload: Workload, config: SchedulerConfig, kv_blocks: int) -> EngineResult:
    """The result of a replica that got no request."""
    return Engine(system, workload, config, kv_blocks).result()
