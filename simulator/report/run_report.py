"""Reports: terminal text, the JSON contract, CSV rows. SI units inside; converted here only."""

from __future__ import annotations

import csv
import math
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from simulator.cost.client_path import breakdown
from simulator.cost.collectives import collective_path
from simulator.cost.engine_overhead import per_sequence_launches, per_sequence_seconds
from simulator.cost.step_cost import OperatorCost
from simulator.engine.metrics import REJECT_KEYS, REJECT_REASONS
from simulator.files import atomic_write
from simulator.model.kernel_ceilings import END_TO_END
from simulator.plan.error_bands import band_text, error_bands_for_run
from simulator.plan.placement import queued_counts
from simulator.plan.result import (
    architecture_dict,
    draft_bytes_per_gpu,
    kernels_dict,
    per_request_arrays,
    planned_decode_step,
    status_strings,
    step_shape,
)
from simulator.report import serving_modes
from simulator.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun
    from simulator.plan.settings import RunSettings


def _table(headers: list[str], rows: list[list[str]], align_right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in align_right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def operator_table(costs: Iterable[OperatorCost], tp: int = 1, top: int | None = None,
                   overhead_seconds: float = 0.0, launch_wait_seconds: float = 0.0) -> list[str]:
    """Terminal table of operators, slowest first when ``top`` is given; each one's share of the whole step.

    ``launch``: the part of an operator's time spent launching its kernels on the GPU (a CUDA-graph
    node's or a launch's fixed cost). ``launch_wait_seconds``: the time the GPU waits for the host
    to launch the kernels outside a CUDA graph; ``overhead_seconds``: the engine's exposed host time
    per iteration. Each is shown as its own row (they are in no operator).
    """
    ops = list(costs)
    # Shares of the whole step, the rows not shown included: the top rows' shares then sum to what they take.
    total = (sum(float(o.seconds) for o in ops) + float(overhead_seconds) + float(launch_wait_seconds)) or 1.0
    if top is not None:
        ops = sorted(ops, key=lambda o: float(o.seconds), reverse=True)[:top]
    rows = [
        [
            o.name,
            f"x{o.count}",
            fmt_count(float(o.flops) * tp, "FLOP"),
            fmt_bytes(float(o.bytes) * tp),
            f"{float(o.intensity):.1f}",
            o.bound,
            fmt_seconds(float(o.seconds)),
            fmt_seconds(float(o.launch_seconds)),
            f"{100 * float(o.seconds) / total:.1f}%",
        ]
        for o in ops
    ]
    for label, seconds in (("host launch wait", launch_wait_seconds), ("engine overhead", overhead_seconds)):
        if seconds:
            rows.append([label, "", "", "", "", "host CPU", fmt_seconds(float(seconds)), "",
                         f"{100 * float(seconds) / total:.1f}%"])
    headers = ["operator", "count", "FLOPs", "HBM bytes", "FLOP/B", "bound", "time", "launch", "share"]
    return _table(headers, rows, align_right={1, 2, 3, 4, 6, 7, 8})


def time_model_lines(system: Any) -> list[str]:
    """Setup lines naming the time model beyond the roofline: engine, graphs, collectives, kernel model."""
    eff, engine = system.gpu.efficiency, system.engine
    cpu, graphs = engine.cpu, engine.graphs
    latency = ("per algorithm" if eff.allreduce_latency_seconds is None
               else f"{fmt_seconds(eff.allreduce_latency_seconds)} fixed")
    if engine.enforce_eager or graphs.max_batch <= 0:
        capture = f"no CUDA graphs ({fmt_seconds(graphs.eager_launch_seconds)} host launch/kernel)"
    else:
        kind = "all steps" if graphs.mixed else "decode steps"
        capture = (f"CUDA graphs for {kind} up to {graphs.max_batch:,} tokens, other steps launched from the host "
                   f"at {fmt_seconds(graphs.eager_launch_seconds)}/kernel")
    version = f" ({engine.version})" if engine.version else ""
    return [
        f"  efficiency   compute {eff.compute:.2f}"
        + (f" at {100 * eff.sustained_clock:.1f}% of the boost clock (sustained under GEMM load)"
           if eff.sustained_clock < 1.0 else "")
        + f", memory {eff.memory:.2f}, link {eff.link:.2f}, "
        f"launch {fmt_seconds(eff.kernel_launch_seconds)}/kernel, all-reduce latency {latency}"
        + (f"; ceilings fitted on measured {eff.fitted_on} (--ceilings kernels)" if eff.fitted_on != END_TO_END else ""),
        f"  engine       {engine.name}{version}: CPU {fmt_seconds(cpu.fixed_seconds)} + "
        f"{fmt_seconds(per_sequence_seconds(engine))}/sequence per iteration{_launches_text(engine)}, "
        f"{100 * cpu.overlap:.0f}% overlapped"
        + (f", + {fmt_seconds(engine.async_cpu.fixed_seconds)} + {fmt_seconds(engine.async_cpu.per_sequence_seconds)}"
           "/sequence run during the next iteration" if engine.async_cpu else "")
        + (f", + {system.tp} x ({fmt_seconds(engine.worker_rpc.fixed_seconds)} + "
           f"{fmt_seconds(engine.worker_rpc.per_sequence_seconds)}/sequence) to send each worker its inputs"
           if engine.worker_rpc and system.tp > 1 else "")
        + (f", paid once per {engine.scheduler_steps} decode steps (multi-step scheduling)"
           if engine.scheduler_steps > 1 else "")
        + (f"; each of the {system.tp} attention-DP ranks runs this loop for its own sequences"
           if system.dp_attention else "") + f"; {capture}" + (" per rank" if system.dp_attention else ""),
        f"  time model   collectives {system.collectives} over {_collective_path(system)}, "
        f"kernel efficiency {system.kernel_efficiency}, " + _overlap_text(system),
    ]


def _collective_path(system: Any) -> str:
    """The links the widest collective group (tp, or ep under expert parallelism) crosses: nvlink4 [+ infiniband]."""
    gpu = system.gpu
    group = max(int(getattr(system, "tp", 1)), int(getattr(system, "ep", 1) or 1))
    return collective_path(gpu.interconnect, gpu.network, group, gpu.max_gpus_per_node)


def kernel_source_lines(system: Any, prefill_cost: Any, prefill_step: Any, last_cost: Any, last_step: Any) -> list[str]:
    """What timed the operators: ``timed by     measured, H100 SXM / vLLM 0.24.0: 81% of the prefill step ...``."""
    facts = kernels_dict(system, {"prefill": prefill_cost, "decode_last": last_cost})
    if facts["engine"] is None:
        return [f"  timed by     {facts['source']}"] if facts["mode"] != "roofline" else []
    shares = []
    for name, step, what in (("prefill", prefill_step, "prefill step"), ("decode_last", last_step, "last decode step")):
        if name in facts["steps"]:
            share = facts["steps"][name]["measured_share"]
            shares.append(f"{100 * share:.0f}% of the {what}'s GPU time ({_count(int(step.sequences), 'sequence')}, "
                          f"{int(step.tokens):,} tokens)")
    kinds = sorted({kind for step in facts["steps"].values() for kind, how in step["by_kind"].items()
                    if how != "roofline"})
    rest = sorted({kind for step in facts["steps"].values() for kind, how in step["by_kind"].items()
                   if how != "measured"})
    line = (f"  timed by     {facts['source']} ({', '.join(kinds) or 'no operator'}): " + "; ".join(shares)
            + (f"; roofline for {', '.join(rest)}" if rest else ""))
    return [line] + ([f"               {facts['note']}"] if facts["note"] else [])


def _launches_text(engine: Any) -> str:
    """How many of the loop's per-sequence kernel launches the per-sequence host time includes, if any."""
    launches = per_sequence_launches(engine)
    if not launches:
        return ""
    sampled = "; the requests sample" if engine.sampling and engine.cpu.kernels_per_sampled_sequence else ""
    return (f" (including {launches:g} kernel launch{'' if launches == 1 else 'es'} from the host at "
            f"{fmt_seconds(engine.graphs.eager_launch_seconds)} each{sampled})")


def _overlap_text(system: Any) -> str:
    """How much of a kernel's shorter time (real MMAs or loads) the run hides under the longer."""
    overlap = system.kernel_overlap
    if overlap >= 1.0:
        return "loads and MMAs overlapped (max of the two)"
    if overlap <= 0.0:
        return "loads and MMAs in series (overlap 0)"
    return f"overlap {overlap:g} of the shorter of loads and MMAs"


def client_path_line(run: "EngineRun") -> str:
    """What the client path (simulator.cost.client_path) adds to each request's TTFT, by part."""
    if run.settings.client_path == "off":
        return "  client path  off (--client-path off: the bare engine; a benchmark client would measure more)"
    client = run.deployment.system.engine.client
    if client.is_zero:
        return f"  client path  0 s (the {run.deployment.system.engine.name} profile has none)"
    tokens = float(run.result.workload.prompt_tokens.mean()) if len(run.result.workload) else 0.0
    parts = breakdown(client, tokens)
    response = f", first chunk {fmt_seconds(parts['response_seconds'])}" if parts["response_seconds"] else ""
    jitter = f"; lognormal jitter, CV {client.jitter_cv:g}" if client.jitter_cv else ""
    return (f"  client path  {fmt_seconds(parts['total_seconds'])} per request (HTTP+hand-off "
            f"{fmt_seconds(parts['http_seconds'])}, tokenisation {fmt_seconds(parts['tokenize_seconds'])} for "
            f"{tokens:,.0f} tokens{response}{jitter}), in TTFT and end to end")


def _latency_row(name: str, summary) -> list[str]:
    return [name, *(fmt_seconds(v) for v in (summary.mean, summary.p50, summary.p90, summary.p99))]


def architecture_lines(system: Any, last_step: Any, last_cost: Any) -> list[str]:
    """Setup lines: attention kind, windows, experts, parameters; for MoE, the experts the last decode step touched."""
    tokens = float(last_step.tokens) if last_step is not None else 1.0
    facts = architecture_dict(system, tokens)
    lines = [f"  architecture {facts['architecture']}; {fmt_count(facts['params'])} parameters, "
             f"{fmt_count(facts['active_params'])} active per token"]
    moe = facts["moe"]
    if moe is not None:
        alltoall = sum(float(op.seconds) for op in last_cost.operators if op.kind == "alltoall") if last_cost else 0.0
        split = f"{moe['experts_per_gpu']} per GPU (--ep {moe['ep']})" if moe["ep"] > 1 else "each split over the GPUs"
        lines.append(
            f"  experts      {moe['experts']} routed, top-{moe['top_k']}, {split}; the last decode step "
            f"({int(tokens)} tokens) touches {moe['touched_per_gpu']:.1f} of {moe['experts_per_gpu']} per GPU per MoE layer"
            + (f", all-to-all {fmt_seconds(alltoall)}" if moe["ep"] > 1 and not getattr(system, "dp_attention", False) else "")
        )
    return lines


def _bands(run: "EngineRun") -> list[tuple[str, dict[str, Any]]]:
    bands = error_bands_for_run(run)
    return [("TTFT", bands["ttft"]), ("TPOT", bands["tpot"]), ("throughput", bands["throughput"])]


def engine_run_text(run: "EngineRun", top: int = 6) -> str:
    """The human report of the main command run through the engine."""
    dep, result, m, opts = run.deployment, run.result, run.metrics, run.settings
    system, memory, cap = dep.system, dep.memory, run.capacity
    draft = draft_bytes_per_gpu(run)
    gpu, model, prec = system.gpu, system.model, system.precision
    tp = system.tp
    ridge = gpu.ridge_point(prec.compute_dtype)
    config = run.config
    budget = "no token budget" if config.max_batched_tokens is None else f"{config.max_batched_tokens} tokens/iteration"
    asked = opts.max_batched_tokens
    if asked is not None and config.max_batched_tokens is not None and config.max_batched_tokens < asked:
        budget += f" (--max-batched-tokens {asked} cut to the {system.engine.name} profile's largest forward pass)"
    prefill_cost = system.step_cost(result.first_prefill_step) if result.first_prefill_step else None
    first_cost = system.step_cost(result.first_decode_step) if result.first_decode_step else None
    last_cost = system.step_cost(result.last_decode_step) if result.last_decode_step else None
    first_step = result.first_prefill_step
    _, queued_for_kv = queued_counts(result)
    lines = [
        f"memwall: {model.name} on " + (f"{opts.replicas} replicas of " if opts.replicas > 1 else "")
        + f"{dep.gpus}x {gpu.name}" + (f" (tp {tp} x pp {dep.pp})" if dep.pp > 1 else ""),
        "",
        "Setup",
        f"  model        {model.name}: {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_heads} heads, {model.num_kv_heads} KV heads ({model.attention_kind}), FFN {model.ffn_size}",
        *architecture_lines(system, result.last_decode_step, last_cost),
        f"  GPU          {gpu.name}: {fmt_count(gpu.peak(prec.compute_dtype), 'FLOP/s')} {prec.compute_dtype}"
        + (" (FP16 accumulation, as the engine's GEMMs)" if prec.compute_dtype == "fp16"
           and gpu.fp16_accumulate_flops is not None and system.engine.gemm_accumulate == "fp16" else "")
        + f", {fmt_count(gpu.hbm_bandwidth_bytes_per_second, 'B/s')} HBM, ridge {ridge:.0f} FLOP/byte",
        f"  parallelism  tensor parallel {tp}" + (f", expert parallel {system.ep}" if system.ep > 1 else "")
        + (f", attention data-parallel (each GPU: all heads, 1/{tp} of the sequences and of the KV cache)"
           if system.dp_attention else "")
        + (f"  ({dep.note})" if dep.note else ""),
        *replica_setup_lines(run),
        *serving_modes.setup_lines(run),
        f"  precision    {prec.label()}",
        f"  kernels      {system.attention_kernel} attention, fusion {system.fusion}",
        *time_model_lines(system),
        *kernel_source_lines(system, prefill_cost, result.first_prefill_step, last_cost, result.last_decode_step),
        f"  workload     {run.workload.description}",
        f"  scheduler    {config.scheduler}, at most {_count(config.max_num_seqs, 'sequence')}, {budget}"
        + ("" if config.scheduler == "static" else
           ", KV reserved for the whole request at admission (no preemption)" if config.kv_admission == "reserve"
           else ", KV blocks as sequences grow, a request admitted when every output still to come fits"
           if config.kv_admission == "fit" else ", KV blocks as sequences grow (preemption when full)"),
        *(f"  warning      {note}" for note in [*model.warnings, *run.notes]),
        "",
        "Memory per GPU" + f"  (planned for {_count(memory.sequences, 'sequence')} x {_count(memory.context_tokens, 'token')}"
        + (")" if memory.fits else "; its KV exceeds the cache: requests are admitted as blocks free up)"),
        f"  weights      {fmt_bytes(memory.weights_bytes_per_gpu)}  (model total {fmt_bytes(memory.weights_bytes)})",
        f"  KV cache     {fmt_bytes(memory.kv_bytes_per_gpu)}  ({memory.kv_bytes_per_token:,.0f} bytes/token, "
        f"total {fmt_bytes(memory.kv_bytes)})",
        f"  workspace    {fmt_bytes(memory.workspace_bytes_per_gpu)}",
        f"  runtime      {fmt_bytes(memory.reserved_bytes_per_gpu)}",
        *([f"  draft        {fmt_bytes(draft)}  (weights and the planned sequences' KV)"] if draft else []),
        f"  used         {fmt_bytes(memory.needed_bytes_per_gpu + draft)} of {fmt_bytes(memory.hbm_bytes_per_gpu)} "
        f"({100 * (memory.needed_bytes_per_gpu + draft) / memory.hbm_bytes_per_gpu:.0f}%)",
        "",
        "Paged KV cache",
        f"  capacity     {_count(cap.blocks, 'block')} of {_count(cap.block_size, 'token')} = {_count(cap.tokens, 'token')} "
        f"({fmt_bytes(cap.kv_bytes_per_gpu)} per GPU"
        + (", set by --kv-blocks)" if cap.overridden
           else f" at {cap.gpu_memory_utilization:g} of the memory left after weights, workspace and runtime, "
                f"as the engine sizes it)" if cap.of_free
           else f" at --gpu-memory-utilization {cap.gpu_memory_utilization:g})"),
        f"  high water   {_count(m.kv_high_water_blocks, 'block')}"
        + ("" if m.kv_blocks == cap.blocks else f" of the {m.kv_blocks:,} in every replica together")
        + f" ({100 * m.kv_high_water_fraction:.1f}%), {_count(m.max_running, 'sequence')} running at most",
        "",
        "Requests",
        f"  completed    {m.completed:,} of {m.requests:,} in {fmt_seconds(m.duration_seconds)} "
        f"({_count(m.iterations, 'iteration')}, busy {100 * m.busy_seconds / m.duration_seconds if m.duration_seconds else 0:.0f}%)",
        f"  rejected     {m.rejected:,}" + "".join(
            f"; {count} {REJECT_REASONS[REJECT_KEYS.index(key)]}" for key, count in m.rejected_by_reason.items() if count),
        f"  preemptions  {m.preemptions:,} ({_count(m.preempted_requests, 'request')} recomputed)",
        f"  KV waits     {_count(queued_for_kv, 'request')} queued while the KV cache had no room for them (preempted ones included)",
        *prefix_cache_lines(run),
        "",
        "Latency",
        f"  prefill      {fmt_seconds(float(prefill_cost.seconds)) if prefill_cost else '-'}  (first prefill iteration: "
        f"{_count(int(first_step.sequences) if first_step else 0, 'sequence')}, "
        f"{_count(int(first_step.prefill_tokens) if first_step else 0, 'token')})",
        *decode_step_lines(run, first_cost, last_cost),
        client_path_line(run),
        *("  " + line for line in _table(
            ["", "mean", "p50", "p90", "p99"],
            [_latency_row("TTFT", m.ttft), _latency_row("TPOT", m.tpot), _latency_row("ITL", m.itl),
             _latency_row("end to end", m.e2e), _latency_row("queueing", m.queue)],
            align_right={1, 2, 3, 4},
        )),
        *tpot_itl_lines(run),
        "",
        "Throughput",
        f"  output       {fmt_rate(m.output_tokens_per_second, 'tokens/s')}",
        f"  input        {fmt_rate(m.input_tokens_per_second, 'tokens/s')}",
        f"  total        {fmt_rate(m.total_tokens_per_second, 'tokens/s')}",
        f"  requests     {fmt_rate(m.requests_per_second, 'requests/s')}",
        f"  goodput      {fmt_rate(m.goodput_requests_per_second, 'requests/s')} " + _goodput_note(opts, m.slo_attainment),
        "",
        "Typical error (out-of-sample validation of this class, predicted vs measured; docs/readme-validation.md)",
        *(f"  {label:<12} {band_text(band)}" for label, band in _bands(run)),
        "",
        "Utilisation",
        f"  MFU          {100 * m.mfu:.1f}%   MBU {100 * m.mbu:.1f}%",
        f"  busy time    {100 * m.compute_bound_share:.0f}% compute-bound, {100 * m.memory_bound_share:.0f}% memory-bound, "
        f"{100 * m.communication_share:.0f}% communication, {100 * m.overhead_share:.0f}% host CPU "
        "(engine loop, launches outside CUDA graphs)",
    ]
    lines += replica_table(run)
    lines += serving_modes.speculative_lines(run) + serving_modes.disaggregation_lines(run)
    if last_cost is not None:
        wait = float(last_cost.launch_wait_seconds)
        waits = f"; {fmt_seconds(wait)} waiting for the host to launch them" if wait else ""
        lines += ["", f"Top operators, last decode step: {step_words(result.last_decode_step)} "
                  f"(ridge {ridge:.0f} FLOP/byte; "
                  f"kernel launches {fmt_seconds(float(last_cost.launch_seconds))} of it{waits})",
                  *("  " + line for line in operator_table(last_cost.operators, tp, top,
                                                             float(last_cost.overhead_seconds),
                                                             float(last_cost.launch_wait_seconds)))]
    if prefill_cost is not None:
        lines += ["", f"Top operators, first prefill iteration: {step_words(result.first_prefill_step)}",
                  *("  " + line for line in operator_table(prefill_cost.operators, tp, top,
                                                             float(prefill_cost.overhead_seconds),
                                                             float(prefill_cost.launch_wait_seconds)))]
    return "\n".join(lines)


def step_words(step: Any) -> str:
    """A step's batch and context in words: ``64 sequences at 4,031 tokens`` (keys each sequence attends, on
    average, its new token included), with the prefill tokens of an iteration that has any."""
    shape = step_shape(step)
    if shape is None:
        return "none"
    words = f"{_count(shape['sequences'], 'sequence')} at {round(shape['context_tokens_per_sequence']):,} tokens"
    return words + (f", {shape['prefill_tokens']:,} of them prefill tokens" if shape["prefill_tokens"] else "")


def decode_step_lines(run: "EngineRun", first_cost: Any, last_cost: Any) -> list[str]:
    """The decode step at the planned batch (costed by the System), then the first and last the run met, each
    with its batch and context: the last step of a closed batch often holds one sequence."""
    result = run.result
    planned = planned_decode_step(run)
    lines = []
    if planned is not None:
        lines.append(f"  decode step  of {_count(planned['sequences'], 'sequence')} at "
                     f"{round(planned['context_tokens_per_sequence']):,} tokens (the planned batch): "
                     f"{fmt_seconds(planned['seconds'])}")
    seen = []
    for label, step, cost in (("first decode-only step", result.first_decode_step, first_cost),
                              ("last", result.last_decode_step, last_cost)):
        if cost is not None and step is not None:
            mixed = "" if float(step.prefill_tokens) == 0 else " (with a prefill chunk: no decode-only step ran)"
            seen.append(f"{label}, {step_words(step)}{mixed}: {fmt_seconds(float(cost.seconds))}")
    if seen:
        lines.append(("  decode step  " if not lines else "               ") + "; ".join(seen))
    return lines or ["  decode step  - (no sequence decoded)"]


TPOT_LIFT_SHOWN = 0.10
"""The TPOT-vs-ITL line is printed when mixed iterations lift the mean time per decode token at least this much
(a fraction of a decode-only step)."""


def tpot_itl_lines(run: "EngineRun") -> list[str]:
    """Why TPOT sits above the decode step and ITL p50, when iterations that mixed prefill chunks with decodes
    carried part of the decode tokens and took longer than decode-only ones (chunked prefill); else nothing."""
    m = run.metrics
    if not m.mixed_decode_tokens or m.mixed_iteration_seconds <= m.decode_only_iteration_seconds:
        return []
    only_seconds = m.decode_only_iteration_seconds
    if only_seconds > 0 and m.mixed_decode_share * (m.mixed_iteration_seconds - only_seconds) < TPOT_LIFT_SHOWN * only_seconds:
        return []  # the mixed iterations lift the mean time per decode token by less than that: nothing to explain
    budget = run.config.max_batched_tokens
    chunk = f"up to {budget:,} tokens of prefill" if budget is not None else "prefill"
    only = (f" vs {fmt_seconds(m.decode_only_iteration_seconds)} decode-only"
            if m.decode_only_iteration_seconds else "")
    return [f"  TPOT vs ITL  {100 * m.mixed_decode_share:.0f}% of decode tokens rode in {m.mixed_iterations:,} mixed "
            f"iterations ({chunk} each, {run.config.scheduler} scheduler) of {fmt_seconds(m.mixed_iteration_seconds)} on "
            f"average{only}: they lift TPOT and ITL's mean and tail; ITL p50 is a typical iteration"]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _slo_text(opts: "RunSettings") -> str:
    parts = []
    if opts.slo_ttft is not None:
        parts.append(f"TTFT <= {fmt_seconds(float(opts.slo_ttft))}")
    if opts.slo_tpot is not None:
        parts.append(f"TPOT <= {fmt_seconds(float(opts.slo_tpot))}")
    if opts.slo_e2e is not None:
        parts.append(f"e2e <= {fmt_seconds(float(opts.slo_e2e))}")
    return " and ".join(parts)


def _goodput_note(opts: "RunSettings", attainment: float) -> str:
    slo = _slo_text(opts)
    if not slo:
        return "(no SLO set: every completed request counts; set --slo-ttft, --slo-tpot or --slo-e2e)"
    return f"({100 * attainment:.1f}% of requests within {slo})"


PER_REQUEST_COLUMNS = (
    "request", "arrival_seconds", "prompt_tokens", "output_tokens", "status", "reject_reason", "queue_seconds",
    "ttft_seconds", "tpot_seconds", "e2e_seconds", "finish_seconds", "preemptions", "replica",
)


def write_per_request_csv(run: "EngineRun", path: str) -> None:
    """One row per request (times in seconds; empty where the request never got there)."""
    arrays = per_request_arrays(run)
    states, reasons = status_strings(arrays)

    def cells(values: np.ndarray) -> list:
        return [v if math.isfinite(v) else "" for v in values.tolist()]  # NaN (never happened) -> empty

    columns = [
        arrays["request"].tolist(), arrays["arrival_seconds"].tolist(), arrays["prompt_tokens"].tolist(),
        arrays["output_tokens"].tolist(), states, reasons,
        *(cells(arrays[name]) for name in ("queue_seconds", "ttft_seconds", "tpot_seconds", "e2e_seconds", "finish_seconds")),
        arrays["preemptions"].tolist(), arrays["replica"].tolist(),
    ]

    def write(handle: Any) -> None:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PER_REQUEST_COLUMNS)
        writer.writerows(zip(*columns))

    atomic_write(path, write, "--per-request")  # whole or not at all: no half file after a full disk


