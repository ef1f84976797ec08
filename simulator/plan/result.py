"""The result of one run as the ``--json`` contract (SI units; FLOPs and bytes over all GPUs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.cost.client_path import breakdown
from simulator.cost.engine_overhead import per_sequence_seconds
from simulator.cost.kernel_tables.source import source_of
from simulator.cost.pipeline import PipelineSystem
from simulator.cost.step_cost import StepCost
from simulator.engine.metrics import REJECT_REASONS, REJECTED, STATE_NAMES
from simulator.errors import InputError
from simulator.model.parameters import model_parameters, moe_facts, parameter_counts
from simulator.model.step import Step
from simulator.plan.disaggregated_run import disaggregation_summary
from simulator.plan.engine_run import EngineRun
from simulator.plan.error_bands import error_bands_for_run
from simulator.plan.placement import queued_counts


def operator_rows(cost: StepCost, tp: int = 1) -> list[dict[str, Any]]:
    """One dict per operator: SI quantities for the whole tensor-parallel group (x tp)."""
    rows = []
    for op in cost.operators:
        rows.append(
            {
                "name": op.name,
                "kind": op.kind,
                "count": op.count,
                "flops": float(op.flops) * tp,
                "bytes": float(op.bytes) * tp,
                "weight_bytes": float(op.weight_bytes) * tp,
                "kv_read_bytes": float(op.kv_read_bytes) * tp,
                "kv_write_bytes": float(op.kv_write_bytes) * tp,
                "activation_bytes": float(op.activation_bytes) * tp,
                "link_bytes": float(op.link_bytes) * tp,
                "launches": float(op.launches),
                "intensity": float(op.intensity),
                "bound": op.bound,
                "compute_seconds": float(op.compute_seconds),
                "memory_seconds": float(op.memory_seconds),
                "link_seconds": float(op.link_seconds),
                "launch_seconds": float(op.launch_seconds),
                "host_seconds": float(op.host_seconds),
                "seconds": float(op.seconds),
            }
        )
    return rows


def _step_rows(system, step, tp: int) -> tuple[StepCost | None, list[dict[str, Any]]]:
    if step is None:
        return None, []
    cost = system.step_cost(step)
    return cost, operator_rows(cost, tp)


def kernels_dict(system: Any, costs: dict[str, StepCost | None]) -> dict[str, Any]:
    """What timed the operators (``--kernels``): the measured tables and their origin, or why the roofline did;
    per step (``costs`` by name), the share of the operators' GPU time a table measured and each kind's source."""
    source = source_of(system)
    origin = getattr(source, "origin", None)
    steps = {}
    for name, cost in costs.items():
        if cost is None:
            continue
        gpu_seconds = float(cost.gpu_seconds)
        kinds: dict[str, set[bool]] = {}
        for op in cost.operators:
            kinds.setdefault(op.kind, set()).add(bool(op.measured))
        steps[name] = {
            "measured_share": float(cost.measured_seconds) / gpu_seconds if gpu_seconds > 0 else 0.0,
            "by_kind": {kind: ("measured" if found == {True} else "partly measured" if True in found else "roofline")
                        for kind, found in kinds.items()},
        }
    return {
        "mode": source.mode if source is not None else getattr(system, "kernels", "roofline"),
        "table_file": getattr(system, "kernel_table", None),
        "source": source.describe() if source is not None else "roofline",
        "gpu": None if origin is None else origin.gpu,
        "engine": None if origin is None else origin.engine,
        "engine_version": None if origin is None else origin.version,
        "includes": None if origin is None else origin.includes,
        "note": None if source is None or not source.note else source.note,
        "steps": steps,
    }


def architecture_dict(system: Any, tokens: float) -> dict[str, Any]:
    """Parameters (total, active per token), the architecture line and MoE facts at a step of ``tokens`` tokens.

    Of the whole model: a pipeline's operators are one stage's, so its counts come from the whole model."""
    counts = model_parameters(system.model) if isinstance(system, PipelineSystem) else parameter_counts(system.operators)
    facts = moe_facts(system.model, system.operators, tokens)
    return {
        "architecture": system.model.describe_architecture(),
        "params": counts.total,
        "active_params": counts.active,
        "active_params_with_embedding": counts.active_with_embedding,
        "moe": None if facts is None else {**facts._asdict(), "routing_skew": system.routing_skew,
                                            "touched_tokens": tokens},
    }


def step_shape(step: Step | None) -> dict[str, Any] | None:
    """What a remembered step holds: ``sequences``, ``prefill_tokens`` (0 for a decode-only step) and
    ``context_tokens_per_sequence`` (keys each sequence attends, on average, its new token included); None: no step."""
    if step is None:
        return None
    sequences = float(step.sequences)
    return {"sequences": int(sequences), "prefill_tokens": int(float(step.prefill_tokens)),
            "context_tokens_per_sequence": float(step.context_tokens) / sequences if sequences else 0.0}


def planned_decode_step(run: "EngineRun") -> dict[str, Any] | None:
    """The decode step at the batch and context the deployment was planned for (the memory plan's sequences x
    context tokens), costed by the System like every engine iteration: ``sequences``,
    ``context_tokens_per_sequence``, ``seconds``; None when the plan holds no sequence."""
    memory, system = run.deployment.memory, run.deployment.system
    if memory.sequences < 1 or memory.context_tokens < 1:
        return None
    cost = system.step_cost(Step.decode(memory.sequences, memory.context_tokens))
    return {"sequences": int(memory.sequences), "context_tokens_per_sequence": float(memory.context_tokens),
            "seconds": float(cost.seconds)}


def engine_run_dict(run: "EngineRun") -> dict[str, Any]:
    """The ``--json`` contract of the main command run through the engine (SI units; FLOPs and bytes over all GPUs).

    Keeps every key of :func:`batch_run_dict`; latencies become {mean, p50, p90, p99}.
    """
    dep, result, m, opts = run.deployment, run.result, run.metrics, run.settings
    system, memory = dep.system, dep.memory
    draft = draft_bytes_per_gpu(run)
    tp = system.tp
    prefill_cost, prefill_rows = _step_rows(system, result.first_prefill_step, tp)
    first_cost, _ = _step_rows(system, result.first_decode_step, tp)
    last_cost, last_rows = _step_rows(system, result.last_decode_step, tp)
    totals = result.totals
    decode_steps = totals.decode_iterations
    cap = run.capacity
    ctx, gen = int(opts.ctx), int(opts.gen)
    workload = run.workload
    queued, queued_for_kv = queued_counts(result)
    return {
        "model": system.model.name,
        "gpu": system.gpu.name,
        "tp": tp,
        "tp_auto": dep.auto_tp and tp > 1,
        "replicas": run.settings.replicas,
        "router": run.settings.router,
        "pp": dep.pp,
        "gpus": gpus_of(run),
        "pipeline": pipeline_dict(run),
        "speculative": speculative_dict(run),
        "disaggregation": disaggregation_dict(run),
        "batch": len(workload) if workload.kind == "closed" else int(opts.batch),
        "ctx": ctx,
        "gen": gen,
        "prompt": ctx - gen,
        "attention": system.model.attention_kind,
        **architecture_dict(system, float(result.last_decode_step.tokens) if result.last_decode_step else 1.0),
        "ep": system.ep,
        "dp_attention": system.dp_attention,
        "attention_kernel": system.attention_kernel,
        "fusion": system.fusion,
        "precision": {
            "weights": system.precision.text(),
            "kv": system.precision.kv,
            "compute": system.precision.compute_dtype,
            "activations": system.precision.activation_dtype,
        },
        "efficiency": system.gpu.efficiency.model_dump(),
        "time_model": {
            "engine": system.engine.name,
            "engine_version": system.engine.version,
            "enforce_eager": system.engine.enforce_eager,
            "scheduler_steps": system.engine.scheduler_steps,
            "sampling": system.engine.sampling,
            "host_seconds_per_sequence": per_sequence_seconds(system.engine),
            "worker_rpc": (None if system.engine.worker_rpc is None or system.tp <= 1
                           else {"workers": system.tp, **system.engine.worker_rpc.model_dump()}),
            "host_loops": system.time_model.host_ranks,
            "collectives": system.collectives,
            "interconnect": system.gpu.interconnect,
            "kernel_efficiency": system.kernel_efficiency,
            "overlap": system.kernel_overlap,
        },
        "kernels": kernels_dict(system, {"prefill": prefill_cost, "decode_last": last_cost}),
        "memory": {
            "weights_bytes": memory.weights_bytes,
            "weights_bytes_per_gpu": memory.weights_bytes_per_gpu,
            "kv_bytes_per_token": memory.kv_bytes_per_token,
            "kv_bytes": memory.kv_bytes,
            "kv_bytes_per_gpu": memory.kv_bytes_per_gpu,
            "workspace_bytes_per_gpu": memory.workspace_bytes_per_gpu,
            "reserved_bytes_per_gpu": memory.reserved_bytes_per_gpu,
            "draft_bytes_per_gpu": draft,
            "needed_bytes_per_gpu": memory.needed_bytes_per_gpu + draft,
            "capacity_bytes": memory.capacity_bytes * dep.pp,
            "fits": memory.fits,
        },
        "kv_cache": {
            "block_size": cap.block_size,
            "blocks": cap.blocks,
            "tokens": cap.tokens,
            "bytes_per_block_per_gpu": cap.bytes_per_block_per_gpu,
            "bytes_per_gpu": cap.kv_bytes_per_gpu,
            "gpu_memory_utilization": cap.gpu_memory_utilization,
            "blocks_overridden": cap.overridden,
            "high_water_blocks": m.kv_high_water_blocks,
            "high_water_fraction": m.kv_high_water_fraction,
            "high_water_of_blocks": m.kv_blocks,
        },
        "workload": {
            "kind": workload.kind,
            "description": workload.description,
            "requests": len(workload),
            "qps": None if opts.qps is None else float(opts.qps),
            "arrival": opts.arrival,
            "burstiness": float(opts.burstiness),
            "trace": None if opts.trace is None else str(opts.trace),
            "trace_speedup": float(opts.trace_speedup),
            "seed": int(opts.seed),
            "prompt_tokens_mean": float(workload.prompt_tokens.mean()),
            "output_tokens_mean": float(workload.output_tokens.mean()),
            "max_concurrency": opts.max_concurrency,
            "warmup_requests": int(opts.warmup_requests),
        },
        "client_path": client_path_dict(run),
        "scheduler": {
            "name": run.config.scheduler,
            "max_num_seqs": run.config.max_num_seqs,
            "max_batched_tokens": run.config.max_batched_tokens,
            "prefix_caching": run.config.prefix_caching,
            "kv_admission": run.config.kv_admission,
        },
        "slo": {
            "ttft_seconds": None if opts.slo_ttft is None else float(opts.slo_ttft),
            "tpot_seconds": None if opts.slo_tpot is None else float(opts.slo_tpot),
            "e2e_seconds": None if opts.slo_e2e is None else float(opts.slo_e2e),
        },
        "prefill": {
            "seconds": float(prefill_cost.seconds) if prefill_cost else 0.0,
            "communication_seconds": float(prefill_cost.communication_seconds) if prefill_cost else 0.0,
            "launch_seconds": float(prefill_cost.launch_seconds) if prefill_cost else 0.0,
            "launch_wait_seconds": float(prefill_cost.launch_wait_seconds) if prefill_cost else 0.0,
            "overhead_seconds": float(prefill_cost.overhead_seconds) if prefill_cost else 0.0,
            "flops": float(prefill_cost.flops) * tp if prefill_cost else 0.0,
            "bytes": float(prefill_cost.bytes) * tp if prefill_cost else 0.0,
        },
        "decode": {
            # iterations that decoded at least one sequence, the mixed ones (prefill chunks + decodes) included
            "steps": decode_steps,
            "decode_only_steps": totals.decode_only_iterations,
            "mixed_iterations": m.mixed_iterations,
            # sequence decodes (one per decoding sequence per iteration) in all iterations and in the mixed ones
            "decode_tokens": m.decode_tokens,
            "mixed_decode_tokens": m.mixed_decode_tokens,
            # share of all sequence decodes that rode in a mixed iteration (why TPOT exceeds a decode step)
            "mixed_decode_token_share": m.mixed_decode_share,
            "mixed_iteration_seconds_mean": m.mixed_iteration_seconds,
            "decode_only_step_seconds_mean": m.decode_only_iteration_seconds,
            "planned_step": planned_decode_step(run),
            "first_step": step_shape(result.first_decode_step),
            "last_step": step_shape(result.last_decode_step),
            "first_step_seconds": float(first_cost.seconds) if first_cost else 0.0,
            "last_step_seconds": float(last_cost.seconds) if last_cost else 0.0,
            "last_step_communication_seconds": float(last_cost.communication_seconds) if last_cost else 0.0,
            "last_step_launch_seconds": float(last_cost.launch_seconds) if last_cost else 0.0,
            "last_step_launch_wait_seconds": float(last_cost.launch_wait_seconds) if last_cost else 0.0,
            "last_step_overhead_seconds": float(last_cost.overhead_seconds) if last_cost else 0.0,
            # averages over ``steps``, so a mixed iteration's prefill chunk is in them (kept for old readers);
            # the *_per_decode_only_step keys average over iterations that only decode
            "flops_per_step": totals.decode_flops / max(decode_steps, 1) * tp,
            "bytes_per_step": totals.decode_bytes / max(decode_steps, 1) * tp,
            "flops_per_decode_only_step": totals.decode_only_flops / max(totals.decode_only_iterations, 1) * tp,
            "bytes_per_decode_only_step": totals.decode_only_bytes / max(totals.decode_only_iterations, 1) * tp,
        },
        "latency": {
            "ttft_seconds": m.ttft.as_dict(),
            "tpot_seconds": m.tpot.as_dict(),
            "e2e_seconds": m.e2e.as_dict(),
            "itl_seconds": m.itl.as_dict(),
            "queue_seconds": m.queue.as_dict(),
        },
        "throughput": {
            "output_tokens_per_second": m.output_tokens_per_second,
            "total_tokens_per_second": m.total_tokens_per_second,
            "input_tokens_per_second": m.input_tokens_per_second,
            "requests_per_second": m.requests_per_second,
            "goodput_requests_per_second": m.goodput_requests_per_second,
            "slo_attainment": m.slo_attainment,
        },
        # typical out-of-sample error of each headline figure's class (validation/error_bands.json)
        "error_band": error_bands_for_run(run),
        "requests": {
            "total": m.requests,
            "completed": m.completed,
            "rejected": m.rejected,
            "rejected_reasons": m.rejected_by_reason,
            "preempted": m.preempted_requests,
            "max_running": m.max_running,
            "queued": queued,
            "queued_for_kv": queued_for_kv,
        },
        "preemptions": m.preemptions,
        "replica_summaries": replica_summaries(run),
        "prefix_cache": prefix_cache_dict(run),
        "sessions": sessions_dict(run),
        "mfu": m.mfu,
        "mbu": m.mbu,
        "time": {
            "duration_seconds": m.duration_seconds,
            "busy_seconds": m.busy_seconds,
            "iterations": m.iterations,
            "compute_bound_share": m.compute_bound_share,
            "memory_bound_share": m.memory_bound_share,
            "communication_share": m.communication_share,
            "overhead_share": m.overhead_share,
        },
        "warnings": [*system.model.warnings, *run.notes],
        "operators": {"prefill": prefill_rows, "decode_last": last_rows},
    }


def gpus_of(run: "EngineRun") -> int:
    """GPUs of the whole run: tp x pp x replicas, or both pools' GPUs when prefill and decode are disaggregated."""
    split = disaggregation_summary(run)
    return split.gpus if split is not None else run.deployment.gpus * run.settings.replicas


