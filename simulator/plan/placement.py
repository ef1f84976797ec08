"""Where a served model goes: the tensor-parallel degree an engine run uses, by the serving fit rule.

A serving engine does not need the KV cache of every request at once: its paged cache admits
what fits and queues the rest (vLLM, SGLang, TensorRT-LLM all do). What must fit is the engine
itself: vLLM refuses to start when its KV cache cannot hold one sequence of ``max_model_len``
tokens ("The model's max seq len (...) is larger than the maximum number of tokens that can be
stored in KV cache", vllm/v1/core/kv_cache_utils.py ``check_enough_kv_cache_memory``). So the
rule, per GPU:

    weights + activation workspace + runtime reserve + KV of one ``ctx``-token sequence
        <= gpu_memory_utilization x HBM

(the same budget as :func:`simulator.engine.kvcache.kv_capacity`, one formula). With ``tp``
given, a deployment that breaks the rule is an InputError ("does not fit"); without it, the
smallest power-of-two degree that keeps it is chosen (``tensor_parallel_candidates``). A batch
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
from simulator.cost.memory import GIB, tensor_parallel_candidates
from simulator.engine.kvcache import blocks_for, kv_capacity
from simulator.engine.scheduler import SchedulerConfig
from simulator.errors import InputError
from simulator.model.architecture import load_model, with_attention
from simulator.model.gpu import load_gpu
from simulator.plan.deployment import deployment_from_options

if TYPE_CHECKING:
    from simulator.engine.engine import EngineResult
    from simulator.engine.workload import Workload


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


def plan_serving(options: dict[str, Any], batch: int, context_tokens: int, config: SchedulerConfig,
                 gpu_memory_utilization: float) -> Deployment:
    """The deployment of an engine run: ``options['tp']`` or the smallest degree keeping the serving rule.

    ``batch`` x ``context_tokens`` sizes the memory plan shown in reports; only one sequence
    of ``context_tokens`` must fit the cache. InputError ("does not fit") when none does.
    """
    tp = options.get("tp")
    if tp is not None:
        deployment = deployment_from_options(options, batch, context_tokens, require_fit=False)
        why = cache_shortfall(deployment, config, gpu_memory_utilization, context_tokens)
        if why is not None:
            raise InputError(f"{deployment.system.model.name} on {tp}x {deployment.system.gpu.name} does not fit: {why}")
        return deployment
    if not options.get("model") or not options.get("gpu"):
        return deployment_from_options(options, batch, context_tokens)  # says which is missing
    model = with_attention(load_model(options["model"]), options.get("attention"))
    gpu = load_gpu(options["gpu"])
    ep = options.get("ep") or 1
    candidates = [ep] if ep > 1 else tensor_parallel_candidates(model, gpu, ep)
    why = ""
    for degree in candidates:
        deployment = deployment_from_options({**options, "tp": degree}, batch, context_tokens, require_fit=False)
        shortfall = cache_shortfall(deployment, config, gpu_memory_utilization, context_tokens)
        if shortfall is None:
            return replace(deployment, auto_tp=True)
        why = shortfall
    raise InputError(
        f"{model.name} does not fit on {gpu.name} at any tensor-parallel degree tried "
        f"({', '.join(map(str, candidates))}): at tp={candidates[-1] if candidates else 1} {why}"
    )


def queued_counts(result: "EngineResult") -> tuple[int, int]:
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


def admission_notes(result: "EngineResult", workload: "Workload", tokens_in_cache: int) -> list[str]:
    """A warning when requests waited for KV blocks: how many, how long, and why."""
    _, for_kv = queued_counts(result)
    if not for_kv:
        return []
    waited = result.waited_for_kv
    assert waited is not None
    delays = (result.first_scheduled - workload.arrival_seconds)[waited]
    demand = int(np.sum(np.maximum(workload.prompt_tokens + workload.output_tokens - 1, workload.prompt_tokens)))
    preempted = int(np.count_nonzero(result.preemptions))
    return [
        f"KV cache: {for_kv:,} of {len(workload):,} requests waited for free KV blocks (mean wait "
        f"{float(np.mean(delays)):.3g} s); the cache holds {tokens_in_cache:,} tokens and the requests reach "
        f"{demand:,} in total, so they are admitted as blocks free up"
        + (f" ({preempted:,} preempted and recomputed)" if preempted else "")
    ]
