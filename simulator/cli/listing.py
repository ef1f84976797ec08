"""``simulate models``, ``simulate gpus`` and ``simulate engines``: what ships."""

from __future__ import annotations

import click

from simulator.cli.options import reports_input_errors
from simulator.cost.engine_overhead import per_sequence_seconds
from simulator.model import GPUSpec, list_gpus, list_models
from simulator.model.engine_profile import EngineProfile, list_engine_profiles
from simulator.model.parameters import model_parameters
from simulator.report.compare import text_table
from simulator.tabular import to_json
from simulator.units import fmt_bytes, fmt_count


def _experts(model) -> str:
    if not model.is_moe:
        return "-"
    shared = f"+{model.moe_shared_experts}" if model.moe_shared_experts else ""
    return f"{model.moe_experts}{shared} top-{model.moe_top_k}"


def _window(model) -> str:
    if model.sliding_window is None or not model.sliding_layers:
        return "-"
    if model.sliding_layers == model.num_layers:
        return str(model.sliding_window)
    return f"{model.sliding_window} ({model.sliding_layers}/{model.num_layers})"


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@reports_input_errors
def models_command(as_json: bool) -> None:
    """List the shipped model configs (configs/models/)."""
    models = list_models()
    counts = [model_parameters(m) for m in models]
    if as_json:
        click.echo(to_json([
            {**m.model_dump(), "parameters": c.total, "active_parameters": c.active,
             "active_parameters_with_embedding": c.active_with_embedding, "attention_kind": m.attention_kind,
             "architecture": m.describe_architecture()}
            for m, c in zip(models, counts)
        ], indent=2))
        return
    # Column widths follow the longest cell, so a long name from $MEMWALL_CONFIG_DIR does not shift the columns.
    headers = ["name", "params", "active", "layers", "hidden", "heads", "kv", "attention", "window", "experts", "FFN",
               "max ctx"]
    rows = [
        [m.name, fmt_count(c.total), fmt_count(c.active), str(m.num_layers), str(m.hidden_size), str(m.num_heads),
         str(m.num_kv_heads), m.attention_kind, _window(m), _experts(m), str(m.expert_ffn_size if m.is_moe else m.ffn_size),
         str(m.max_context)]
        for m, c in zip(models, counts)
    ]
    for line in text_table(headers, rows, align_right={1, 2, 3, 4, 5, 6, 10, 11}):
        click.echo(line)
    click.echo("\nactive = parameters one token multiplies with (top-k experts, LM head; not the embedding table); "
               "FFN = one expert's width for MoE models")


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (SI units).")
@reports_input_errors
def gpus_command(as_json: bool) -> None:
    """List the shipped GPU configs (configs/gpus/) with their fp16 ridge point."""
    gpus = list_gpus()
    if as_json:
        click.echo(to_json([
            {
                "name": g.name,
                "aliases": g.aliases,
                "peak_flops": g.peak_flops,
                "hbm_bandwidth_bytes_per_second": g.hbm_bandwidth_bytes_per_second,
                "hbm_bytes": g.hbm_bytes,
                "link_bandwidth_bytes_per_second": g.link_bandwidth_bytes_per_second,
                "ridge_point_fp16": g.ridge_point("fp16") if "fp16" in g.peak_flops else None,
                "efficiency": g.efficiency.model_dump(),
            }
            for g in gpus
        ], indent=2))
        return
    def peak(g: GPUSpec, dtype: str) -> str:
        return fmt_count(g.peak_flops[dtype], "FLOP/s") if dtype in g.peak_flops else "-"

    headers = ["name", "aliases", "fp16", "fp8", "HBM", "bandwidth", "ridge"]
    rows = [
        [g.name, ",".join(g.aliases[:2]), peak(g, "fp16"), peak(g, "fp8"), fmt_bytes(g.hbm_bytes),
         fmt_count(g.hbm_bandwidth_bytes_per_second, "B/s"), f"{g.ridge_point('fp16'):.0f}" if "fp16" in g.peak_flops else "-"]
        for g in gpus
    ]
    for line in text_table(headers, rows, align_right={2, 3, 4, 5, 6}):
        click.echo(line)
    click.echo("\nridge = fp16 dense peak / HBM bandwidth (FLOP/byte)")


def _engine_kernels(profile: EngineProfile) -> str:
    """What the engine runs other than flash attention and dense GEMMs, in a few words ("-": nothing)."""
    parts = []
    if profile.attention_kernel != "flash":
        parts.append(f"{profile.attention_kernel} attention")
    if profile.dequantize_above_tokens:
        parts.append(f"int weights to fp16 above {profile.dequantize_above_tokens} rows")
    if profile.gemm_accumulate == "fp16":
        parts.append("fp16 accumulation")
    if profile.scheduler.pass_tokens:
        parts.append(f"{profile.scheduler.pass_tokens}-token passes")
    if not profile.honours_sliding_window:
        parts.append("no sliding window")
    return ", ".join(parts) or "-"


@click.command("engines")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (the whole profiles, SI units).")
@reports_input_errors
def engines_command(as_json: bool) -> None:
    """List the engine profiles (configs/engines/) that --engine takes; docs/time-model.md cites each number."""
    profiles = list_engine_profiles()
    if as_json:
        click.echo(to_json([p.model_dump() for p in profiles], indent=2))
        return
    headers = ["name", "version", "host/iteration", "overlap", "graphs", "scheduler", "fusion", "kernels"]
    rows = []
    for p in profiles:
        cpu, sched = p.cpu, p.scheduler
        host = f"{cpu.fixed_seconds * 1e3:.2f} ms + {per_sequence_seconds(p.with_sampling(False)) * 1e6:.0f} us/seq"
        sampled = per_sequence_seconds(p.with_sampling(True)) - per_sequence_seconds(p.with_sampling(False))
        if sampled:
            host += f" (+{sampled * 1e6:.0f} sampling)"
        graphs = "-" if p.enforce_eager or not p.graphs.max_batch else \
            "all" if p.graphs.max_batch >= 1 << 20 and p.graphs.mixed else f"<= {p.graphs.max_batch}"
        budget = f", {sched.max_batched_tokens} tok" if sched.max_batched_tokens else ""
        rows.append([p.name, p.version or "-", host, f"{cpu.overlap:g}", graphs,
                     f"{sched.kind}, {sched.max_num_seqs} seqs{budget}", p.fusion, _engine_kernels(p)])
    for line in text_table(headers, rows, align_right={3}):
        click.echo(line)
    click.echo("\nhost/iteration: CPU time per engine iteration (fixed + per running sequence); overlap: the share of "
               "it hidden under the GPU's step; graphs: steps of up to that many tokens replay a CUDA graph")