def _summary(summary: Any) -> dict[str, float]:
    return summary.as_dict()


def draft_bytes_per_gpu(run: "EngineRun") -> float:
    """Bytes per GPU the speculative draft holds beside the target's plan: its weights and the KV cache of the
    planned sequences (0 without speculative decoding)."""
    stats = run.result.extra.get("speculative")
    if stats is None:
        return 0.0
    memory = run.deployment.memory
    return (stats.draft_weights_bytes_per_gpu
            + stats.draft_kv_bytes_per_token_per_gpu * memory.sequences * memory.context_tokens)


def speculative_dict(run: "EngineRun") -> dict[str, Any] | None:
    """Speculative decoding (simulator.cost.speculation): the draft, tokens per iteration, memory, and what it
    bought against the same run without it; the crossover batch where it turns into a slow-down (None: none
    up to ``crossover_limit_batch``, the sequences of ctx tokens the cache holds)."""
    stats = run.result.extra.get("speculative")
    if stats is None:
        return None
    baseline = stats.baseline
    return {
        "method": stats.method,
        "draft": stats.draft,
        "num_speculative_tokens": stats.tokens,
        "acceptance": list(stats.acceptance),
        "expected_tokens_per_iteration": stats.expected_tokens_per_iteration,
        "tokens_per_iteration": stats.tokens_per_iteration,
        "draft_weights_bytes_per_gpu": stats.draft_weights_bytes_per_gpu,
        "draft_kv_bytes_per_token_per_gpu": stats.draft_kv_bytes_per_token_per_gpu,
        "kv_blocks_without_draft": stats.kv_blocks_without_draft,
        "mean_decode_batch": stats.mean_decode_batch,
        "step_speedup": stats.step_speedup,
        "step_speedup_batch_1": stats.step_speedup_batch1,
        "crossover_batch": stats.crossover_batch,
        "crossover_limit_batch": stats.crossover_limit_batch,
        "crossover_context_tokens": stats.context_tokens,
        "tpot_speedup": stats.tpot_speedup,
        "throughput_speedup": stats.throughput_speedup,
        "without": None if baseline is None else {
            "tpot_seconds": _summary(baseline.tpot),
            "ttft_seconds": _summary(baseline.ttft),
            "output_tokens_per_second": baseline.output_tokens_per_second,
            "goodput_requests_per_second": baseline.goodput_requests_per_second,
        },
    }


