"""One planned run, the interface every kind of run builds on: settings -> :class:`Prepared` -> :class:`EngineRun`.

:func:`prepare` validates the settings, plans the deployment (tensor-parallel degree, memory plan),
sizes the paged KV cache and builds the workload; :func:`simulate_prepared` serves it through the
engine. Without ``qps`` or ``trace`` the workload is a closed batch of ``batch`` (or ``requests``)
requests at t = 0, each a prompt of ``ctx - gen`` tokens generating ``gen``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from simulator.cost.deployment import Deployment
from simulator.engine.closed_loop import closed_loop, scored, with_client_path
from simulator.engine.cluster import simulate_cluster
from simulator.engine.datasets import read_dataset, with_dataset
from simulator.engine.engine_result import EngineResult
from simulator.engine.kv_offload import offload_tier, parse_offload
from simulator.engine.kvcache import KVCapacity, kv_capacity
from simulator.engine.metrics import REJECT_KEYS, REJECT_REASONS, Aggregates, aggregate
from simulator.engine.prefix_cache import with_shared_prefix, with_trace_prefixes
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.sessions import as_sessions, is_sessions, session_workload, with_hash_prefixes
from simulator.engine.traces import MOONCAKE
from simulator.engine.workload import (
    LengthSpec,
    Workload,
    closed_batch,
    open_loop,
    parse_length_spec,
    read_trace,
    trace_workload,
)
from simulator.errors import InputError
from simulator.model.engine_profile import ClientPath, EngineProfile
from simulator.model.kernel_ceilings import END_TO_END
from simulator.plan.deployment_planner import as_ep_error, engine_from_options
from simulator.plan.placement import admission_notes, plan_serving
from simulator.plan.settings import RunSettings, parse_settings

OPEN_LOOP_REQUESTS = 1000


@dataclass(frozen=True)
class Prepared:
    """A validated run, ready for the engine: options, deployment, workload, KV cache, scheduler."""

    settings: RunSettings
    deployment: Deployment
    workload: Workload
    capacity: KVCapacity
    config: SchedulerConfig


@dataclass(frozen=True)
class EngineRun(Prepared):
    """One finished run: what was simulated and what came out."""

    result: EngineResult
    metrics: Aggregates
    replica_metrics: tuple[Aggregates, ...] = ()
    """each replica's own aggregates (one entry per replica; see simulator.engine.cluster)"""

    @property
    def notes(self) -> list[str]:
        """Warnings for the user: the settings', the workload's, then the run's (requests that waited for KV blocks)."""
        model = self.deployment.system.model
        unused = ([f"--expert-efficiency has no effect: {model.name} has no routed experts"]
                  if self.settings.expert_efficiency is not None and not model.is_moe else [])
        if self.settings.kernel_overlap is not None and not self.deployment.system.time_model.shape:
            unused.append("--kernel-overlap has no effect under --kernel-efficiency flat (the roofline's max)")
        if self.settings.ceilings != END_TO_END:
            unused.append("--ceilings kernels: ceilings fitted on measured GEMM kernels; the error bands are those of the "
                          "default ceilings, and with these the validation table comes out 16-25% too fast in every "
                          "regime (docs/measured-vs-roofline.md)")
        return [*unused, *self.workload.notes, *self._longer_than_planned(),
                *admission_notes(self.result, self.capacity.tokens), *nothing_completed_notes(self.metrics, model.max_context)]

    def _longer_than_planned(self) -> list[str]:
        """A warning when --prompt-tokens/--output-tokens make requests longer than --ctx, which sizes the plan."""
        settings, workload = self.settings, self.result.workload
        if (settings.prompt_tokens is None and settings.output_tokens is None) or not len(workload):
            return []
        longest = int(np.max(workload.prompt_tokens + workload.output_tokens))
        if longest <= settings.ctx:
            return []
        return [f"--ctx {settings.ctx:,} sizes the deployment (tensor-parallel degree, memory plan) for sequences of "
                f"that many tokens, but --prompt-tokens/--output-tokens make requests of up to {longest:,}: the plan "
                f"and the planned decode step understate them; give --ctx {longest} (or leave --ctx and --gen out "
                "with fixed lengths)"]


