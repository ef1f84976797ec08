"""Run one simulation from a flat dict of options: the API behind the CLI and sweeps.

Keys are the main command's option names with underscores (``model``, ``gpu``, ``batch``,
``ctx``, ``gen``, ``weights``, ``kv``, ``tp``, ``qps``, ``requests``, ``scheduler``,
``slo_ttft``, ...; see :data:`ENGINE_DEFAULTS` and docs/readme-engine.md); the result is
the ``--json`` dict. Missing keys take the CLI defaults; unknown keys are an InputError.

Without ``qps`` or ``trace`` the workload is a closed batch: ``requests`` (default
``batch``) requests at t = 0, each a prompt of ``ctx - gen`` tokens generating ``gen``.
The deployment (tensor-parallel degree, memory plan) is planned for ``batch`` sequences
of ``ctx`` tokens, as the analytic core does; the KV cache then holds what memory allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from simulator.cost.deployment import Deployment, check_gen_tokens
from simulator.engine.engine import EngineResult, simulate
from simulator.engine.kvcache import KVCapacity, kv_capacity
from simulator.engine.metrics import Aggregates, aggregate
from simulator.engine.scheduler import DEFAULT_MAX_NUM_SEQS, SchedulerConfig
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
from simulator.plan.deployment import DEPLOYMENT_KEYS, deployment_from_options

DEFAULTS: dict[str, Any] = {"batch": 1, "ctx": 2048, "gen": 128}

ENGINE_DEFAULTS: dict[str, Any] = {
    "requests": None,  # open loop: 1000; closed batch: batch
    "qps": None,
    "arrival": "poisson",
    "burstiness": 1.0,
    "trace": None,
    "trace_speedup": 1.0,
    "prompt_tokens": None,  # ctx - gen
    "output_tokens": None,  # gen
    "scheduler": "continuous",
    "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
    "max_batched_tokens": None,  # chunked: 2048; continuous: no budget
    "block_size": 16,
    "gpu_memory_utilization": 0.9,
    "kv_blocks": None,
    "slo_ttft": None,
    "slo_tpot": None,
    "seed": 0,
}

OPEN_LOOP_REQUESTS = 1000

# Keys the CLI passes that do not change the simulation.
PRESENTATION_KEYS = ("per_request", "quiet", "top", "as_json", "as_csv")


@dataclass(frozen=True)
class Prepared:
    """A validated run, ready for the engine: options, deployment, workload, KV cache, scheduler."""

    options: dict[str, Any]
    deployment: Deployment
    workload: Workload
    capacity: KVCapacity
    config: SchedulerConfig


@dataclass(frozen=True)
class EngineRun(Prepared):
    """One finished run: what was simulated and what came out."""

    result: EngineResult
    metrics: Aggregates


def _merged(options: dict[str, Any]) -> dict[str, Any]:
    known = set(DEFAULTS) | set(ENGINE_DEFAULTS) | set(DEPLOYMENT_KEYS) | set(PRESENTATION_KEYS)
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    merged = {**DEFAULTS, **ENGINE_DEFAULTS}
    merged.update({key: value for key, value in options.items() if value is not None})
    return merged


def _lengths(opts: dict[str, Any]) -> tuple[LengthSpec | None, LengthSpec | None]:
    prompt = None if opts["prompt_tokens"] is None else parse_length_spec(opts["prompt_tokens"], "--prompt-tokens")
    output = None if opts["output_tokens"] is None else parse_length_spec(opts["output_tokens"], "--output-tokens")
    return prompt, output


def _default_lengths(opts: dict[str, Any]) -> tuple[LengthSpec, LengthSpec]:
    ctx, gen = int(opts["ctx"]), int(opts["gen"])
    check_gen_tokens(gen, ctx)
    return LengthSpec("fixed", ctx - gen), LengthSpec("fixed", gen)


def build_workload(opts: dict[str, Any], max_tokens: int) -> Workload:
    """The workload named by merged options (see module docstring)."""
    prompt, output = _lengths(opts)
    seed = int(opts["seed"])
    if opts["requests"] is not None and int(opts["requests"]) < 1:
        raise InputError(f"--requests: must be >= 1 (got {opts['requests']})")
    if opts["trace"] is not None:
        trace = read_trace(opts["trace"])
        if opts["qps"] is None:
            return trace_workload(trace, float(opts["trace_speedup"]), prompt, output, seed, max_tokens)
        n = int(opts["requests"] or len(trace.arrival_seconds))
        return open_loop(
            n, float(opts["qps"]), prompt or trace.prompt_tokens, output or trace.output_tokens,
            opts["arrival"], float(opts["burstiness"]), seed, max_tokens,
        )
    if prompt is None or output is None:
        default_prompt, default_output = _default_lengths(opts)
        prompt, output = prompt or default_prompt, output or default_output
    if opts["qps"] is None:
        n = int(opts["requests"] or opts["batch"])
        return closed_batch(n, prompt, output, seed, max_tokens)
    n = int(opts["requests"] or OPEN_LOOP_REQUESTS)
    return open_loop(n, float(opts["qps"]), prompt, output, opts["arrival"], float(opts["burstiness"]), seed, max_tokens)


def prepare(options: dict[str, Any]) -> Prepared:
    """Validate options, plan the deployment, size the KV cache, build the workload; InputError on any problem."""
    opts = _merged(options)
    batch, ctx = int(opts["batch"]), int(opts["ctx"])
    deployment = deployment_from_options(opts, batch, ctx)
    config = SchedulerConfig(
        scheduler=str(opts["scheduler"]),
        max_num_seqs=int(opts["max_num_seqs"]),
        max_batched_tokens=None if opts["max_batched_tokens"] is None else int(opts["max_batched_tokens"]),
        block_size=int(opts["block_size"]),
    )
    capacity = kv_capacity(
        deployment, config.block_size, float(opts["gpu_memory_utilization"]), config.max_batched_tokens,
        config.max_num_seqs, None if opts["kv_blocks"] is None else int(opts["kv_blocks"]),
    )
    for key, option in (("slo_ttft", "--slo-ttft"), ("slo_tpot", "--slo-tpot")):
        if opts[key] is not None and not float(opts[key]) > 0:
            raise InputError(f"{option}: must be > 0 seconds (got {opts[key]})")
    workload = build_workload(opts, deployment.system.model.max_context)
    _check_some_request_fits(workload, capacity, deployment)
    return Prepared(opts, deployment, workload, capacity, config)


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


def fit_error(options: dict[str, Any]) -> str | None:
    """Why ``options`` cannot run (the InputError message: bad input or does not fit), or None; simulates nothing."""
    try:
        prepare(options)
    except InputError as exc:
        return str(exc)
    return None


def simulate_from_options(options: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> EngineRun:
    """Prepare and run the engine; ``progress(finished, total requests)`` is called now and then."""
    prep = prepare(options)
    system = prep.deployment.system
    result = simulate(system, prep.workload, prep.config, prep.capacity.blocks, progress)
    metrics = aggregate(
        result, system.tp, system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second,
        None if prep.options["slo_ttft"] is None else float(prep.options["slo_ttft"]),
        None if prep.options["slo_tpot"] is None else float(prep.options["slo_tpot"]),
    )
    return EngineRun(prep.options, prep.deployment, prep.workload, prep.capacity, prep.config, result, metrics)


def run_from_options(options: dict[str, Any]) -> dict[str, Any]:
    """Simulate with ``options`` (missing ones take the CLI defaults); InputError on bad input or no fit."""
    from simulator.plan.result import engine_run_dict

    return engine_run_dict(simulate_from_options(options))