def disaggregation_dict(run: "EngineRun") -> dict[str, Any] | None:
    """Disaggregated prefill/decode (simulator.engine.disaggregated): each pool, the KV link, the transfers."""
    split = disaggregation_summary(run)
    if split is None:
        return None

    def pool(part: Any) -> dict[str, Any]:
        step = part.step
        return {
            "gpu": part.gpu, "tp": part.tp, "ep": part.ep, "dp_attention": part.dp_attention,
            "replicas": part.replicas, "gpus": part.gpus,
            "kv_blocks_per_replica": part.kv_blocks_per_replica, "busy_fraction": part.busy_fraction,
            "queue_seconds": _summary(part.queue_seconds), "latency_seconds": _summary(part.latency_seconds),
            "preemptions": part.preemptions, "kv_high_water_fraction": part.kv_high_water_fraction,
            "communication_share": part.communication_share,
            # A step of the pool's own kind on one of its GPUs, and the collectives its layout charges in it.
            "step": None if step is None else {
                "kind": step.kind, "tokens": step.tokens, "sequences": step.sequences, "seconds": step.seconds,
                "allreduce_seconds": step.allreduce_seconds, "alltoall_seconds": step.alltoall_seconds,
            },
        }

    link = split.link
    return {
        "ratio": split.ratio,
        "prefill": pool(split.prefill),
        "decode": pool(split.decode),
        "link": {"name": link.name, "across_nodes": link.across_nodes, "links": link.links,
                 "bytes_per_second_per_link": link.bytes_per_second, "latency_seconds": link.latency_seconds},
        "transfers": split.transfers,
        "kv_bytes_mean": split.kv_bytes_mean,
        "transfer_seconds": _summary(split.transfer_seconds),
        "link_wait_seconds": _summary(split.link_wait_seconds),
    }


