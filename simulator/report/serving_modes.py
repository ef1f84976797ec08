"""Report lines for speculative decoding and disaggregated prefill/decode (SI inside, units converted here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.plan.disaggregated_run import (
    DisaggregationSummary,
    PoolSummary,
    disaggregation_summary,
)
from simulator.report.compare import text_table
from simulator.units import fmt_bytes, fmt_rate, fmt_seconds

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun


def _acceptance(rates: tuple[float, ...]) -> str:
    if len(set(rates)) == 1:
        return f"{rates[0]:g} at each of {len(rates)} positions"
    return ",".join(f"{rate:g}" for rate in rates)


def setup_lines(run: EngineRun) -> list[str]:
    """Setup lines naming the draft and the pools (none for a plain run)."""
    lines = []
    spec = run.result.extra.get("speculative")
    if spec is not None:
        draft = f"draft {spec.draft}" if spec.method == "draft" else f"{spec.method} head (one decoder layer)"
        lines.append(
            f"  speculative  {draft}, k {spec.tokens}, acceptance {_acceptance(spec.acceptance)}: "
            f"{spec.expected_tokens_per_iteration:.2f} tokens per iteration expected; draft "
            f"{fmt_bytes(spec.draft_weights_bytes_per_gpu)} weights + {spec.draft_kv_bytes_per_token_per_gpu:,.0f} KV bytes/token per GPU")
    split = disaggregation_summary(run)
    if split is not None:
        lines.append(
            f"  disaggregated {split.prefill.replicas} prefill x {split.prefill.tp} {split.prefill.gpu}{_layout_note(split.prefill)} : "
            f"{split.decode.replicas} decode x {split.decode.tp} {split.decode.gpu}{_layout_note(split.decode)} = "
            f"{split.gpus} GPUs; KV cache over {split.link.describe()} (memory and cache below: one decode replica)")
    return lines


def speculative_lines(run: EngineRun) -> list[str]:
    spec = run.result.extra.get("speculative")
    if spec is None:
        return []
    lines = ["", "Speculative decoding",
             (f"  tokens       {spec.tokens_per_iteration:.2f} per iteration in this run "
              f"(expected {spec.expected_tokens_per_iteration:.2f}: 1 + accepted prefix of {spec.tokens} drafted)")]
    base = spec.baseline
    if base is not None and spec.tpot_speedup is not None:
        lines.append(
            f"  vs without   TPOT mean {fmt_seconds(base.tpot.mean)} -> {fmt_seconds(spec.tpot_seconds_mean)} "
            f"({spec.tpot_speedup:.2f}x), output {fmt_rate(base.output_tokens_per_second, 'tokens/s')} -> "
            f"{fmt_rate(spec.output_tokens_per_second, 'tokens/s')} ({spec.throughput_speedup or 0.0:.2f}x)")
    lines.append(f"  cost model   decode {spec.step_speedup:.2f}x at this run's mean decode batch of "
                 f"{spec.mean_decode_batch:.0f}, {spec.step_speedup_batch1:.2f}x at batch 1 (context {spec.context_tokens:,})")
    if spec.crossover_batch is None:
        lines.append(f"  slow-down    none up to batch {spec.crossover_limit_batch:,} (the sequences of "
                     f"{spec.context_tokens:,} tokens the cache holds)")
    else:
        lines.append(f"  slow-down    from batch {spec.crossover_batch:,} at context {spec.context_tokens:,}: the verification's "
                     f"{spec.tokens + 1} tokens per sequence make the GEMMs compute-bound")
    return lines


def pool_layout(pool: PoolSummary) -> str:
    """A pool's parallel layout as its engines' flags read: 'tp 8 ep 8 dp-attention'."""
    return f"tp {pool.tp}" + (f" ep {pool.ep}" if pool.ep > 1 else "") + (" dp-attention" if pool.dp_attention else "")


def _layout_note(pool: PoolSummary) -> str:
    """' (ep 8, dp-attention)' after a pool's GPUs, or nothing for plain tensor parallelism."""
    parts = ([f"ep {pool.ep}"] if pool.ep > 1 else []) + (["dp-attention"] if pool.dp_attention else [])
    return f" ({', '.join(parts)})" if parts else ""


def _step_line(pool: PoolSummary) -> str | None:
    """The pool's layout, and its own kind of step on one of its GPUs with the collectives in it."""
    step = pool.step
    if step is None:
        return None
    if step.kind == "prefill":
        which = f"first prefill step ({step.tokens:,} tokens)"
    else:
        which = f"last decode step ({step.sequences:,} sequence{'' if step.sequences == 1 else 's'})"
    # Attention DP gathers the tokens and reduce-scatters the MLP's output instead of all-reducing, and moves no
    # token by all-to-all (simulator.model.layers, tensor_parallel_collectives).
    alltoall = f", all-to-all {fmt_seconds(step.alltoall_seconds)}" if pool.ep > 1 and not pool.dp_attention else ""
    reduce = "gather and reduce-scatter" if pool.dp_attention else "all-reduce"
    return (f"  {pool.role + ' layout':<15}{pool_layout(pool)}; {which} {fmt_seconds(step.seconds)}: {reduce} "
            f"{fmt_seconds(step.allreduce_seconds)}{alltoall}; collectives {100 * pool.communication_share:.0f}% of "
            "its busy time")


def _pool_row(pool: PoolSummary, latency: str) -> list[str]:
    return [pool.role, f"{pool.replicas} x {pool.tp} {pool.gpu}", f"{100 * pool.busy_fraction:.0f}%",
            fmt_seconds(pool.queue_seconds.p50), fmt_seconds(pool.queue_seconds.p99),
            f"{latency} {fmt_seconds(pool.latency_seconds.p50)} / {fmt_seconds(pool.latency_seconds.p99)}",
            f"{pool.preemptions:,}", f"{100 * pool.kv_high_water_fraction:.0f}%"]


def disaggregation_lines(run: EngineRun) -> list[str]:
    split: DisaggregationSummary | None = disaggregation_summary(run)
    if split is None:
        return []
    rows = [_pool_row(split.prefill, "TTFT"), _pool_row(split.decode, "to token 2")]
    headers = ["pool", "replicas", "busy", "queue p50", "queue p99", "latency p50 / p99", "preempted", "KV high water"]
    lines = ["", f"Disaggregated prefill : decode = {split.ratio}",
             *("  " + line for line in text_table(headers, rows, {2, 3, 4, 6, 7}))]
    lines += [line for line in (_step_line(split.prefill), _step_line(split.decode)) if line is not None]
    lines.append(
        f"  KV transfer  {split.transfers:,} requests, {fmt_bytes(split.kv_bytes_mean)} each on average, "
        f"{fmt_seconds(split.transfer_seconds.mean)} mean / {fmt_seconds(split.transfer_seconds.p99)} p99 on the link, "
        f"{fmt_seconds(split.link_wait_seconds.p99)} p99 waiting for it; TPOT includes both and the decode queue")
    return lines