def nothing_completed_notes(metrics: Aggregates, max_context_tokens: int) -> list[str]:
    """A warning when no request completed: the latencies and rates are then zeros, which measure nothing."""
    if metrics.completed or not metrics.rejected:
        return []
    why = "; ".join(f"{count:,} {REJECT_REASONS[REJECT_KEYS.index(key)]}"
                    + (f" of {max_context_tokens:,} tokens" if key == "max_context" else "")
                    for key, count in metrics.rejected_by_reason.items() if count)
    return [f"no request completed: all {metrics.rejected:,} were rejected ({why}); the latencies, throughput and "
            "utilisation reported are zeros, not measurements"]


def _lengths(settings: RunSettings) -> tuple[LengthSpec | None, LengthSpec | None]:
    prompt = None if settings.prompt_tokens is None else parse_length_spec(settings.prompt_tokens, "--prompt-tokens")
    output = None if settings.output_tokens is None else parse_length_spec(settings.output_tokens, "--output-tokens")
    return prompt, output


def build_workload(settings: RunSettings, max_tokens: int) -> Workload:
    """The workload the settings name (see :class:`RunSettings` for the rules)."""
    if settings.dataset is not None:  # arrivals (or clients) as without it, then lengths drawn in pairs from the file
        keep_outputs = settings.output_tokens is not None
        return with_dataset(build_workload(settings.model_copy(update={"dataset": None}), max_tokens),
                            read_dataset(settings.dataset, keep_outputs), settings.seed, max_tokens, keep_outputs)
    prompt, output = _lengths(settings)
    seed = settings.seed
    if settings.sessions is not None:
        return _sessions(settings, output)
    if settings.trace is not None:
        trace = with_hash_prefixes(with_trace_prefixes(read_trace(settings.trace)))
        if settings.max_concurrency is not None:  # the trace's requests, in order, sent by a closed loop
            return closed_loop(settings.max_concurrency, settings.requests or len(trace.arrival_seconds),
                               settings.warmup_requests, prompt or trace.prompt_tokens, output or trace.output_tokens,
                               seed, max_tokens)
        if settings.qps is None:
            replay = trace_workload(trace, settings.trace_speedup, prompt, output, seed, max_tokens,
                                    settings.trace_start, settings.trace_duration, settings.requests)
            # A Mooncake trace's conversations: each turn's blocks stay cached for the next (simulator.engine.sessions).
            return as_sessions(replay) if trace.format == MOONCAKE else replay
        n = settings.requests or len(trace.arrival_seconds)
        workload = open_loop(
            n, settings.qps, prompt or trace.prompt_tokens, output or trace.output_tokens,
            settings.arrival, settings.burstiness, seed, max_tokens,
        )
        # The trace's own notes (rows skipped as failed requests) still describe the lengths drawn from it.
        return replace(workload, notes=(*trace.notes, *workload.notes))
    prompt = prompt or LengthSpec("fixed", settings.ctx - settings.gen)
    output = output or LengthSpec("fixed", settings.gen)
    if settings.max_concurrency is not None:
        return closed_loop(settings.max_concurrency, settings.requests or OPEN_LOOP_REQUESTS, settings.warmup_requests,
                           prompt, output, seed, max_tokens)
    if settings.qps is None:
        return closed_batch(settings.closed_batch_size, prompt, output, seed, max_tokens)
    n = settings.requests or OPEN_LOOP_REQUESTS
    return open_loop(n, settings.qps, prompt, output, settings.arrival, settings.burstiness, seed, max_tokens)


def _sessions(settings: RunSettings, output: LengthSpec | None) -> Workload:
    """The session workload of ``--sessions`` (simulator.engine.sessions): fixed new tokens and output per turn."""
    if output is not None and output.kind != "fixed":
        raise InputError(f"--output-tokens: a session workload takes a fixed output per turn (got {settings.output_tokens})")
    turn_tokens = settings.turn_tokens if settings.turn_tokens is not None else settings.ctx - settings.gen
    answer = settings.gen if output is None else int(output.a)
    assert settings.sessions is not None
    return session_workload(settings.sessions, settings.turns, settings.think_time, turn_tokens, answer)