def prefix_cache_dict(run: "EngineRun") -> dict[str, Any]:
    """Prefix-cache counters (simulator.engine.prefix_cache): admissions with a prefix, hits, prefill tokens saved."""
    stats = run.result.extra.get("prefix_cache")
    workload = run.workload
    shared = 0 if workload.prefix_id is None else int(np.count_nonzero(workload.prefix_id >= 0))
    return {
        "enabled": run.config.prefix_caching,
        "requests_with_prefix": shared,
        "lookups": 0 if stats is None else stats.lookups,
        "hits": 0 if stats is None else stats.hits,
        "hit_rate": 0.0 if stats is None else stats.hit_rate,
        "saved_prefill_tokens": 0 if stats is None else stats.saved_tokens,
        "evictions": 0 if stats is None else stats.evictions,
        # Hits per tier: the GPU's own cache, and an offload tier's loads (simulator.engine.kv_offload).
        "hits_by_tier": {"gpu": 0 if stats is None else stats.hits,
                         **({run.result.extra["offload"].kind: run.result.extra["offload"].hits}
                            if "offload" in run.result.extra else {})},
        "offload": run.result.extra["offload"].as_dict() if "offload" in run.result.extra else None,
    }


def sessions_dict(run: "EngineRun") -> dict[str, Any] | None:
    """Per-turn prompt tokens, cached tokens, hit rate, recomputed tokens and mean TTFT of a session workload
    (simulator.engine.sessions), or None for other workloads."""
    from simulator.engine.sessions import by_turn

    rows = by_turn(run.result)
    return {"by_turn": [row.as_dict() for row in rows]} if rows else None


