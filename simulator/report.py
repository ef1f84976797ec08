"""Reports: terminal text, the JSON contract, CSV rows. SI units inside; converted here only."""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable

from simulator.analytic import BatchRun
from simulator.cost import OperatorCost, StepCost
from simulator.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds


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


def batch_run_dict(run: BatchRun) -> dict[str, Any]:
    """The ``--json`` contract of the main command (all SI units; FLOPs and bytes summed over GPUs)."""
    dep = run.deployment
    system, memory = dep.system, dep.memory
    tp = system.tp
    eff = system.gpu.efficiency
    return {
        "model": system.model.name,
        "gpu": system.gpu.name,
        "tp": tp,
        "tp_auto": dep.auto_tp and tp > 1,
        "batch": run.batch,
        "ctx": run.context_tokens,
        "gen": run.gen_tokens,
        "prompt": run.prompt_tokens,
        "attention": system.model.attention_kind,
        "attention_kernel": system.attention_kernel,
        "fusion": system.fusion,
        "precision": {
            "weights": system.precision.weights,
            "kv": system.precision.kv,
            "compute": system.precision.compute_dtype,
            "activations": system.precision.activation_dtype,
        },
        "efficiency": eff.model_dump(),
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
        "prefill": {
            "seconds": float(run.prefill.seconds),
            "flops": float(run.prefill.flops) * tp,
            "bytes": float(run.prefill.bytes) * tp,
        },
        "decode": {
            "steps": run.decode_steps,
            "first_step_seconds": float(run.decode_first.seconds),
            "last_step_seconds": float(run.decode_last.seconds),
            "flops_per_step": run.decode_flops_total / max(run.decode_steps, 1) * tp,
            "bytes_per_step": run.decode_bytes_total / max(run.decode_steps, 1) * tp,
        },
        "latency": {
            "ttft_seconds": run.ttft_seconds,
            "tpot_seconds": run.tpot_seconds,
            "e2e_seconds": run.e2e_seconds,
        },
        "throughput": {
            "output_tokens_per_second": run.output_tokens_per_second,
            "total_tokens_per_second": run.total_tokens_per_second,
        },
        "operators": {
            "prefill": operator_rows(run.prefill, tp),
            "decode_last": operator_rows(run.decode_last, tp),
        },
    }


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


def batch_run_text(run: BatchRun, top: int = 6) -> str:
    """The human report of the main command."""
    dep = run.deployment
    system, memory = dep.system, dep.memory
    gpu, model, prec = system.gpu, system.model, system.precision
    eff = gpu.efficiency
    tp = system.tp
    ridge = gpu.ridge_point(prec.compute_dtype)
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
        f"  workload     batch {run.batch}, context {run.context_tokens} (prompt {run.prompt_tokens} + {run.gen_tokens} generated)",
        "",
        "Memory per GPU" + ("" if memory.fits else "  ** DOES NOT FIT **"),
        f"  weights      {fmt_bytes(memory.weights_bytes_per_gpu)}  (model total {fmt_bytes(memory.weights_bytes)})",
        f"  KV cache     {fmt_bytes(memory.kv_bytes_per_gpu)}  ({memory.kv_bytes_per_token:,.0f} bytes/token, "
        f"total {fmt_bytes(memory.kv_bytes)})",
        f"  workspace    {fmt_bytes(memory.workspace_bytes_per_gpu)}",
        f"  runtime      {fmt_bytes(memory.reserved_bytes_per_gpu)}",
        f"  used         {fmt_bytes(memory.needed_bytes_per_gpu)} of {fmt_bytes(memory.hbm_bytes_per_gpu)} "
        f"({100 * memory.needed_bytes_per_gpu / memory.hbm_bytes_per_gpu:.0f}%)",
        "",
        "Latency",
        f"  prefill      {fmt_seconds(run.ttft_seconds)}  ({run.batch} x {run.prompt_tokens} tokens)",
        f"  decode step  {fmt_seconds(float(run.decode_first.seconds))} at first token, "
        f"{fmt_seconds(float(run.decode_last.seconds))} at last",
        f"  TTFT         {fmt_seconds(run.ttft_seconds)}",
        f"  TPOT         {fmt_seconds(run.tpot_seconds)}",
        f"  end to end   {fmt_seconds(run.e2e_seconds)}",
        "",
        "Throughput",
        f"  output       {fmt_rate(run.output_tokens_per_second, 'tokens/s')}",
        f"  total        {fmt_rate(run.total_tokens_per_second, 'tokens/s')}",
        "",
        f"Top operators, last decode step (ridge {ridge:.0f} FLOP/byte)",
        *("  " + line for line in operator_table(run.decode_last.operators, tp, top)),
        "",
        "Top operators, prefill",
        *("  " + line for line in operator_table(run.prefill.operators, tp, top)),
    ]
    return "\n".join(lines)
