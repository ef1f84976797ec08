"""A run with speculative decoding: the draft built and sized, iterations sampled per request, the
engine run, and the same run without speculation to say what it bought.

The engine is the ordinary one (:mod:`simulator.engine.engine`): every decode tick of a sequence is
one speculative *iteration*, costed by :class:`~simulator.cost.speculation.SpeculativeSystem`
(k draft steps + the verification of k + 1 tokens). Each request's number of iterations is drawn
(:func:`~simulator.cost.speculation.sample_iterations`, seeded by ``seed``): a request of ``o``
output tokens is one prefill (token 1) and as many iterations as it takes to emit the other
``o - 1``, so equal requests finish after different numbers of iterations and per-request TPOT
varies. The engine is run with those iteration counts as output lengths; the result then gets the
real output lengths back, so TPOT, throughput and goodput count tokens, not iterations. ITL samples
are gaps between iterations, which is what a streaming client sees (each iteration's tokens
arrive together, as vLLM's benchmark measures them).

Two approximations, both small where speculation is used (decode of short outputs on long
prompts): in the engine a sequence's context grows by one token per iteration, not by the
tokens accepted, so attention during decode sees up to (o - 1)(1 - 1/E) fewer keys (2048-token
prompts, 128 outputs, E = 2.77: at most 4% short); and KV blocks are counted in the same units,
so the cache's block count is scaled by the ratio of the tokens the requests reach in the engine
to the tokens they really reach (at least what the largest request needs), which keeps the
cache's occupancy right on average.

Memory: the draft's weights and its KV cache per token (a draft model's own, or the head's one
layer) come out of the same per-GPU budget as the target's cache (:func:`speculative_capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from simulator.cost.deployment import Deployment
from simulator.cost.memory import GIB, kv_bytes_per_token_per_gpu
from simulator.cost.pipeline import PipelineSystem
from simulator.cost.speculation import (
    DraftMemory,
    SpeculativeSystem,
    crossover_batch,
    draft_memory,
    draft_model_for,
    expected_tokens_per_iteration,
    parse_method,
    sample_iterations,
    speedup,
)
from simulator.cost.system import System
from simulator.engine.cluster import simulate_cluster
from simulator.engine.engine_result import EngineResult
from simulator.engine.kvcache import KVCapacity, blocks_for
from simulator.engine.metrics import Aggregates, aggregate
from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.model.architecture import load_model
from simulator.model.parallelism import check_tensor_parallel
from simulator.plan.engine_run import EngineRun, Prepared, prepare, simulate_prepared
from simulator.plan.settings import RunSettings, SpeculativeSettings, parse_settings

SEED_STREAM = 0x5BEC
"""Second word of the acceptance draws' seed, so they are independent of the workload's draws from ``seed``."""

SPECULATIVE_FIELDS = ("speculative", "num_speculative_tokens", "acceptance")


@dataclass(frozen=True)
class SpeculativeStats:
    """What speculation did in a run, and what it bought against the same run without it (SI units)."""

    method: str
    draft: str
    tokens: int
    acceptance: tuple[float, ...]
    expected_tokens_per_iteration: float
    tokens_per_iteration: float
    """the run's own: decode tokens emitted / iterations, over the requests that decoded"""
    draft_weights_bytes_per_gpu: float
    draft_kv_bytes_per_token_per_gpu: float
    kv_blocks_without_draft: int
    mean_decode_batch: float
    """decoding sequences per decode iteration, averaged over the run's decode iterations"""
    step_speedup: float
    """t_decode / (t_iteration / E) at the mean decode batch and ctx (cost model)"""
    step_speedup_batch1: float
    crossover_batch: int | None
    """smallest decode batch at ctx where speculation stops paying (None: none up to ``crossover_limit_batch``)"""
    crossover_limit_batch: int
    """the largest batch searched: the sequences of ctx tokens the cache holds"""
    context_tokens: int
    tpot_seconds_mean: float
    output_tokens_per_second: float
    baseline: Aggregates | None = None
    """the same run without speculation"""

    @property
    def tpot_speedup(self) -> float | None:
        """Mean TPOT without speculation / with it (> 1: faster)."""
        if self.baseline is None or not self.baseline.tpot.mean or not self.tpot_seconds_mean:
            return None
        return self.baseline.tpot.mean / self.tpot_seconds_mean

    @property
    def throughput_speedup(self) -> float | None:
        """Output tokens/s with speculation / without it."""
        if self.baseline is None or not self.baseline.output_tokens_per_second:
            return None
        return self.output_tokens_per_second / self.baseline.output_tokens_per_second


