"""A disaggregated run: the prefill and decode pools planned, the KV link chosen, the pools served.

``disaggregate P:D`` runs P prefill replicas and D decode replicas
(:mod:`simulator.engine.disaggregated`). Each pool is planned like an ordinary run's deployment
(:func:`simulator.plan.placement.plan_serving`) on its own GPU (``prefill_gpu`` / ``decode_gpu``,
default ``gpu``) at its own tensor-parallel degree (``prefill_tp`` / ``decode_tp``, default ``tp``,
else the smallest that serves), with its own paged KV cache. The run's scheduler settings apply to
both pools; ``router`` spreads arrivals over the prefill replicas. With ``speculative`` the decode
pool decodes speculatively (:mod:`simulator.plan.speculative_run`).

What the run reports for the whole stream (TTFT from the prefill pool, TPOT to the decode pool's
finish) is in :class:`~simulator.plan.engine_run.EngineRun` as usual; the deployment and KV cache it names
are the decode pool's, and ``result.extra["disaggregation"]`` holds both pools' results and the
transfers (:func:`disaggregation_summary` reads them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from simulator.cost.deployment import Deployment
from simulator.cost.kv_transfer import KVLink, kv_link
from simulator.cost.memory import kv_bytes_per_sequence
from simulator.engine.closed_loop import with_client_path
from simulator.engine.disaggregated import PoolResults, serve_disaggregated
from simulator.engine.kvcache import KVCapacity, kv_capacity
from simulator.engine.metrics import Aggregates, Summary, aggregate, summarize
from simulator.engine.prefix_cache import with_shared_prefix
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.plan.deployment_planner import engine_from_options
from simulator.plan.engine_run import EngineRun, build_workload, scheduler_config
from simulator.plan.placement import plan_serving
from simulator.plan.settings import RunSettings
from simulator.plan.speculative_run import (
    engine_blocks,
    speculative_engine_workload,
    speculative_setup,
    speculative_stats,
    without_speculation,
)


@dataclass(frozen=True)
class Pool:
    """One pool: its deployment (one replica), KV cache per replica, and how many replicas."""

    role: str
    deployment: Deployment
    capacity: KVCapacity
    replicas: int

    @property
    def gpus(self) -> int:
        return self.deployment.gpus * self.replicas


def plan_pool(settings: RunSettings, role: str, gpu: str | None, tp: int | None, replicas: int, config: Any) -> Pool:
    """The deployment and KV cache of one pool's replica."""
    options = {**settings.model_dump(), "gpu": gpu or settings.gpu, "tp": tp if tp is not None else settings.tp}
    planned = settings.closed_batch_size if settings.qps is None and settings.trace is None else settings.batch
    try:
        deployment = plan_serving(options, planned, settings.ctx, config, settings.gpu_memory_utilization)
        capacity = kv_capacity(deployment, config.block_size, settings.gpu_memory_utilization, config.max_batched_tokens,
                               config.max_num_seqs, settings.kv_blocks)
    except InputError as exc:
        raise InputError(f"--disaggregate: the {role} pool: {exc}") from None
    return Pool(role, deployment, capacity, replicas)


def prompt_kv_bytes(deployment: Deployment, prompt_tokens: np.ndarray) -> np.ndarray:
    """Each request's prompt KV cache in bytes, all layers and KV heads (windows applied), as the link carries it."""
    system = deployment.system
    model, precision = system.model, system.precision
    out = np.zeros(len(prompt_tokens))
    for tokens in np.unique(prompt_tokens):
        out[prompt_tokens == tokens] = kv_bytes_per_sequence(model, precision, float(tokens))
    return out