def pipeline_dict(run: "EngineRun") -> dict[str, Any] | None:
    """Pipeline parallelism (simulator.cost.pipeline): stages, layers per stage, micro-batches, bubble, stage link."""
    from simulator.cost.pipeline import bubble_fraction

    dep = run.deployment
    system = dep.system
    if not isinstance(system, PipelineSystem):
        return None
    link = system.link
    micro = dep.pp  # vLLM's virtual engines: the running batch in pp micro-batches
    return {
        "stages": dep.pp,
        "layers_per_stage": system.stage.model.num_layers,
        "micro_batches": micro,
        "bubble_fraction": bubble_fraction(dep.pp, micro),
        "p2p_bytes_per_second": link.bytes_per_second,
        "p2p_latency_seconds": link.base_seconds + link.hop_seconds,
        "across_nodes": link.across_nodes,
    }


def replica_summaries(run: "EngineRun") -> list[dict[str, Any]]:
    """One entry per replica: its requests, throughput, latency and KV use (SI units)."""
    return [
        {
            "replica": index,
            "requests": m.requests,
            "completed": m.completed,
            "output_tokens_per_second": m.output_tokens_per_second,
            "ttft_seconds_p50": m.ttft.p50,
            "ttft_seconds_p99": m.ttft.p99,
            "tpot_seconds_p50": m.tpot.p50,
            "preemptions": m.preemptions,
            "kv_high_water_fraction": m.kv_high_water_fraction,
            "busy_fraction": m.busy_seconds / m.duration_seconds if m.duration_seconds > 0 else 0.0,
        }
        for index, m in enumerate(run.replica_metrics)
    ]


