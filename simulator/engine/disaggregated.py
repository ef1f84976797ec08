"""Disaggregated prefill and decode: a pool of prefill replicas, a pool of decode replicas, the KV link between.

Splitwise (Patel et al. 2024), DistServe (Zhong et al. 2024) and Mooncake (Qin et al. 2024) run
the prompt phase and the token phase on separate GPUs, so a long prefill never stalls the decodes
of other requests (TTFT and TPOT stop interfering) at the price of moving every request's KV cache
between them; vLLM and SGLang ship it as P/D disaggregation. A request here:

1. arrives at the prefill pool (``P`` replicas behind the run's router), queues, and is prefilled
   by the ordinary engine with one output token: its **first token** is streamed from the prefill
   replica when the prefill ends (as SGLang's and Mooncake's P/D and DistServe measure TTFT);
2. its prompt's KV cache goes to a decode replica over the KV link
   (:mod:`simulator.cost.kv_transfer`), one transfer after another per prefill replica (they share
   its links), starting when the prefill ends;
3. queues at the decode pool (``D`` replicas, round-robin in order of arrival), where it holds the
   prompt's KV blocks from admission; its first iteration there feeds the first token (one token
   on the received cache, costed as a one-token prefill chunk, which emits token 2), then it decodes
   as usual. Preempted there, it is recomputed locally (the received cache is gone).

So TTFT = prefill queue + prefill; TPOT = (finish - first token) / (output - 1) includes the
transfer and the wait at the decode pool. Single-token requests end at the prefill pool.

The pools are simulated one after the other (prefill first, then decode on the transfers' arrival
times): exact as long as the decode pool does not push back on the prefill pool (in the real
systems a prefill replica keeps a finished request's KV blocks until the decode side has pulled
them; here they are freed when the prefill ends). Per-request arrays of the result are indexed
like the workload; ``extra["disaggregation"]`` holds each pool's merged result and the transfers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from simulator.cost.kv_transfer import KVLink, kv_transfer_seconds, queued_transfer_ends
from simulator.cost.pipeline import PipelineSystem
from simulator.cost.system import System
from simulator.engine.cluster import merge, simulate_cluster
from simulator.engine.engine import Engine
from simulator.engine.engine_result import EngineResult, Totals
from simulator.engine.iteration import reject_reasons
from simulator.engine.metrics import DONE, REJECTED, iteration_log, itl_samples
from simulator.engine.router import round_robin_split
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import Workload

BUDGET_REJECT = 4
"""metrics.REJECT_REASONS code of a prompt over the token budget (does not apply at the decode pool)."""


class DecodeEngine(Engine):
    """A decode replica: each request arrives with ``precomputed`` tokens of its cache already filled.

    Its prompt (as the engine sees it) is the received prompt plus the first token, so the first
    iteration computes that one token on the received cache and emits the next (module docstring).
    """

    def __init__(self, system: System | PipelineSystem, workload: Workload, config: SchedulerConfig, kv_blocks: int,
                 precomputed: np.ndarray) -> None:
        self.precomputed = np.asarray(precomputed, dtype=np.int64)
        super().__init__(system, workload, config, kv_blocks)

    def _reject_reasons(self, kv_blocks: int) -> np.ndarray:
        reasons = super()._reject_reasons(kv_blocks)
        reasons[reasons == BUDGET_REJECT] = 0  # only one token is computed here, whatever the prompt's length
        return reasons

    def admit(self, rid: int) -> int:
        rid = super().admit(rid)
        if self.preemptions[rid] == 0:  # after a preemption the received cache is gone: recompute
            self.prefilled[rid] = max(int(self.prefilled[rid]), int(self.precomputed[rid]))
        return rid


def _subset(workload: Workload, ids: np.ndarray, label: str) -> Workload:
    return Workload(workload.arrival_seconds[ids], workload.prompt_tokens[ids], workload.output_tokens[ids],
                    workload.kind, f"{workload.description} ({label})")


def serve_decode_pool(system: System | PipelineSystem, workload: Workload, precomputed: np.ndarray,
                      config: SchedulerConfig, kv_blocks: int, replicas: int) -> EngineResult:
    """``workload`` (sorted by arrival at the pool) on ``replicas`` decode replicas, round-robin; merged as a cluster."""
    started = time.perf_counter()
    prompt, output = workload.prompt_tokens.astype(np.int64), workload.output_tokens.astype(np.int64)
    reasons = reject_reasons(prompt, output, config, system.model.max_context, kv_blocks)
    reasons[reasons == BUDGET_REJECT] = 0
    assignment = round_robin_split(reasons == 0, replicas)
    ids = [np.flatnonzero(assignment == r) for r in range(replicas)]
    parts = []
    for r, where in enumerate(ids):
        engine = DecodeEngine(system, _subset(workload, where, f"decode replica {r}"), config, kv_blocks, precomputed[where])
        parts.append(engine.run() if len(where) else engine.result())
    return merge(workload, config, parts, ids, assignment, reasons, time.perf_counter() - started)


@dataclass(frozen=True)
class Transfers:
    """Per request of the workload (NaN / 0 where it was not transferred): KV bytes, seconds on the link,
    seconds waiting for the sender's link, arrival at the decode pool."""

    kv_bytes: np.ndarray
    seconds: np.ndarray
    wait_seconds: np.ndarray
    arrival_seconds: np.ndarray
    link: KVLink


