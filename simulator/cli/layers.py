"""``simulate layers``: the per-operator roofline table of one step."""

from __future__ import annotations

from typing import Any

import click

from simulator.cli.options import (
    STEP_ONLY_EXCLUDED,
    apply_options,
    one_output_format,
    reports_input_errors,
    settings_from_cli,
    settings_options,
)
from simulator.cost.deployment import check_gen_tokens
from simulator.model.step import Step
from simulator.plan.deployment_planner import deployment_from_options
from simulator.plan.result import operator_rows
from simulator.plan.settings import StepSettings
from simulator.report.run_report import operator_table
from simulator.tabular import to_csv, to_json
from simulator.units import fmt_seconds


@click.command("layers")
@apply_options(settings_options(StepSettings, exclude=STEP_ONLY_EXCLUDED))
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="prefill: the whole batch's prompts (ctx - gen tokens each); decode: one token per sequence at context ctx.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of operators (SI units, whole TP group).")
@click.option("--csv", "as_csv", is_flag=True, help="Print the operators as CSV.")
@reports_input_errors
def layers_command(phase: str, as_json: bool, as_csv: bool, **options: Any) -> None:
    """Per-operator roofline table for one prefill or decode step.

    Each row: FLOPs, HBM bytes, arithmetic intensity (FLOP/byte), the bound (memory,
    compute, communication, launch where its kernels' launch costs take over half its time,
    fused where it runs inside a neighbour, idle where it does nothing) and time, for all
    layers of that operator together.

    \b
    Example:
      simulate layers --model llama2-7b --gpu a100 --batch 1 --ctx 1024 --phase decode
    """
    one_output_format(as_json, as_csv)
    settings = settings_from_cli(StepSettings, options)
    batch, ctx_tokens, gen = settings.batch, settings.ctx, settings.gen
    deployment = deployment_from_options(settings.model_dump(), batch, ctx_tokens)
    system = deployment.system
    if phase == "prefill":
        check_gen_tokens(gen, ctx_tokens)
        step = Step.prefill(batch, ctx_tokens - gen)
    else:
        step = Step.decode(batch, ctx_tokens)
    cost = system.step_cost(step)
    rows = operator_rows(cost, system.tp)
    if as_json:
        click.echo(to_json(rows, indent=2))
        return
    if as_csv:
        click.echo(to_csv(rows), nl=False)
        return
    gpu = system.gpu
    ridge = gpu.ridge_point(system.precision.compute_dtype)
    prompt = ctx_tokens - gen
    what = (f"prefill of {batch} x {prompt} token{'' if prompt == 1 else 's'}" if phase == "prefill"
            else f"decode of {batch} token{'' if batch == 1 else 's'} at context {ctx_tokens}")
    click.echo(f"{system.describe()}")
    click.echo(f"{what}; ridge point {ridge:.0f} FLOP/byte" + (f"; {deployment.note}" if deployment.note else ""))
    click.echo("")
    for line in operator_table(cost.operators, system.tp, overhead_seconds=float(cost.overhead_seconds),
                               launch_wait_seconds=float(cost.launch_wait_seconds)):
        click.echo(line)
    click.echo("")
    click.echo(f"step time {fmt_seconds(float(cost.seconds))}, of which communication "
               f"{fmt_seconds(float(cost.communication_seconds))}, kernel launches {fmt_seconds(float(cost.launch_seconds))}, "
               f"host launch wait {fmt_seconds(float(cost.launch_wait_seconds))}, "
               f"engine overhead {fmt_seconds(float(cost.overhead_seconds))}")