def replica_setup_lines(run: "EngineRun") -> list[str]:
    """The pipeline and data-parallel lines of the setup (none for one stage and one replica)."""
    from simulator.cost.pipeline import PipelineSystem, bubble_fraction

    dep, replicas = run.deployment, run.settings.replicas
    lines = []
    system = dep.system
    if isinstance(system, PipelineSystem):
        link = system.link
        where = "across nodes over InfiniBand" if link.across_nodes else "within the node"
        lines.append(
            f"  pipeline     {dep.pp} stages of up to {system.stage.model.num_layers} layers, up to {dep.pp} micro-batches "
            f"per iteration (bubble {100 * bubble_fraction(dep.pp, dep.pp):.0f}%), stage to stage {where} at "
            f"{fmt_rate(link.bytes_per_second / 1e9, 'GB/s')}; {dep.gpus} GPUs per copy")
    if replicas > 1:
        gpus = dep.gpus
        lines.append(f"  replicas     {replicas} x {gpus} GPU{'s' if gpus > 1 else ''} behind a {run.settings.router} router "
                     f"= {replicas * gpus} GPUs in all (latency and throughput below are the cluster's)")
    return lines


def replica_table(run: "EngineRun") -> list[str]:
    """Per-replica requests, throughput, latency and KV use (none for one replica)."""
    if run.settings.replicas == 1:
        return []
    rows = [
        [str(index), f"{m.requests:,}", fmt_rate(m.output_tokens_per_second, "tokens/s"), fmt_seconds(m.ttft.p50),
         fmt_seconds(m.ttft.p99), fmt_seconds(m.tpot.p50), f"{m.preemptions:,}", f"{100 * m.kv_high_water_fraction:.0f}%"]
        for index, m in enumerate(run.replica_metrics)
    ]
    headers = ["replica", "requests", "output", "TTFT p50", "TTFT p99", "TPOT p50", "preempted", "KV high water"]
    return ["", "Replicas", *("  " + line for line in _table(headers, rows, align_right=set(range(1, 8))))]


