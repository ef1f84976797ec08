"""A disaggregated run: the prefill and decode pools planned, the KV link chosen, the pools served.

``disaggregate P:D`` runs P prefill replicas and D decode replicas
(:mod:`simulator.engine.disaggregated`). Each pool is planned like an ordinary run's deployment
(:func:`simulator.plan.placement.plan_serving`) on its own GPU (``prefill_gpu`` / ``decode_gpu``,
default ``gpu``) at its own tensor-parallel degree (``prefill_tp`` / ``decode_tp``, default ``tp``,
else the smallest that serves), expert-parallel degree (``prefill_ep`` / ``decode_ep``, default ``ep``)
and attention data parallelism (``prefill_dp_attention`` / ``decode_dp_attention``, default
``dp_attention``), as Dynamo and SGLang deploy DeepSeek (prefill tp 8 ep 8 with attention DP, decode
tp 16 ep 16 across nodes), with its own paged KV cache. Each pool's operators, and so its collectives,
are its layout's (:func:`simulator.model.layers.build_operators`): the all-reduces within its tensor-parallel
group, the MoE dispatch and combine within its expert-parallel group; a layout the model does not allow is
refused by the run's own checks, the error naming the pool's setting (:func:`in_pool_words`). The run's scheduler settings apply to
both pools; ``router`` spreads arrivals over the prefill replicas. With ``speculative`` the decode
pool decodes speculatively (:mod:`simulator.plan.speculative_run`).

What the run reports for the whole stream (TTFT from the prefill pool, TPOT to the decode pool's
finish) is in :class:`~simulator.plan.engine_run.EngineRun` as usual; the deployment and KV cache it names
are the decode pool's, and ``result.extra["disaggregation"]`` holds both pools' results and the
transfers (:func:`disaggregation_summary` reads them).
"""

from __future__ import annotations

import re
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


def in_pool_words(message: str, role: str, own: dict[str, Any], tp_from_ep: bool = False) -> str:
    """An error about the ``role`` pool's deployment, naming the pool's own settings (``own``: what it set itself).

    The checks of a layout (:mod:`simulator.model.parallelism`) are the run's, phrased for ``--tp``, ``--ep`` and
    ``--dp-attention``; where the pool set that value itself, the flag becomes the pool's (``--decode-ep``) wherever
    the message gives it a value (``--tp: ...``, ``--tp 4``), not where it quotes an engine's flags (``--tp N``).
    ``tp_from_ep``: the pool's degree was taken from its own ``ep`` (no tp given), so a ``--tp`` value is that ep.
    An error that starts with the pool's flag needs no other prefix.
    """
    flags = {name.replace("_", "-"): f"--{role}-{name.replace('_', '-')}" for name in own}
    if tp_from_ep:
        flags["tp"] = f"--{role}-ep"
    if flags:
        pattern = re.compile(rf"(?<![\w-])--({'|'.join(map(re.escape, flags))})(?=:| \d)")
        message = pattern.sub(lambda match: flags[match.group(1)], message)
    if message.startswith(f"--{role}-"):
        return message
    return f"--disaggregate: the {role} pool: {message}"


def plan_pool(settings: RunSettings, role: str, replicas: int, config: Any) -> Pool:
    """The deployment and KV cache of one pool's replica, at the pool's own layout (``settings.pool_layout``)."""
    own = settings.pool_layout(role)
    options = {**settings.model_dump(), **own}
    planned = settings.closed_batch_size if settings.qps is None and settings.trace is None else settings.batch
    try:
        deployment = plan_serving(options, planned, settings.ctx, config, settings.gpu_memory_utilization)
        capacity = kv_capacity(deployment, config.block_size, settings.gpu_memory_utilization, config.max_batched_tokens,
                               config.max_num_seqs, settings.kv_blocks)
    except InputError as exc:
        tp_from_ep = "tp" not in own and settings.tp is None and (own.get("ep") or 1) > 1
        raise InputError(in_pool_words(str(exc), role, own, tp_from_ep)) from None
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
    prefill = plan_pool(settings, "prefill", p, config)
    decode = plan_pool(settings, "decode", d, config)
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
class PoolStep:
    """One step a pool ran, costed on the pool's own deployment (seconds on one of its GPUs)."""

    kind: str
    """prefill: the prefill pool's first prefill step; decode: the decode pool's last decode step"""
    tokens: int
    sequences: int
    seconds: float
    allreduce_seconds: float
    """the all-reduces of the tensor-parallel group (under attention DP they also gather the step's tokens for the
    MoE layers, as SGLang's dp_gather does, and hand them back)"""
    alltoall_seconds: float
    """the MoE layers' dispatch and combine within the expert-parallel group (0 at ep 1)"""


def pool_step(system: Any, step: Any, kind: str) -> PoolStep | None:
    """``step`` costed on ``system``, its collectives by kind; None when the pool ran no such step."""
    if step is None:
        return None
    cost = system.step_cost(step)

    def of(kind_: str) -> float:
        return float(sum(float(op.seconds) for op in cost.operators if op.kind == kind_))

    return PoolStep(kind, int(step.tokens), int(step.sequences), float(cost.seconds), of("allreduce"), of("alltoall"))


@dataclass(frozen=True)
class PoolSummary:
    """One pool's share of a disaggregated run (SI units)."""

    role: str
    gpu: str
    tp: int
    ep: int
    dp_attention: bool
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
    communication_share: float
    """collectives' seconds / busy seconds, over the pool's run"""
    step: PoolStep | None
    """a step of the pool's own kind (prefill or decode), with its collectives"""


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
    step = part.first_prefill_step if pool.role == "prefill" else part.last_decode_step
    return PoolSummary(
        role=pool.role, gpu=system.gpu.name, tp=system.tp, ep=system.ep, dp_attention=system.dp_attention,
        replicas=pool.replicas, gpus=pool.gpus,
        kv_blocks_per_replica=pool.capacity.blocks,
        busy_fraction=part.totals.busy_seconds / duration if duration > 0 else 0.0,
        queue_seconds=metrics.queue, latency_seconds=metrics.ttft, preemptions=metrics.preemptions,
        kv_high_water_fraction=metrics.kv_high_water_fraction, communication_share=metrics.communication_share,
        step=pool_step(system, step, pool.role),
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
