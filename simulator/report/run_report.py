"""Reports: terminal text, the JSON contract, CSV rows. SI units inside; converted here only."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from simulator.cost.step_cost import OperatorCost, StepCost
from simulator.engine.metrics import REJECT_KEYS, REJECT_REASONS, REJECTED, STATE_NAMES
from simulator.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds

if TYPE_CHECKING:
    from simulator.plan.run import EngineRun


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
                "seconds": float(op.seconds),
            }
        )
    return rows


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {'a.b': value}; lists are left out (CSV holds scalars)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif not isinstance(value, list):
            flat[name] = value
    return flat


def to_csv(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _table(headers: list[str], rows: list[list[str]], align_right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in align_right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def operator_table(costs: Iterable[OperatorCost], tp: int = 1, top: int | None = None) -> list[str]:
    """Terminal table of operators, slowest first when ``top`` is given."""
    ops = list(costs)
    if top is not None:
        ops = sorted(ops, key=lambda o: float(o.seconds), reverse=True)[:top]
    total = sum(float(o.seconds) for o in ops) or 1.0
    rows = [
        [
            o.name,
            f"x{o.count}",
            fmt_count(float(o.flops) * tp, "FLOP"),
            fmt_bytes(float(o.bytes) * tp),
            f"{float(o.intensity):.1f}",
            o.bound,
            fmt_seconds(float(o.seconds)),
            f"{100 * float(o.seconds) / total:.1f}%",
        ]
        for o in ops
    ]
    headers = ["operator", "count", "FLOPs", "HBM bytes", "FLOP/B", "bound", "time", "share"]
    return _table(headers, rows, align_right={1, 2, 3, 4, 6, 7})


def _step_rows(system, step, tp: int) -> tuple[StepCost | None, list[dict[str, Any]]]:
    if step is None:
        return None, []
    cost = system.step_cost(step)
    return cost, operator_rows(cost, tp)


def engine_run_dict(run: "EngineRun") -> dict[str, Any]:
    """The ``--json`` contract of the main command run through the engine (SI units; FLOPs and bytes over all GPUs).

    Keeps every key of :func:`batch_run_dict`; latencies become {mean, p50, p90, p99}.
    """
    dep, result, m, opts = run.deployment, run.result, run.metrics, run.options
    system, memory = dep.system, dep.memory
    tp = system.tp
    prefill_cost, prefill_rows = _step_rows(system, result.first_prefill_step, tp)
    first_cost, _ = _step_rows(system, result.first_decode_step, tp)
    last_cost, last_rows = _step_rows(system, result.last_decode_step, tp)
    totals = result.totals
    decode_steps = totals.decode_iterations
    cap = run.capacity
    ctx, gen = int(opts["ctx"]), int(opts["gen"])
    workload = run.workload
    return {
        "model": system.model.name,
        "gpu": system.gpu.name,
        "tp": tp,
        "tp_auto": dep.auto_tp and tp > 1,
        "batch": len(workload) if workload.kind == "closed" else int(opts["batch"]),
        "ctx": ctx,
        "gen": gen,
        "prompt": ctx - gen,
        "attention": system.model.attention_kind,
        "attention_kernel": system.attention_kernel,
        "fusion": system.fusion,
        "precision": {
            "weights": system.precision.weights,
            "kv": system.precision.kv,
            "compute": system.precision.compute_dtype,
            "activations": system.precision.activation_dtype,
        },
        "efficiency": system.gpu.efficiency.model_dump(),
        "memory": {
            "weights_bytes": memory.weights_bytes,
            "weights_bytes_per_gpu": memory.weights_bytes_per_gpu,
            "kv_bytes_per_token": memory.kv_bytes_per_token,
            "kv_bytes": memory.kv_bytes,
            "kv_bytes_per_gpu": memory.kv_bytes_per_gpu,
            "workspace_bytes_per_gpu": memory.workspace_bytes_per_gpu,
            "reserved_bytes_per_gpu": memory.reserved_bytes_per_gpu,
            "needed_bytes_per_gpu": memory.needed_bytes_per_gpu,
            "capacity_bytes": memory.capacity_bytes,
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
        },
        "workload": {
            "kind": workload.kind,
            "description": workload.description,
            "requests": len(workload),
            "qps": None if opts["qps"] is None else float(opts["qps"]),
            "arrival": opts["arrival"],
            "burstiness": float(opts["burstiness"]),
            "trace": None if opts["trace"] is None else str(opts["trace"]),
            "trace_speedup": float(opts["trace_speedup"]),
            "seed": int(opts["seed"]),
            "prompt_tokens_mean": float(workload.prompt_tokens.mean()),
            "output_tokens_mean": float(workload.output_tokens.mean()),
        },
        "scheduler": {
            "name": run.config.scheduler,
            "max_num_seqs": run.config.max_num_seqs,
            "max_batched_tokens": run.config.max_batched_tokens,
        },
        "slo": {
            "ttft_seconds": None if opts["slo_ttft"] is None else float(opts["slo_ttft"]),
            "tpot_seconds": None if opts["slo_tpot"] is None else float(opts["slo_tpot"]),
        },
        "prefill": {
            "seconds": float(prefill_cost.seconds) if prefill_cost else 0.0,
            "flops": float(prefill_cost.flops) * tp if prefill_cost else 0.0,
            "bytes": float(prefill_cost.bytes) * tp if prefill_cost else 0.0,
        },
        "decode": {
            "steps": decode_steps,
            "first_step_seconds": float(first_cost.seconds) if first_cost else 0.0,
            "last_step_seconds": float(last_cost.seconds) if last_cost else 0.0,
            "flops_per_step": totals.decode_flops / max(decode_steps, 1) * tp,
            "bytes_per_step": totals.decode_bytes / max(decode_steps, 1) * tp,
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
        "requests": {
            "total": m.requests,
            "completed": m.completed,
            "rejected": m.rejected,
            "rejected_reasons": m.rejected_by_reason,
            "preempted": m.preempted_requests,
            "max_running": m.max_running,
        },
        "preemptions": m.preemptions,
        "mfu": m.mfu,
        "mbu": m.mbu,
        "time": {
            "duration_seconds": m.duration_seconds,
            "busy_seconds": m.busy_seconds,
            "iterations": m.iterations,
            "compute_bound_share": m.compute_bound_share,
            "memory_bound_share": m.memory_bound_share,
            "communication_share": m.communication_share,
        },
        "warnings": list(workload.notes),
        "operators": {"prefill": prefill_rows, "decode_last": last_rows},
    }


def _latency_row(name: str, summary) -> list[str]:
    return [name, *(fmt_seconds(v) for v in (summary.mean, summary.p50, summary.p90, summary.p99))]


def engine_run_text(run: "EngineRun", top: int = 6) -> str:
    """The human report of the main command run through the engine."""
    dep, result, m, opts = run.deployment, run.result, run.metrics, run.options
    system, memory, cap = dep.system, dep.memory, run.capacity
    gpu, model, prec = system.gpu, system.model, system.precision
    eff = gpu.efficiency
    tp = system.tp
    ridge = gpu.ridge_point(prec.compute_dtype)
    config = run.config
    budget = "no token budget" if config.max_batched_tokens is None else f"{config.max_batched_tokens} tokens/iteration"
    prefill_cost = system.step_cost(result.first_prefill_step) if result.first_prefill_step else None
    first_cost = system.step_cost(result.first_decode_step) if result.first_decode_step else None
    last_cost = system.step_cost(result.last_decode_step) if result.last_decode_step else None
    first_step = result.first_prefill_step
    lines = [
        f"memwall: {model.name} on {tp}x {gpu.name}",
        "",
        "Setup",
        f"  model        {model.name}: {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_heads} heads, {model.num_kv_heads} KV heads ({model.attention_kind}), FFN {model.ffn_size}",
        f"  GPU          {gpu.name}: {fmt_count(gpu.peak(prec.compute_dtype), 'FLOP/s')} {prec.compute_dtype}, "
        f"{fmt_count(gpu.hbm_bandwidth_bytes_per_second, 'B/s')} HBM, ridge {ridge:.0f} FLOP/byte",
        f"  parallelism  tensor parallel {tp}" + (f"  ({dep.note})" if dep.note else ""),
        f"  precision    {prec.label()}",
        f"  kernels      {system.attention_kernel} attention, fusion {system.fusion}",
        f"  efficiency   compute {eff.compute:.2f}, memory {eff.memory:.2f}, link {eff.link:.2f}, "
        f"launch {fmt_seconds(eff.kernel_launch_seconds)}/kernel, all-reduce {fmt_seconds(eff.allreduce_latency_seconds)}",
        f"  workload     {run.workload.description}",
        f"  scheduler    {config.scheduler}, at most {config.max_num_seqs} sequences, {budget}",
        *(f"  warning      {note}" for note in run.workload.notes),
        "",
        "Memory per GPU" + ("" if memory.fits else "  ** DOES NOT FIT **")
        + f"  (planned for batch {int(opts['batch'])} x {int(opts['ctx'])} tokens)",
        f"  weights      {fmt_bytes(memory.weights_bytes_per_gpu)}  (model total {fmt_bytes(memory.weights_bytes)})",
        f"  KV cache     {fmt_bytes(memory.kv_bytes_per_gpu)}  ({memory.kv_bytes_per_token:,.0f} bytes/token, "
        f"total {fmt_bytes(memory.kv_bytes)})",
        f"  workspace    {fmt_bytes(memory.workspace_bytes_per_gpu)}",
        f"  runtime      {fmt_bytes(memory.reserved_bytes_per_gpu)}",
        f"  used         {fmt_bytes(memory.needed_bytes_per_gpu)} of {fmt_bytes(memory.hbm_bytes_per_gpu)} "
        f"({100 * memory.needed_bytes_per_gpu / memory.hbm_bytes_per_gpu:.0f}%)",
        "",
        "Paged KV cache",
        f"  capacity     {cap.blocks:,} blocks of {cap.block_size} tokens = {cap.tokens:,} tokens "
        f"({fmt_bytes(cap.kv_bytes_per_gpu)} per GPU"
        + (", set by --kv-blocks)" if cap.overridden else f" at --gpu-memory-utilization {cap.gpu_memory_utilization:g})"),
        f"  high water   {m.kv_high_water_blocks:,} blocks ({100 * m.kv_high_water_fraction:.1f}%), "
        f"{_count(m.max_running, 'sequence')} running at most",
        "",
        "Requests",
        f"  completed    {m.completed:,} of {m.requests:,} in {fmt_seconds(m.duration_seconds)} "
        f"({m.iterations:,} iterations, busy {100 * m.busy_seconds / m.duration_seconds if m.duration_seconds else 0:.0f}%)",
        f"  rejected     {m.rejected:,}" + "".join(
            f"; {count} {REJECT_REASONS[REJECT_KEYS.index(key)]}" for key, count in m.rejected_by_reason.items() if count),
        f"  preemptions  {m.preemptions:,} ({m.preempted_requests:,} requests recomputed)",
        "",
        "Latency",
        f"  prefill      {fmt_seconds(float(prefill_cost.seconds)) if prefill_cost else '-'}  (first prefill iteration: "
        f"{_count(int(first_step.sequences) if first_step else 0, 'sequence')}, "
        f"{int(first_step.prefill_tokens) if first_step else 0} tokens)",
        f"  decode step  {fmt_seconds(float(first_cost.seconds)) if first_cost else '-'} at first, "
        f"{fmt_seconds(float(last_cost.seconds)) if last_cost else '-'} at last",
        *("  " + line for line in _table(
            ["", "mean", "p50", "p90", "p99"],
            [_latency_row("TTFT", m.ttft), _latency_row("TPOT", m.tpot), _latency_row("ITL", m.itl),
             _latency_row("end to end", m.e2e), _latency_row("queueing", m.queue)],
            align_right={1, 2, 3, 4},
        )),
        "",
        "Throughput",
        f"  output       {fmt_rate(m.output_tokens_per_second, 'tokens/s')}",
        f"  input        {fmt_rate(m.input_tokens_per_second, 'tokens/s')}",
        f"  total        {fmt_rate(m.total_tokens_per_second, 'tokens/s')}",
        f"  requests     {fmt_rate(m.requests_per_second, 'requests/s')}",
        f"  goodput      {fmt_rate(m.goodput_requests_per_second, 'requests/s')} "
        f"({100 * m.slo_attainment:.1f}% of requests within "
        + _slo_text(opts) + ")",
        "",
        "Utilisation",
        f"  MFU          {100 * m.mfu:.1f}%   MBU {100 * m.mbu:.1f}%",
        f"  busy time    {100 * m.compute_bound_share:.0f}% compute-bound, {100 * m.memory_bound_share:.0f}% memory-bound, "
        f"{100 * m.communication_share:.0f}% communication",
    ]
    if last_cost is not None:
        lines += ["", f"Top operators, last decode step (ridge {ridge:.0f} FLOP/byte)",
                  *("  " + line for line in operator_table(last_cost.operators, tp, top))]
    if prefill_cost is not None:
        lines += ["", "Top operators, first prefill", *("  " + line for line in operator_table(prefill_cost.operators, tp, top))]
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _slo_text(opts: dict[str, Any]) -> str:
    parts = []
    if opts.get("slo_ttft") is not None:
        parts.append(f"TTFT <= {fmt_seconds(float(opts['slo_ttft']))}")
    if opts.get("slo_tpot") is not None:
        parts.append(f"TPOT <= {fmt_seconds(float(opts['slo_tpot']))}")
    return " and ".join(parts) if parts else "no SLO: --slo-ttft/--slo-tpot"


PER_REQUEST_COLUMNS = (
    "request", "arrival_seconds", "prompt_tokens", "output_tokens", "status", "reject_reason", "queue_seconds",
    "ttft_seconds", "tpot_seconds", "e2e_seconds", "finish_seconds", "preemptions",
)


def write_per_request_csv(run: "EngineRun", path: str) -> None:
    """One row per request (times in seconds; empty where the request never got there)."""
    result, workload = run.result, run.workload
    arrival = workload.arrival_seconds
    outputs = workload.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (result.finish - result.first_token) / (outputs - 1), np.nan)

    def cells(values: np.ndarray) -> list:
        return ["" if v != v else v for v in values.tolist()]  # NaN (never happened) -> empty

    rejected = result.status == REJECTED
    columns = [
        range(len(workload)), arrival.tolist(), workload.prompt_tokens.tolist(), outputs.tolist(),
        [STATE_NAMES[code] for code in result.status.tolist()],
        [REJECT_REASONS[code] if gone else "" for code, gone in zip(result.reject_reason.tolist(), rejected.tolist())],
        cells(result.first_scheduled - arrival), cells(result.first_token - arrival), cells(tpot),
        cells(result.finish - arrival), cells(result.finish), result.preemptions.tolist(),
    ]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PER_REQUEST_COLUMNS)
        writer.writerows(zip(*columns))