def as_settings(settings: RunSettings | dict[str, Any]) -> RunSettings:
    """``settings`` itself, or the RunSettings a dict of field names (or vLLM aliases) describes."""
    if isinstance(settings, RunSettings):
        return settings
    return parse_settings(RunSettings, dict(settings))


def scheduler_config(settings: RunSettings, profile: EngineProfile) -> SchedulerConfig:
    """The run's scheduler: what the settings give, else the engine profile's defaults.

    The profile's token budget applies only to the profile's own scheduler kind, so
    ``--scheduler continuous`` under the vLLM profile runs without a budget (vLLM V0 style). A
    profile's ``pass_tokens`` (the most one forward pass carries) caps the budget of static, chunked
    and prefill-first runs, so a static batch prefills in passes of that many tokens.
    """
    defaults = profile.scheduler
    kind = settings.scheduler or defaults.kind
    budget = settings.max_batched_tokens
    if budget is None and kind == defaults.kind:
        budget = defaults.max_batched_tokens
    passes = defaults.pass_tokens
    if passes is not None and kind in ("static", "chunked", "prefill-first"):
        # One forward pass carries at most this many tokens (llama.cpp's n_ubatch): a larger batch is several passes.
        budget = passes if budget is None else min(budget, passes)
        seqs = settings.max_num_seqs or defaults.max_num_seqs
        if kind == "chunked" and seqs > passes:
            raise InputError(
                f"--max-num-seqs {seqs}: the {profile.name} profile's forward pass carries at most {passes} tokens "
                f"(scheduler.pass_tokens), and with --scheduler chunked every running decode takes one of them; give "
                f"--max-num-seqs {passes} or less, or --scheduler static")
    if (kind == "chunked" and settings.max_num_seqs is None and settings.max_batched_tokens is not None
            and settings.max_batched_tokens < defaults.max_num_seqs):
        raise InputError(
            f"--max-batched-tokens {settings.max_batched_tokens} is below the {profile.name} profile's default "
            f"--max-num-seqs {defaults.max_num_seqs} on this GPU: every running decode needs a token of the budget; "
            f"give --max-num-seqs {settings.max_batched_tokens} or less, or a larger budget")
    return SchedulerConfig(
        scheduler=kind,
        max_num_seqs=settings.max_num_seqs or defaults.max_num_seqs,
        max_batched_tokens=budget,
        block_size=settings.block_size or defaults.block_size,
        prefix_caching=settings.prefix_caching,
        prefix_cache_warm=settings.prefix_cache_warm,
        kv_admission=settings.kv_admission or defaults.kv_admission,
    )


def prepare(settings: RunSettings | dict[str, Any]) -> Prepared:
    """Plan the deployment, size the KV cache, build the workload; InputError on any problem."""
    settings = as_settings(settings)
    config = scheduler_config(settings, engine_from_options(settings.model_dump()))
    planned_batch = settings.closed_batch_size if settings.qps is None and settings.trace is None else settings.batch
    if settings.max_concurrency is not None:
        planned_batch = settings.max_concurrency  # the clients keep this many requests in flight
    if settings.sessions is not None:
        planned_batch = settings.sessions  # at most one turn of each session is in flight
    # No more than max_num_seqs sequences ever run at once, so no more are planned to fit at once.
    planned_batch = min(planned_batch, config.max_num_seqs)
    # Only the weights and one ctx-token sequence must fit; the paged cache queues the rest (plan/placement.py).
    try:
        deployment = plan_serving(settings.model_dump(), planned_batch, settings.ctx, config,
                                  settings.gpu_memory_utilization)
    except InputError as exc:  # a pool names its own flags (disaggregated_run.in_pool_words); a plain run, --ep
        implied = settings.tp is None and (settings.ep or 1) > 1
        raise (as_ep_error(exc, settings.ep or 1) if implied else exc) from None
    capacity = kv_capacity(
        deployment, config.block_size, settings.gpu_memory_utilization, config.max_batched_tokens,
        config.max_num_seqs, settings.kv_blocks,
    )
    if 0 < capacity.state_sequences < config.max_num_seqs:
        # A linear-attention model runs no more sequences than its state pool holds (engine/kvcache.py).
        config = replace(config, max_num_seqs=capacity.state_sequences)
    workload = build_workload(settings, deployment.system.model.max_context)
    if settings.shared_prefix_tokens is not None:
        workload = with_shared_prefix(workload, settings.shared_prefix_tokens, settings.shared_prefix_ratio, settings.seed)
    _check_some_request_fits(workload, capacity, deployment)
    # What a benchmark client measures beyond the engine (simulator.cost.client_path), unless asked for the bare engine.
    client = deployment.system.engine.client if settings.client_path == "on" else ClientPath()
    workload = with_client_path(workload, client, settings.seed)
    return Prepared(settings, deployment, workload, capacity, config)