def session_lines(run: "EngineRun") -> list[str]:
    """Per-turn hit rate, recomputed tokens and mean TTFT of a session workload (simulator.engine.sessions)."""
    from simulator.engine.sessions import by_turn

    rows = by_turn(run.result)
    if not rows:
        return []
    table = _table(["turn", "requests", "prompt tokens", "hit rate", "recomputed", "TTFT mean"],
                   [[str(row.turn), f"{row.requests:,}", f"{row.prompt_tokens:,}", f"{100 * row.hit_rate:.0f}%",
                     f"{row.recomputed_tokens:,}",
                     "-" if row.ttft_mean_seconds is None else fmt_seconds(row.ttft_mean_seconds)] for row in rows],
                   align_right={1, 2, 3, 4, 5})
    return ["  by turn (hit rate: prompt tokens served from a cache; recomputed: history tokens prefilled again)",
            *("    " + line for line in table)]


def prefix_cache_lines(run: "EngineRun") -> list[str]:
    """The prefix cache's hits and prefill tokens saved (a hint when prompts share a prefix and caching is off)."""
    stats = run.result.extra.get("prefix_cache")
    if stats is not None:
        lines = [f"  prefix hits  {stats.hits:,} of {stats.lookups:,} admissions with a prefix ({100 * stats.hit_rate:.0f}%), "
                 f"{stats.saved_tokens:,} prefill tokens saved, {stats.evictions:,} prefixes evicted"]
        tier = run.result.extra.get("offload")
        if tier is not None:
            lines.append(f"  {tier.kind + ' tier':<13}{tier.hits:,} hits loaded from it ({tier.loaded_blocks:,} blocks in "
                         f"{fmt_seconds(tier.load_seconds)}, {fmt_seconds(tier.exposed_seconds)} of it not hidden by "
                         f"compute), {tier.stored_blocks:,} blocks stored on eviction")
        return lines + session_lines(run)
    if run.workload.prefix_id is not None and (run.workload.prefix_id >= 0).any():
        return ["  prefix hits  off: prompts share prefixes but --prefix-caching is off (vLLM V1 and SGLang cache them by default)",
                *session_lines(run)]
    return []
