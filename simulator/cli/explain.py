"""``simulate explain``: one paragraph in words on why a run is as fast as it is."""

from __future__ import annotations

import textwrap
from typing import Any

import click

from simulator.cli.options import (
    STEP_ONLY_EXCLUDED,
    apply_options,
    reports_input_errors,
    settings_from_cli,
    settings_options,
)
from simulator.model.architecture import load_model, with_attention
from simulator.plan.deployment_planner import deployment_from_options
from simulator.plan.settings import ExplainSettings, SpeculativeSettings
from simulator.report.compare import text_table
from simulator.report.explain import explain_run, single_stage_system
from simulator.report.kernel_choices import kernel_choices, kernel_choices_text
from simulator.tabular import to_json
from simulator.units import fmt_rate, fmt_seconds

EPILOG = """\b
Examples:
  simulate explain --model llama2-70b --gpu a100 --batch 64 --ctx 4096
  simulate explain --model llama2-7b --gpu a100 --batch 1 --ctx 2048 --weights int4
  simulate explain --model llama2-7b --gpu h100 --batch 256 --ctx 1024 --json
"""


@click.command("explain", epilog=EPILOG)
@apply_options(settings_options(ExplainSettings, exclude=STEP_ONLY_EXCLUDED))
@click.option("--json", "as_json", is_flag=True, help="Print the paragraph, the facts behind it and the levers as JSON (SI units).")
@reports_input_errors
def explain_command(as_json: bool, **options: Any) -> None:
    """Explain a run in words: what is memory-bound, intensity vs ridge, the biggest lever.

    The levers (bigger batch, fewer KV heads, lower precision, more GPUs, the model's sliding
    window where the engine ignores it, speculative decoding, disaggregated prefill) are measured
    with the cost model, not guessed;
    --speculative with --acceptance (and --num-speculative-tokens for one rate) choose the
    speculation measured (without --speculative: a one-layer draft head, k 1, acceptance 0.85).
    Below the paragraph: attention bytes per layer for
    both attention kernels, and kernels and activation bytes per layer for each fusion level.
    """
    settings = settings_from_cli(ExplainSettings, options)
    batch, ctx_tokens, gen = settings.batch, settings.ctx, settings.gen
    deployment = deployment_from_options(settings.model_dump(), batch, ctx_tokens)
    configured = with_attention(load_model(settings.model), settings.attention)
    # The run itself (without the speculation measured as a lever), to check the advice on by simulation.
    run = settings.model_dump(exclude_none=True, exclude=set(SpeculativeSettings.model_fields))
    explanation = explain_run(deployment, batch, ctx_tokens, gen, settings, configured, simulate=run)
    choices = kernel_choices(single_stage_system(deployment), batch, ctx_tokens, gen)
    if as_json:
        click.echo(to_json({**explanation.as_dict(), "kernel_choices": choices}, indent=2))
        return
    click.echo(textwrap.fill(explanation.paragraph, width=100))
    if deployment.note:
        click.echo(f"({deployment.note})")
    click.echo("")
    simulated = explanation.facts.get("simulated")
    if simulated:
        click.echo(f"Levers, measured on the decode step at context {ctx_tokens} (decode tokens/s per GPU and step time vs "
                   f"this run) and simulated on the whole run ({simulated['requests']:,} requests: output tokens/s per GPU "
                   "and mean TPOT vs this run's), ranked by the gain on the whole run")
    else:
        click.echo(f"Levers, measured at context {ctx_tokens} (decode step; decode tokens/s per GPU vs this run)")

    def gain(value: float | None, estimate: float | None = None) -> str:
        if value is not None:
            return f"{value:.2f}x"
        return f"~{estimate:.2f}x" if estimate is not None else "-"

    rows = [[lv.lever, lv.change, str(lv.batch), str(lv.tp), fmt_seconds(lv.step_seconds),
             fmt_rate(lv.tokens_per_second_per_gpu, "").strip(), f"{lv.throughput_gain:.2f}x", f"{lv.latency_gain:.2f}x",
             *([gain(lv.simulated_throughput_gain, lv.run_gain), gain(lv.simulated_latency_gain)] if simulated else []),
             "; ".join(part for part in (lv.caveat, lv.simulated_note) if part)]
            for lv in explanation.levers]
    headers = ["lever", "change", "batch", "tp", "step", "tokens/s/GPU", "throughput", "speed",
               *(["run (sim)", "TPOT (sim)"] if simulated else []), "note"]
    numeric = {2, 3, 4, 5, 6, 7} | ({8, 9} if simulated else set())
    for line in text_table(headers, rows, numeric):
        click.echo("  " + line)
    if simulated:
        click.echo("  (~: not a setting of a run, so not simulated: the decode-step gain diluted by the run's phase mix)")
    click.echo("")
    for line in kernel_choices_text(choices, batch, ctx_tokens, gen):
        click.echo(line)
