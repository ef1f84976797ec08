"""``simulate roofline``: every operator of prefill and decode against the GPU's roofline."""

from __future__ import annotations

from typing import Any

import click

from simulator.cli.options import (
    STEP_ONLY_EXCLUDED,
    apply_options,
    reports_input_errors,
    settings_from_cli,
    settings_options,
)
from simulator.plan.deployment_planner import deployment_from_options
from simulator.plan.settings import StepSettings
from simulator.report.compare import text_table
from simulator.report.plots import (
    RooflineData,
    check_plot_path,
    plot_roofline,
    roofline_data,
)
from simulator.tabular import to_json
from simulator.units import fmt_count, fmt_seconds

EPILOG = """\b
Examples:
  simulate roofline --model llama2-7b --gpu a100 --batch 8 --ctx 2048 --plot roofline.png
  simulate roofline --model llama2-70b --gpu h100 --batch 64 --ctx 4096 --weights fp8
  simulate roofline --model llama2-7b --gpu a100 --fusion none --json

\b
Each operator (all its layers together) is a point at its arithmetic intensity
(FLOP per byte of HBM traffic) and the FLOP/s it achieves per GPU (FLOPs / its time,
launch overhead included). Below the ridge point an operator is memory-bound.
--plot needs matplotlib: pip install -e '.[plot]'.
"""


def roofline_text(data: RooflineData) -> str:
    lines = [
        data.title,
        f"roofline {fmt_count(data.peak_flops, 'FLOP/s')} {data.compute_dtype}, "
        f"{fmt_count(data.bandwidth_bytes_per_second, 'B/s')} HBM: ridge {data.ridge:.0f} FLOP/byte "
        f"({data.achievable_ridge:.0f} with efficiency compute {data.compute_efficiency:.2f}, memory {data.memory_efficiency:.2f})",
        "",
    ]
    rows = [
        [p.phase, p.name, f"x{p.count}", f"{p.intensity:.1f}", f"{p.achieved_flops_per_second / 1e12:.2f}",
         f"{100 * p.achieved_flops_per_second / data.peak_flops:.1f}%", p.bound, fmt_seconds(p.seconds)]
        for p in data.points
    ]
    headers = ["phase", "operator", "count", "FLOP/byte", "TFLOP/s", "of peak", "bound", "time"]
    lines += text_table(headers, rows, align_right={2, 3, 4, 5, 7})
    reasons: dict[str, list[str]] = {}
    for phase, name, why in data.not_plotted:
        if name not in reasons.setdefault(why, []):
            reasons[why].append(name)
    if reasons:
        lines += ["", "not on the roofline:"] + [f"  {why}: {', '.join(names)}" for why, names in reasons.items()]
    return "\n".join(lines)


@click.command("roofline", epilog=EPILOG)
@apply_options(settings_options(StepSettings, exclude=STEP_ONLY_EXCLUDED))
@click.option("--plot", "plot_path", metavar="FILE.png", default=None, help="Write the roofline plot (png, svg or pdf).")
@click.option("--json", "as_json", is_flag=True, help="Print the roofline and its points as JSON (SI units, per GPU).")
@reports_input_errors
def roofline_command(plot_path: str | None, as_json: bool, **options: Any) -> None:
    """Operators of prefill and decode on the GPU's roofline (per GPU).

    Prefill is the batch's prompts (ctx - gen tokens each); decode is the last step
    (one token per sequence at context ctx).
    """
    if plot_path is not None:
        check_plot_path(plot_path)
    settings = settings_from_cli(StepSettings, options)
    batch, ctx_tokens, gen = settings.batch, settings.ctx, settings.gen
    deployment = deployment_from_options(settings.model_dump(), batch, ctx_tokens)
    data = roofline_data(deployment.system, batch, ctx_tokens, gen)
    if plot_path is not None:
        plot_roofline(data, plot_path)
    if as_json:
        click.echo(to_json({
            "title": data.title, "compute_dtype": data.compute_dtype, "peak_flops": data.peak_flops,
            "hbm_bandwidth_bytes_per_second": data.bandwidth_bytes_per_second, "ridge_flop_per_byte": data.ridge,
            "achievable_ridge_flop_per_byte": data.achievable_ridge, "plot": plot_path,
            "points": [p.as_dict() for p in data.points],
            "not_plotted": [{"phase": ph, "name": n, "why": w} for ph, n, w in data.not_plotted],
        }, indent=2))
        return
    click.echo(roofline_text(data))
    if deployment.note:
        click.echo(f"\nnote: {deployment.note}")
    if plot_path is not None:
        click.echo(f"\nwrote {plot_path}")