def client_path_dict(run: "EngineRun") -> dict[str, Any]:
    """The client path charged to each request (simulator.cost.client_path): the profile's values and the mean
    request's parts, seconds (all 0 with --client-path off)."""
    on = run.settings.client_path == "on"
    client = run.deployment.system.engine.client
    tokens = float(run.result.workload.prompt_tokens.mean()) if len(run.result.workload) else 0.0
    parts = breakdown(client, tokens) if on else dict.fromkeys(breakdown(client, tokens), 0.0)
    return {"on": on, **client.model_dump(), "prompt_tokens_mean": tokens, **parts}


def per_request_arrays(run: "EngineRun") -> dict[str, np.ndarray]:
    """One array per column, one element per request in arrival order (seconds; NaN where a request never got there).

    Columns: request, arrival_seconds, prompt_tokens, output_tokens, status (code, see
    ``simulator.engine.metrics.STATE_NAMES``), reject_reason (code, see ``REJECT_KEYS``),
    queue_seconds, ttft_seconds, tpot_seconds, e2e_seconds, finish_seconds, preemptions, replica (the
    replica that served it, -1 if rejected; see ``simulator.engine.cluster``).
    """
    result, workload = run.result, run.result.workload  # the result's: a closed loop's send times, warm-up cut
    arrival = workload.arrival_seconds
    outputs = workload.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (result.finish - result.first_token) / np.maximum(outputs - 1, 1), np.nan)
    return {
        "request": np.arange(len(workload)),
        "arrival_seconds": arrival,
        "prompt_tokens": workload.prompt_tokens,
        "output_tokens": outputs,
        "status": result.status,
        "reject_reason": result.reject_reason,
        "queue_seconds": result.first_scheduled - arrival,
        "ttft_seconds": result.first_token - arrival,
        "tpot_seconds": tpot,
        "e2e_seconds": result.finish - arrival,
        "finish_seconds": result.finish,
        "preemptions": result.preemptions,
        "replica": result.extra.get("replica", np.where(result.status == REJECTED, -1, 0)),
    }


