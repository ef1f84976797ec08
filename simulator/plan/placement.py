"""Where a served model goes: the tensor-parallel degree an engine run uses, by the serving fit rule.

A serving engine does not need the KV cache of every request at once: its paged cache admits
what fits and queues the rest (vLLM, SGLang, TensorRT-LLM all do). What must fit is the engine
itself: vLLM refuses to start when its KV cache cannot hold one sequence of ``max_model_len``
tokens ("The model's max seq len (...) is larger than the maximum number of tokens that can be
stored in KV cache", vllm/v1/core/kv_cache_utils.py ``check_enough_kv_cache_memory``). So the
rule, per GPU:

    weights + activation workspace + runtime reserve + KV of one ``ctx``-token sequence
        <= gpu_memory_utilization x HBM

(the same budget as :func:`simulator.engine.kvcache.kv_capacity`, one formula; under pipeline
parallelism per GPU of the heaviest stage). With ``tp`` given, a deployment that breaks the rule
is an InputError ("does not fit"); without it, the first layout that keeps it is chosen: tensor
parallelism first, the smallest power of two dividing the heads up to the GPUs of one node
(``tensor_parallel_candidates``) — among those, the smallest whose KV cache holds the whole planned
closed batch (``batch`` x ``ctx``, at most the engine's ``max_num_seqs`` sequences: no more ever run at
once) when one does (the report then names the fewer GPUs that would serve it with queueing,
``Deployment.fewest_gpus``), else the smallest that keeps the rule —
then, if even a whole node is too small, the node-wide degree
with 2, 3, ... pipeline stages (TP needs the node's fast links every layer; PP sends one hidden
state per stage, so it is the one to span nodes, as Megatron-LM and vLLM deployments do). A batch
or trace whose KV exceeds the cache then runs with queueing and preemption, and the run says
how many requests waited for KV blocks (:func:`admission_notes`).

The deployment's ``memory`` plan stays the one for the whole closed batch (``batch`` x ``ctx``):
the report shows what the batch would need at once next to what the cache holds.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.cost.deployment import Deployment
from simulator.cost.memory import GIB, plan_memory, tensor_parallel_candidates
from simulator.cost.pipeline import PipelineSystem, check_pipeline, stage_model
from simulator.cost.system import System
from simulator.engine.kvcache import blocks_for, kv_capacity
from simulator.engine.scheduler import SchedulerConfig
from simulator.errors import InputError
from simulator.model.architecture import load_model, with_attention
from simulator.model.gpu import load_gpu
from simulator.plan.deployment_planner import deployment_from_options

if TYPE_CHECKING:
    from simulator.engine.engine_result import EngineResult


def cache_shortfall(deployment: Deployment, config: SchedulerConfig, gpu_memory_utilization: float,
                    context_tokens: int) -> str | None:
    """Why ``deployment`` cannot serve one ``context_tokens`` sequence (the module's rule), or None when it can."""
    capacity = kv_capacity(deployment, config.block_size, gpu_memory_utilization, config.max_batched_tokens,
                           config.max_num_seqs, blocks_override=1)  # the override only keeps a negative budget from raising
    blocks = max(0, math.floor(capacity.budget_bytes_per_gpu / capacity.bytes_per_block_per_gpu))
    needed = blocks_for(context_tokens, config.block_size)
    if blocks >= needed:
        return None
    one_sequence = needed * capacity.bytes_per_block_per_gpu
    return (
        f"{gpu_memory_utilization:g} x {capacity.hbm_bytes_per_gpu / GIB:.1f} GiB per GPU minus weights "
        f"{capacity.weights_bytes_per_gpu / GIB:.1f}, workspace {capacity.workspace_bytes_per_gpu / GIB:.1f} and runtime "
        f"{capacity.reserved_bytes_per_gpu / GIB:.1f} GiB leaves {max(capacity.budget_bytes_per_gpu, 0.0) / GIB:.2f} GiB "
        f"for the KV cache, less than one {context_tokens}-token sequence needs ({one_sequence / GIB:.2f} GiB)"
    )


MAX_AUTO_PP = 8
"""Most pipeline stages the automatic layout tries (8 nodes of tensor-parallel GPUs)."""


def build_deployment(options: dict[str, Any], batch: int, context_tokens: int, tp: int, pp: int) -> Deployment:
    """The deployment at ``tp`` x ``pp`` (no fit check); pp > 1: a PipelineSystem sized by its heaviest stage."""
    base = deployment_from_options({**options, "tp": tp}, batch, context_tokens, require_fit=False)
    if pp == 1:
        return base
    assert isinstance(base.system, System)  # deployment_from_options builds plain systems
    model = base.system.model
    check_pipeline(model, pp)
    stage = replace(base.system, model=stage_model(model, pp))
    plan = plan_memory(stage.model, stage.precision, stage.gpu, tp, batch, context_tokens, stage.operators,
                       dp_attention=stage.dp_attention)
    # Per-GPU figures are the stage's; the model-wide ones stay the whole model's.
    plan = replace(plan, weights_bytes=base.memory.weights_bytes, kv_bytes_per_token=base.memory.kv_bytes_per_token,
                   kv_bytes=base.memory.kv_bytes)
    return Deployment(PipelineSystem(stage, model, pp), plan, auto_tp=False, pp=pp)


def _layouts(options: dict[str, Any]) -> tuple[list[tuple[int, int]], bool]:
    """(tp, pp) pairs to try in order, and whether the choice is automatic.

    Given tp: that tp at the given pp (default 1). Otherwise tensor parallelism first, within a node
    (powers of two up to ``max_gpus_per_node`` dividing the heads, as ``tensor_parallel_candidates``),
    then the largest of those with 2, 3, ... MAX_AUTO_PP stages (pipelines span nodes; TP stays in one).
    """
    tp, pp = options.get("tp"), options.get("pp")
    if tp is not None:
        return [(tp, pp or 1)], False
    model = with_attention(load_model(options["model"]), options.get("attention"))
    gpu = load_gpu(options["gpu"])
    ep = options.get("ep") or 1
    degrees = [ep] if ep > 1 else tensor_parallel_candidates(model, gpu, ep, bool(options.get("dp_attention")))
    if pp is not None:
        return [(degree, pp) for degree in degrees], True
    largest = degrees[-1] if degrees else 1
    stages = range(2, min(MAX_AUTO_PP, model.num_layers) + 1)
    return [(degree, 1) for degree in degrees] + [(largest, stage) for stage in stages], True


def plan_serving(options: dict[str, Any], batch: int, context_tokens: int, config: SchedulerConfig,
                 gpu_memory_utilization: float) -> Deployment:
    """The deployment of an engine run: the given layout, or the first of :func:`_layouts` keeping the serving rule.

    ``batch`` x ``context_tokens`` sizes the memory plan shown in reports; only one sequence
    of ``context_tokens`` must fit the cache. InputError ("does not fit") when none does.
    """
    if not options.get("model") or not options.get("gpu"):
        return deployment_from_options(options, batch, context_tokens)  # says which is missing
    layouts, automatic = _layouts(options)
    why = ""
    kept: list[Deployment] = []
    for tp, pp in layouts:
        if kept and pp > 1:
            break  # pipeline stages only when no single-node degree serves at all
        deployment = build_deployment(options, batch, context_tokens, tp, pp)
        shortfall = cache_shortfall(deployment, config, gpu_memory_utilization, context_tokens)
        if shortfall is None:
            if not automatic:
                return deployment
            kept.append(deployment)
            # A degree whose cache holds the whole planned batch at once is what a planner asks for
            # ("batch B at context T"): prefer the smallest such single-node degree over queueing.
            if deployment.memory.fits or pp > 1:
                break
            continue
        why = shortfall
        if not automatic:
            system = deployment.system
            layout = f"{tp}x" if pp == 1 else f"{tp}x{pp} (tp x pp)"
            raise InputError(f"{system.model.name} on {layout} {system.gpu.name} does not fit: {why}")
    if kept:
        # The smallest layout whose cache holds the whole batch, else the smallest that serves it with queueing.
        chosen = next((d for d in kept if d.memory.fits), kept[0])
        fewest = kept[0].gpus if chosen is not kept[0] else 0
        return replace(chosen, auto_tp=True, fewest_gpus=fewest)
    model, gpu = deployment.system.model, deployment.system.gpu
    tried = ", ".join(f"tp {tp}" if pp == 1 else f"tp {tp} x pp {pp}" for tp, pp in layouts)
    last_tp, last_pp = layouts[-1]
    return_layout = f"tp={last_tp}" + (f" pp={last_pp}" if last_pp > 1 else "")
    raise InputError(
        f"{model.name} does not fit on {gpu.name} at any layout tried ({tried}): at {return_layout} {why}"
    )


def queued_counts(result: EngineResult) -> tuple[int, int]:
    """(requests that waited in the queue at least one iteration, of which those that waited for KV blocks).

    A request waited when its first admission came after its arrival or when it was preempted
    (and queued again); it waited for KV when, while it was queued, the queue's head was refused
    for lack of free blocks (not for the sequence cap or the token budget).
    """
    arrival = result.workload.arrival_seconds
    with np.errstate(invalid="ignore"):
        waited = (result.first_scheduled > arrival) | (result.preemptions > 0)
    for_kv = 0 if result.waited_for_kv is None else int(np.count_nonzero(result.waited_for_kv))
    return int(np.count_nonzero(waited)), for_kv


def admission_notes(result: EngineResult, tokens_in_cache: int) -> list[str]:
    """A warning when requests waited for KV blocks: how many, how long, and why.

    Of the requests the result scores (``result.workload``: a closed loop's warm-up requests are not among them).
    """
    _, for_kv = queued_counts(result)
    if not for_kv:
        return []
    waited = result.waited_for_kv
    assert waited is not None
    workload = result.workload
    delays = (result.first_scheduled - workload.arrival_seconds)[waited]
    demand = int(np.sum(np.maximum(workload.prompt_tokens + workload.output_tokens - 1, workload.prompt_tokens)))
    preempted = int(np.count_nonzero(result.preemptions))
    return [
        f"KV cache: {for_kv:,} of {len(workload):,} requests waited for free KV blocks (mean wait "
        f"{float(np.mean(delays)):.3g} s); the cache holds {tokens_in_cache:,} tokens and the requests reach "
        f"{demand:,} in total, so they are admitted as blocks free up"
        + (f" ({preempted:,} preempted and recomputed)" if preempted else "")
    ]