@dataclass(frozen=True)
class PoolResults:
    """``extra["disaggregation"]`` of a disaggregated run: each pool's merged result (the decode pool's indexed
    like ``decode_ids``, the requests it served, by arrival there), the transfers, the pools' sizes."""

    prefill: EngineResult
    decode: EngineResult
    decode_ids: np.ndarray
    transfers: Transfers
    prefill_replicas: int
    decode_replicas: int


def transfer_schedule(ready: np.ndarray, sender: np.ndarray, kv_bytes: np.ndarray, link: KVLink) -> tuple[np.ndarray, np.ndarray]:
    """(transfer seconds, end time) per request: each prefill replica sends its requests one after another."""
    seconds = np.asarray(kv_transfer_seconds(kv_bytes.astype(float), link), dtype=float)
    ends = np.zeros(len(ready))
    for replica in np.unique(sender):
        mine = np.flatnonzero(sender == replica)
        order = mine[np.argsort(ready[mine], kind="stable")]
        ends[order] = queued_transfer_ends(ready[order], seconds[order])
    return seconds, ends


def _combine_totals(prefill: Totals, decode: Totals, p: int, d: int) -> Totals:
    """Counts, FLOPs and bytes summed; busy and bound seconds averaged over all p + d replicas (as a cluster's)."""
    merged = Totals()
    for name in ("flops", "bytes", "iterations", "cost_calls", "decode_iterations", "decode_flops", "decode_bytes",
                 "decode_only_iterations", "decode_only_flops", "decode_only_bytes"):
        setattr(merged, name, getattr(prefill, name) + getattr(decode, name))
    for name in ("busy_seconds", "compute_bound_seconds", "memory_bound_seconds", "communication_seconds"):
        setattr(merged, name, (p * getattr(prefill, name) + d * getattr(decode, name)) / (p + d))
    return merged


