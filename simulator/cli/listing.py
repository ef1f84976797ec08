"""``simulate models`` and ``simulate gpus``: what ships."""

from __future__ import annotations

import click

from simulator.cli.options import reports_input_errors
from simulator.model import list_gpus, list_models
from simulator.model.layers import build_operators, parameter_count
from simulator.model.precision import Precision
from simulator.tabular import to_json
from simulator.units import fmt_bytes, fmt_count


def _model_params(model) -> int:
    # Parameter counts do not depend on the GPU; any shipped GPU builds the operator list.
    return parameter_count(build_operators(model, Precision(), list_gpus()[0]))


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@reports_input_errors
def models_command(as_json: bool) -> None:
    """List the shipped model configs (configs/models/)."""
    models = list_models()
    if as_json:
        click.echo(to_json([{**m.model_dump(), "parameters": _model_params(m), "attention_kind": m.attention_kind} for m in models], indent=2))
        return
    header = f"{'name':<12} {'params':>9} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>4} {'attention':<9} {'FFN':>6} {'max ctx':>7}"
    click.echo(header)
    click.echo("-" * len(header))
    for m in models:
        click.echo(
            f"{m.name:<12} {fmt_count(_model_params(m)):>9} {m.num_layers:>6} {m.hidden_size:>6} {m.num_heads:>5} "
            f"{m.num_kv_heads:>4} {m.attention_kind:<9} {m.ffn_size:>6} {m.max_context:>7}"
        )


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
                "ridge_point_fp16": g.ridge_point("fp16"),
                "efficiency": g.efficiency.model_dump(),
            }
            for g in gpus
        ], indent=2))
        return
    header = f"{'name':<16} {'aliases':<26} {'fp16':>12} {'fp8':>12} {'HBM':>10} {'bandwidth':>11} {'ridge':>6}"
    click.echo(header)
    click.echo("-" * len(header))
    for g in gpus:
        fp8 = fmt_count(g.peak_flops["fp8"], "FLOP/s") if "fp8" in g.peak_flops else "-"
        click.echo(
            f"{g.name:<16} {','.join(g.aliases[:2]):<26} {fmt_count(g.peak('fp16'), 'FLOP/s'):>12} {fp8:>12} "
            f"{fmt_bytes(g.hbm_bytes):>10} {fmt_count(g.hbm_bandwidth_bytes_per_second, 'B/s'):>11} {g.ridge_point('fp16'):>6.0f}"
        )
    click.echo("\nridge = fp16 dense peak / HBM bandwidth (FLOP/byte)")