def _check_some_request_fits(workload: Workload, capacity: KVCapacity, deployment: Deployment) -> None:
    """A run where no request can ever fit the KV cache does not fit (single oversized requests are only rejected)."""
    tokens = np.maximum(workload.prompt_tokens + workload.output_tokens - 1, workload.prompt_tokens)
    smallest = int(tokens.min())
    if -(-smallest // capacity.block_size) > capacity.blocks:
        system = deployment.system
        raise InputError(
            f"{system.model.name} on {system.tp}x {system.gpu.name} does not fit: every request needs more KV cache "
            f"than the {capacity.blocks} blocks of {capacity.block_size} tokens available (the smallest needs "
            f"{smallest} tokens); raise --tp or --gpu-memory-utilization, or shorten the requests"
        )


def fit_error(settings: RunSettings | dict[str, Any]) -> str | None:
    """Why the settings cannot run (the InputError message: bad input or does not fit), or None; simulates nothing."""
    try:
        prepare(settings)
    except InputError as exc:
        return str(exc)
    return None


def simulate_prepared(prep: Prepared, progress: Callable[[int, int], None] | None = None,
                      records: Path | str | None = None) -> EngineRun:
    """Serve ``prep``'s workload on its replicas (no speculation, no disaggregation) and aggregate the run.

    Speculative and disaggregated runs (:mod:`simulator.plan.speculative_run`,
    :mod:`simulator.plan.disaggregated_run`) build on :func:`prepare` and :class:`EngineRun` the same way.
    """
    system = prep.deployment.system
    replicas = prep.settings.replicas
    spec = None if prep.settings.kv_offload is None else parse_offload(prep.settings.kv_offload)
    capacity = prep.capacity
    offload = None if spec is None else (
        lambda: offload_tier(spec, system.gpu, capacity.bytes_per_block_per_gpu, system.tp))
    result = simulate_cluster(system, prep.workload, prep.config, prep.capacity.blocks, replicas,
                              prep.settings.router, progress, records=records, offload=offload,
                              router_staleness=prep.settings.router_staleness)
    result = scored(result)  # a closed loop's warm-up requests are not scored
    slo = (prep.settings.slo_ttft, prep.settings.slo_tpot, prep.settings.slo_e2e)
    peak, bandwidth = system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second
    # The merged result's FLOPs and bytes are sums over replicas: utilisation is per GPU over all of them.
    metrics = aggregate(result, system.tp, peak * replicas, bandwidth * replicas, *slo)
    parts = result.extra["replicas"]
    # One replica's result is the run's own, aggregated just above with the same arguments.
    per_replica = (metrics,) if len(parts) == 1 and parts[0] is result else tuple(
        aggregate(part, system.tp, peak, bandwidth, *slo) for part in parts)
    # Sessions: the run chose when later turns were sent; the run's workload carries those send times.
    workload = result.workload if is_sessions(prep.workload) else prep.workload
    return EngineRun(prep.settings, prep.deployment, workload, prep.capacity, prep.config, result, metrics,
                     per_replica)