def draft_system(settings: SpeculativeSettings, target: System | PipelineSystem) -> tuple[str, str, System]:
    """(method, draft name, the draft's System on the target's GPU, precision, tp and engine)."""
    assert settings.speculative is not None
    method, name = parse_method(settings.speculative)
    base = target.stage if isinstance(target, PipelineSystem) else target
    model = target.model
    try:
        named = load_model(name) if name else None
    except InputError as exc:  # the draft was named by --speculative, not --model
        raise InputError(f"--speculative {settings.speculative}: {str(exc).removeprefix('--model: ')}") from None
    draft = draft_model_for(method, named, model)
    if method == "draft":
        try:
            check_tensor_parallel(draft, base.tp)
        except InputError as exc:
            raise InputError(f"--speculative: draft {draft.name} runs at the target's tensor-parallel degree: {exc}") from None
        # A dense draft of an MoE target has no experts to split.
        return method, draft.name, replace(base, model=draft, ep=1, routing_skew=0.0)
    return method, draft.name, replace(base, model=draft)


def speculative_capacity(capacity: KVCapacity, memory: DraftMemory, context_tokens: int, where: str) -> KVCapacity:
    """The target's cache once the draft's weights and KV per token share its budget (per GPU):

        blocks = floor((budget - draft weights) / (block_size x (target + draft KV bytes per token)))

    An override of the block count (``kv_blocks``) stays as given. InputError when one
    ``context_tokens`` sequence no longer fits.
    """
    per_block = capacity.bytes_per_block_per_gpu + capacity.block_size * memory.kv_bytes_per_token_per_gpu
    budget = capacity.budget_bytes_per_gpu - memory.weights_bytes_per_gpu
    blocks = capacity.blocks if capacity.overridden else max(0, math.floor(budget / per_block))
    needed = blocks_for(context_tokens, capacity.block_size)
    if blocks < needed:
        raise InputError(
            f"{where} does not fit with its draft: the draft's weights ({memory.weights_bytes_per_gpu / GIB:.2f} GiB per "
            f"GPU) and KV cache leave {blocks} blocks of {capacity.block_size} tokens, less than one {context_tokens}-token "
            f"sequence needs ({needed}); raise --tp or --gpu-memory-utilization, or use a smaller draft"
        )
    return replace(capacity, blocks=blocks, bytes_per_block_per_gpu=per_block,
                   budget_bytes_per_gpu=budget, weights_bytes_per_gpu=capacity.weights_bytes_per_gpu + memory.weights_bytes_per_gpu)