def serve_disaggregated(
    prefill_system: System | PipelineSystem,
    decode_system: System | PipelineSystem,
    workload: Workload,
    config: SchedulerConfig,
    prefill_blocks: int,
    decode_blocks: int,
    pools: tuple[int, int],
    link: KVLink,
    kv_bytes: np.ndarray,
    router: str = "round_robin",
    progress: Callable[[int, int], None] | None = None,
    decode_outputs: np.ndarray | None = None,
    decode_config: SchedulerConfig | None = None,
) -> EngineResult:
    """Serve ``workload`` on ``pools`` = (P prefill, D decode) replicas (module docstring).

    ``kv_bytes``: each request's prompt KV cache (bytes). ``decode_outputs``: the output lengths the
    decode engine runs (default: output - 1, the tokens after the first); a speculative decode pool
    gives its iterations here, and the decode pool's result gets the real lengths back.
    """
    started = time.perf_counter()
    n = len(workload)
    p, d = pools
    prompt, output = workload.prompt_tokens.astype(np.int64), workload.output_tokens.astype(np.int64)
    prefill_work = replace(workload, output_tokens=np.ones(n, dtype=workload.output_tokens.dtype))
    report = None if progress is None else (lambda done, _n: progress(done // 2, n))
    prefill = simulate_cluster(prefill_system, prefill_work, config, prefill_blocks, p, router, report)
    sender = prefill.extra["replica"]

    moved = np.flatnonzero((prefill.status == DONE) & (output > 1))
    seconds = np.zeros(n)
    arrival = np.full(n, np.nan)
    wait = np.zeros(n)
    if len(moved):
        took, ends = transfer_schedule(prefill.first_token[moved], sender[moved], kv_bytes[moved], link)
        seconds[moved], arrival[moved] = took, ends
        wait[moved] = np.maximum(ends - took - prefill.first_token[moved], 0.0)  # no negative rounding residue
    order = moved[np.argsort(arrival[moved], kind="stable")]
    real_outputs = output[order] - 1
    engine_outputs = real_outputs if decode_outputs is None else np.asarray(decode_outputs, dtype=np.int64)[order]
    decode_work = Workload(arrival[order], prompt[order] + 1, engine_outputs, workload.kind,
                           f"{workload.description} (decode pool)")
    decode = serve_decode_pool(decode_system, decode_work, prompt[order], decode_config or config, decode_blocks, d)
    if decode_outputs is not None:
        decode = _with_real_outputs(decode, real_outputs)
    if progress is not None:
        progress(n, n)
    transfers = Transfers(np.where(np.isin(np.arange(n), moved), kv_bytes, 0.0), seconds, wait, arrival, link)
    pools_result = PoolResults(prefill, decode, order, transfers, p, d)
    combined = _combine(workload, prefill, decode, order, pools_result, time.perf_counter() - started)
    if prefill_system != decode_system:
        # Reports cost the recorded steps with one (the decode pool's) system: a prefill step would be costed wrongly.
        combined.first_prefill_step = None
    return combined


def _with_real_outputs(result: EngineResult, outputs: np.ndarray) -> EngineResult:
    """The decode pool's result with the real output lengths (it ran iterations as outputs)."""
    workload = replace(result.workload, output_tokens=outputs)
    assignment = result.extra["replica"]
    parts = [replace(part, workload=replace(part.workload, output_tokens=outputs[assignment == r]))
             for r, part in enumerate(result.extra["replicas"])]
    result.extra["replicas"] = parts
    return replace(result, workload=workload)


def _combine(workload: Workload, prefill: EngineResult, decode: EngineResult, order: np.ndarray,
             pools: PoolResults, wall_seconds: float) -> EngineResult:
    """One EngineResult for the request stream: prefill pool's queueing and first token, decode pool's finish."""
    status = prefill.status.copy()
    reasons = prefill.reject_reason.copy()
    finish = prefill.finish.copy()
    preemptions = prefill.preemptions.copy()
    waited = np.zeros(len(workload), dtype=bool) if prefill.waited_for_kv is None else prefill.waited_for_kv.copy()
    status[order] = decode.status
    rejected_there = decode.status == REJECTED
    reasons[order[rejected_there]] = decode.reject_reason[rejected_there]
    finish[order] = decode.finish
    preemptions[order] += decode.preemptions
    if decode.waited_for_kv is not None:
        waited[order] |= decode.waited_for_kv
    decoded = order[~rejected_there]
    finish[order[rejected_there]] = np.nan
    itl = itl_samples()
    if decode.itl.size:
        itl.append(seconds=decode.itl["seconds"], weight=decode.itl["weight"])
    handoff = decode.first_token[~rejected_there] - prefill.first_token[decoded]
    handoff = handoff[np.isfinite(handoff)]
    if len(handoff):  # the gap from the first token (prefill pool) to the second (decode pool)
        itl.append(seconds=handoff, weight=np.ones(len(handoff), dtype=np.int64))
    log = iteration_log()
    for part in (prefill, decode):
        if part.log.size:
            log.append(**{name: part.log[name] for name in ("end", "seconds", "prefill_tokens", "decode_seqs",
                                                             "blocks_used", "running")})
    replica = np.where(status == REJECTED, -1, prefill.extra["replica"])
    replica[decoded] = pools.prefill_replicas + decode.extra["replica"][~rejected_there]
    return EngineResult(
        workload=workload, config=prefill.config, kv_blocks=prefill.kv_blocks + decode.kv_blocks, status=status,
        reject_reason=reasons, first_scheduled=prefill.first_scheduled, first_token=prefill.first_token, finish=finish,
        preemptions=preemptions, log=log, itl=itl,
        totals=_combine_totals(prefill.totals, decode.totals, pools.prefill_replicas, pools.decode_replicas),
        kv_high_water_blocks=prefill.kv_high_water_blocks + decode.kv_high_water_blocks,
        max_running=prefill.max_running + decode.max_running, first_prefill_step=prefill.first_prefill_step,
        first_decode_step=decode.first_decode_step, last_decode_step=decode.last_decode_step,
        wall_seconds=wall_seconds, extra={"replica": replica, "disaggregation": pools}, waited_for_kv=waited,
    )