def status_strings(arrays: dict[str, np.ndarray]) -> tuple[list[str], list[str]]:
    """The ``status`` and ``reject_reason`` columns of :func:`per_request_arrays` in words, as the per-request CSV
    writes them: a state name ("done", "rejected", ...) and the reason of a rejected request ('' for the others)."""
    rejected = arrays["status"] == REJECTED
    states = [STATE_NAMES[code] for code in arrays["status"].tolist()]
    reasons = [REJECT_REASONS[code] if gone else "" for code, gone in zip(arrays["reject_reason"].tolist(), rejected.tolist())]
    return states, reasons


class SimulationResult:
    """One simulated run, for Python callers: summaries as attributes, the JSON contract, per-request arrays.

    ``ttft``, ``tpot``, ``itl``, ``e2e``, ``queue``: latency summaries in seconds with ``mean``,
    ``p50``, ``p90``, ``p99``. ``to_dict()`` is the ``simulate --json`` object (SI units);
    ``per_request`` holds numpy arrays (see :func:`per_request_arrays`); ``to_frame()`` the
    same as a pandas DataFrame when pandas is installed. ``run`` is the underlying EngineRun.
    """

    def __init__(self, run: "EngineRun") -> None:
        self.run = run
        metrics = run.metrics
        self.ttft, self.tpot, self.itl, self.e2e, self.queue = metrics.ttft, metrics.tpot, metrics.itl, metrics.e2e, metrics.queue
        self.output_tokens_per_second = metrics.output_tokens_per_second
        self.total_tokens_per_second = metrics.total_tokens_per_second
        self.requests_per_second = metrics.requests_per_second
        self.goodput_requests_per_second = metrics.goodput_requests_per_second
        self.tp = run.deployment.system.tp
        self.memory = run.deployment.memory
        self.settings = run.settings

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` contract of this run (SI units; FLOPs and bytes over all GPUs)."""
        return engine_run_dict(self.run)

    @property
    def per_request(self) -> dict[str, np.ndarray]:
        return per_request_arrays(self.run)

    def to_frame(self) -> Any:
        """Per-request records as a pandas DataFrame (needs pandas: pip install pandas); ``status`` and
        ``reject_reason`` in words, as in the per-request CSV (``per_request`` keeps the integer codes)."""
        try:
            import pandas as pd
        except ImportError:
            raise InputError("to_frame() needs pandas, which is not installed (pip install pandas)") from None
        arrays: dict[str, Any] = self.per_request
        # The same words as the per-request CSV (--per-request), not the engine's integer codes.
        arrays["status"], arrays["reject_reason"] = status_strings(arrays)
        return pd.DataFrame(arrays)

    def __repr__(self) -> str:
        system = self.run.deployment.system
        return (
            f"SimulationResult({system.model.name} on {system.tp}x {system.gpu.name}: "
            f"TTFT p50 {self.ttft.p50:.4g} s, TPOT p50 {self.tpot.p50:.4g} s, "
            f"{self.output_tokens_per_second:.4g} output tokens/s)"
        )