def engine_blocks(blocks: int, block_size: int, workload: Workload, iterations: np.ndarray) -> int:
    """The cache's blocks in the engine's units (one token per iteration; module docstring)."""
    prompt = workload.prompt_tokens.astype(np.int64)
    real = np.maximum(prompt + workload.output_tokens.astype(np.int64) - 1, prompt)
    engine = prompt + iterations
    scaled = math.floor(blocks * float(engine.sum()) / float(real.sum()))
    fits = -(-real // block_size) <= blocks
    largest = int((-(-engine[fits] // block_size)).max()) if fits.any() else 1
    return max(1, scaled, largest)


def with_outputs(workload: Workload, outputs: np.ndarray) -> Workload:
    return replace(workload, output_tokens=outputs.astype(workload.output_tokens.dtype))


def restore_outputs(result: EngineResult, real: Workload) -> EngineResult:
    """``result`` of the engine's workload (iterations as outputs) with the real output lengths back,
    in the merged result and in each replica's (whose requests are those routed to it, in order)."""
    parts = result.extra.get("replicas")
    if parts is not None:
        assignment = result.extra["replica"]
        restored = []
        for index, part in enumerate(parts):
            ids = np.flatnonzero(assignment == index)
            restored.append(replace(part, workload=with_outputs(part.workload, real.output_tokens[ids]))
                            if len(ids) == len(part.workload) else part)
        result.extra["replicas"] = restored
    return replace(result, workload=real)


@dataclass(frozen=True)
class SpeculativeSetup:
    """The speculative system and the target's cache with the draft in memory."""

    system: SpeculativeSystem
    memory: DraftMemory
    capacity: KVCapacity
    kv_blocks_without_draft: int


def speculative_setup(settings: SpeculativeSettings, deployment: Deployment, capacity: KVCapacity,
                      context_tokens: int) -> SpeculativeSetup:
    """Build the draft next to ``deployment``'s target and size the target's cache with it."""
    target = deployment.system
    method, name, draft = draft_system(settings, target)
    system = SpeculativeSystem(target, draft, method, settings.acceptance_rates, name)
    memory = draft_memory(method, draft, kv_bytes_per_token_per_gpu(draft.model, draft.precision, draft.tp))
    where = f"{target.model.name} on {target.tp}x {target.gpu.name}"
    return SpeculativeSetup(system, memory, speculative_capacity(capacity, memory, context_tokens, where), capacity.blocks)


def speculative_engine_workload(workload: Workload, acceptance: tuple[float, ...], seed: int) -> tuple[Workload, np.ndarray]:
    """(the workload in iterations: 1 + iterations per request, the iterations) drawn with ``seed``."""
    rng = np.random.default_rng([seed, SEED_STREAM])
    decode_tokens = np.maximum(workload.output_tokens.astype(np.int64) - 1, 0)
    iterations = sample_iterations(decode_tokens, acceptance, rng)
    return with_outputs(workload, 1 + iterations), iterations


def mean_decode_batch(result: EngineResult) -> float:
    seqs = result.log["decode_seqs"]
    decoding = seqs[seqs > 0]
    return float(decoding.mean()) if len(decoding) else 1.0


def without_speculation(settings: RunSettings) -> RunSettings:
    """The same settings with speculation off (what the speed-up is measured against)."""
    given = settings.model_dump(exclude_unset=True)
    return parse_settings(RunSettings, {key: value for key, value in given.items() if key not in SPECULATIVE_FIELDS})


def speculative_stats(setup: SpeculativeSetup, workload: Workload, iterations: np.ndarray, result: EngineResult,
                      context_tokens: int, metrics: Aggregates, baseline: Aggregates | None) -> SpeculativeStats:
    spec = setup.system
    decoding = workload.output_tokens > 1
    emitted = float((workload.output_tokens[decoding] - 1).sum())
    rounds = float(iterations[decoding].sum())
    batch = mean_decode_batch(result)
    limit = max(1, setup.capacity.tokens // context_tokens)
    return SpeculativeStats(
        method=spec.method,
        draft=spec.draft_name,
        tokens=spec.tokens,
        acceptance=spec.acceptance,
        expected_tokens_per_iteration=expected_tokens_per_iteration(spec.acceptance),
        tokens_per_iteration=emitted / rounds if rounds else 0.0,
        draft_weights_bytes_per_gpu=setup.memory.weights_bytes_per_gpu,
        draft_kv_bytes_per_token_per_gpu=setup.memory.kv_bytes_per_token_per_gpu,
        kv_blocks_without_draft=setup.kv_blocks_without_draft,
        mean_decode_batch=batch,
        step_speedup=float(speedup(spec, batch, context_tokens)),
        step_speedup_batch1=float(speedup(spec, 1, context_tokens)),
        crossover_batch=crossover_batch(spec, context_tokens, limit),
        crossover_limit_batch=limit,
        context_tokens=context_tokens,
        tpot_seconds_mean=metrics.tpot.mean,
        output_tokens_per_second=metrics.output_tokens_per_second,
        baseline=baseline,
    )


def simulate_speculative(prep: Prepared, progress: Callable[[int, int], None] | None = None,
                         compare: bool = True) -> EngineRun:
    """The run of ``prep`` with speculative decoding; ``compare``: also the same run without it (for the speed-up)."""
    prep, setup = _with_room_for_the_draft(prep)
    settings = prep.settings
    real = prep.workload
    engine_workload, iterations = speculative_engine_workload(real, setup.system.acceptance, settings.seed)
    blocks = engine_blocks(setup.capacity.blocks, setup.capacity.block_size, real, iterations)
    replicas = settings.replicas
    # SpeculativeSystem costs steps as a System does (duck-typed: the engine only calls step_totals and reads attributes).
    system: Any = setup.system
    result = simulate_cluster(system, engine_workload, prep.config, blocks, replicas, settings.router, progress)
    result = restore_outputs(result, real)
    metrics, per_replica = run_metrics(result, prep.deployment.system, settings, replicas)
    baseline = simulate_prepared(prepare(without_speculation(settings))).metrics if compare else None
    result.extra["speculative"] = speculative_stats(setup, real, iterations, result, settings.ctx, metrics, baseline)
    # Reports cost the run's steps with the deployment's system: here one step is a speculative iteration.
    deployment = replace(prep.deployment, system=system)
    return EngineRun(settings, deployment, real, setup.capacity, prep.config, result, metrics, per_replica)


def _with_room_for_the_draft(prep: Prepared) -> tuple[Prepared, SpeculativeSetup]:
    """``prep`` and its speculative setup; with the tensor-parallel degree chosen automatically, the next
    larger degree (up to a node) while the draft leaves no room for one sequence (the comparison run then
    uses the same degree)."""
    settings = prep.settings
    while True:
        try:
            return prep, speculative_setup(settings, prep.deployment, prep.capacity, settings.ctx)
        except InputError:
            tp = prep.deployment.system.tp
            if settings.tp is not None or prep.deployment.pp > 1 or 2 * tp > prep.deployment.system.gpu.max_gpus_per_node:
                raise
            prep = prepare(settings.model_copy(update={"tp": 2 * tp}))
            prep = replace(prep, deployment=replace(prep.deployment, auto_tp=True))


def run_metrics(result: EngineResult, system: Any, settings: RunSettings, replicas: int) -> tuple[Aggregates, tuple[Aggregates, ...]]:
    """The run's aggregates and each replica's, as :func:`simulator.plan.run.simulate_settings` computes them."""
    slo = (settings.slo_ttft, settings.slo_tpot, settings.slo_e2e)
    peak, bandwidth = system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second
    metrics = aggregate(result, system.tp, peak * replicas, bandwidth * replicas, *slo)
    per_replica = tuple(aggregate(part, system.tp, peak, bandwidth, *slo) for part in result.extra["replicas"])
    return metrics, per_replica