def _check_fits(workload: Workload, pool: Pool, tokens: np.ndarray) -> None:
    smallest = int(tokens.min())
    if -(-smallest // pool.capacity.block_size) > pool.capacity.blocks:
        system = pool.deployment.system
        raise InputError(
            f"--disaggregate: the {pool.role} pool ({system.model.name} on {system.tp}x {system.gpu.name}) does not fit: "
            f"every request needs more KV cache than its {pool.capacity.blocks} blocks of {pool.capacity.block_size} tokens "
            f"(the smallest needs {smallest} tokens); raise --{pool.role}-tp or --gpu-memory-utilization"
        )


def simulate_disaggregated(settings: RunSettings, progress: Callable[[int, int], None] | None = None) -> EngineRun:
    """Plan both pools and serve the workload through them (module docstring)."""
    assert settings.pools is not None
    p, d = settings.pools
    config = scheduler_config(settings, engine_from_options(settings.model_dump()))
    prefill = plan_pool(settings, "prefill", settings.prefill_gpu, settings.prefill_tp, p, config)
    decode = plan_pool(settings, "decode", settings.decode_gpu, settings.decode_tp, d, config)
    max_context = min(prefill.deployment.system.model.max_context, decode.deployment.system.model.max_context)
    workload = build_workload(settings, max_context)
    if settings.shared_prefix_tokens is not None:
        workload = with_shared_prefix(workload, settings.shared_prefix_tokens, settings.shared_prefix_ratio, settings.seed)
    if settings.client_path == "on":
        # The request side of the client path (simulator.cost.client_path) delays each arrival at the prefill pool. Its
        # response side is not charged here: the prefill pool's first token also starts the KV transfer.
        client = with_client_path(workload, prefill.deployment.system.engine.client, settings.seed)
        workload = replace(client, response_seconds=0.0)
    prompt = workload.prompt_tokens.astype(np.int64)
    _check_fits(workload, prefill, prompt)
    _check_fits(workload, decode, np.maximum(prompt + workload.output_tokens - 1, prompt))
    link = kv_link(prefill.deployment.system.gpu, decode.deployment.system.gpu, prefill.deployment.system.tp,
                   decode.deployment.system.tp, prefill.gpus + decode.gpus)
    kv_bytes = prompt_kv_bytes(prefill.deployment, prompt)
    decode_system: Any = decode.deployment.system
    decode_blocks = decode.capacity.blocks
    decode_outputs = None
    spec_setup = None
    if settings.speculative is not None:
        spec_setup = speculative_setup(settings, decode.deployment, decode.capacity, settings.ctx)
        decode_system = spec_setup.system  # duck-typed as a System (see simulator.plan.speculative_run)
        decode = replace(decode, capacity=spec_setup.capacity, deployment=replace(decode.deployment, system=decode_system))
        # The decode pool emits token 2 on its first iteration; the rest, output - 2 tokens, by speculation.
        after = replace(workload, output_tokens=np.maximum(workload.output_tokens - 1, 1))
        engine, iterations = speculative_engine_workload(after, spec_setup.system.acceptance, settings.seed)
        decode_outputs = engine.output_tokens
        decode_blocks = engine_blocks(spec_setup.capacity.blocks, spec_setup.capacity.block_size, after, iterations)
    result = serve_disaggregated(prefill.deployment.system, decode_system, workload, config, prefill.capacity.blocks,
                                 decode_blocks, (p, d), link, kv_bytes, settings.router, progress, decode_outputs)
    slo = (settings.slo_ttft, settings.slo_tpot, settings.slo_e2e)
    peak = sum(pool.replicas * pool.deployment.system.peak_flops for pool in (prefill, decode))
    bandwidth = sum(pool.replicas * pool.deployment.system.gpu.hbm_bandwidth_bytes_per_second for pool in (prefill, decode))
    metrics = aggregate(result, decode.deployment.system.tp, peak, bandwidth, *slo)
    result.extra["pools"] = (prefill, decode)
    if spec_setup is not None:
        baseline = simulate_disaggregated(without_speculation(settings)).metrics
        result.extra["speculative"] = speculative_stats(spec_setup, after, iterations, result, settings.ctx, metrics, baseline)
    return EngineRun(settings, decode.deployment, workload, decode.capacity, config, result, metrics, ())


@dataclass(frozen=True)
class PoolSummary:
    """One pool's share of a disaggregated run (SI units)."""

    role: str
    gpu: str
    tp: int
    replicas: int
    gpus: int
    kv_blocks_per_replica: int
    busy_fraction: float
    """busy seconds per replica / the run's duration"""
    queue_seconds: Summary
    """prefill: arrival -> admitted; decode: KV received -> admitted"""
    latency_seconds: Summary
    """prefill: TTFT; decode: KV received -> its first token there (token 2)"""
    preemptions: int
    kv_high_water_fraction: float


@dataclass(frozen=True)
class DisaggregationSummary:
    """The pools, the link and the transfers of a disaggregated run (SI units)."""

    ratio: str
    prefill: PoolSummary
    decode: PoolSummary
    link: KVLink
    transfers: int
    kv_bytes_mean: float
    transfer_seconds: Summary
    """on the link, per request"""
    link_wait_seconds: Summary
    """waiting for the sender's earlier transfers"""

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus


def _pool_summary(pool: Any, part: Any, duration: float) -> PoolSummary:
    system = pool.deployment.system
    metrics: Aggregates = aggregate(part, system.tp, system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second)
    return PoolSummary(
        role=pool.role, gpu=system.gpu.name, tp=system.tp, replicas=pool.replicas, gpus=pool.gpus,
        kv_blocks_per_replica=pool.capacity.blocks,
        busy_fraction=part.totals.busy_seconds / duration if duration > 0 else 0.0,
        queue_seconds=metrics.queue, latency_seconds=metrics.ttft, preemptions=metrics.preemptions,
        kv_high_water_fraction=metrics.kv_high_water_fraction,
    )


def disaggregation_summary(run: EngineRun) -> DisaggregationSummary | None:
    """The pools and transfers of ``run``, or None when prefill and decode shared the replicas."""
    pools: PoolResults | None = run.result.extra.get("disaggregation")
    if pools is None:
        return None
    prefill, decode = run.result.extra["pools"]
    duration = run.metrics.duration_seconds
    moved = pools.transfers.kv_bytes > 0
    return DisaggregationSummary(
        ratio=f"{pools.prefill_replicas}:{pools.decode_replicas}",
        prefill=_pool_summary(prefill, pools.prefill, duration),
        decode=_pool_summary(decode, pools.decode, duration),
        link=pools.transfers.link,
        transfers=int(np.count_nonzero(moved)),
        kv_bytes_mean=float(pools.transfers.kv_bytes[moved].mean()) if moved.any() else 0.0,
        transfer_seconds=summarize(pools.transfers.seconds[moved]),
        link_wait_seconds=summarize(pools.transfers.wait_seconds[moved]),
    )
